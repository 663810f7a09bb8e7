// npy: the .npy reader's formats, byte by byte, and its refusals.
#include "tiler/io/npy.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

using namespace tiler;

namespace {

// A .npy file as NumPy writes it: magic, version, header length (2 bytes in version 1, 4 in 2), the dict
// padded with spaces and a newline to a multiple of 64 bytes, then `data`.
std::string npyBytes(const std::string& dict, const std::string& data, int version = 1) {
  const size_t prefix = version == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(version);
  out += char(0);
  const uint32_t length = uint32_t(header.size());
  for (size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) out += char((length >> (8 * i)) & 0xff);
  return out + header + data;
}

template <typename T>
std::string rawBytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string writeNpy(const std::string& name, const std::string& bytes) {
  static const std::string dir = test::scratchDir("npy");
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string errorOf(const std::string& path) {
  try {
    readNpy(path);
  } catch (const IoError& e) {
    return e.message();
  }
  return "no error";
}

}  // namespace

TEST(Npy, EachDtypeIsReadExactlyWithItsShape) {
  const auto f4 =
      readNpy(writeNpy("f4.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                          rawBytes<float>({0.5f, -1.25f, 3e38f, 1e-40f, 0.f, 7.f}))));
  EXPECT_EQ(f4.dtype, "<f4");
  EXPECT_EQ(f4.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f4.values, (std::vector<double>{0.5, -1.25, double(3e38f), double(1e-40f), 0.0, 7.0}));
  const auto f8 =
      readNpy(writeNpy("f8.npy", npyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                                          rawBytes<double>({0.1, -2.5e300}))));
  EXPECT_EQ(f8.values, (std::vector<double>{0.1, -2.5e300}));
  const auto u1 =
      readNpy(writeNpy("u1.npy", npyBytes("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 3), }",
                                          rawBytes<uint8_t>({0, 128, 255}))));
  EXPECT_EQ(u1.shape, (std::vector<int64_t>{1, 1, 3}));
  EXPECT_EQ(u1.values, (std::vector<double>{0, 128, 255}));
  const auto u2 =
      readNpy(writeNpy("u2.npy", npyBytes("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }",
                                          rawBytes<uint16_t>({65535, 256}))));
  EXPECT_EQ(u2.values, (std::vector<double>{65535, 256}));
  const auto i4 =
      readNpy(writeNpy("i4.npy", npyBytes("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
                                          rawBytes<int32_t>({-2147483647 - 1, 5, 2147483647}))));
  EXPECT_EQ(i4.values, (std::vector<double>{-2147483648.0, 5, 2147483647.0}));
  // A scalar has shape (): one value.
  const auto scalar =
      readNpy(writeNpy("scalar.npy", npyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
                                              rawBytes<double>({4}))));
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.values, (std::vector<double>{4}));
}

TEST(Npy, VersionTwoHeadersHaveAFourByteLength) {
  const auto a =
      readNpy(writeNpy("v2.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                                          rawBytes<float>({1, 2}), 2)));
  EXPECT_EQ(a.values, (std::vector<double>{1, 2}));
}

TEST(Npy, WhatItDoesNotReadIsRefusedByName) {
  const std::string data = rawBytes<float>({1, 2});
  EXPECT_NE(errorOf(writeNpy("fortran.npy",
                             npyBytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", data)))
                .find("fortran.npy': a Fortran-order array"),
            std::string::npos);
  const std::string big = errorOf(
      writeNpy("big.npy", npyBytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", data)));
  EXPECT_NE(big.find("big.npy': dtype '>f4' is not read"), std::string::npos) << big;
  EXPECT_NE(
      errorOf(writeNpy("c8.npy", npyBytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", data)))
          .find("dtype '<c8' is not read"),
      std::string::npos);
  const std::string shortened = errorOf(
      writeNpy("short.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", data)));
  EXPECT_NE(shortened.find("short.npy': the shape and dtype need 12 bytes of data, the file holds 8"),
            std::string::npos)
      << shortened;
  const std::string header = npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data);
  EXPECT_NE(
      errorOf(writeNpy("cut.npy", header.substr(0, 40))).find("cut.npy': the .npy header says 118 bytes"),
      std::string::npos)
      << errorOf(writeNpy("cut.npy", header.substr(0, 40)));
  EXPECT_NE(errorOf(writeNpy("magic.npy", "PK\x03\x04 a zip, not an array")).find("not a .npy file"),
            std::string::npos);
  EXPECT_NE(errorOf(writeNpy("noshape.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, }", data)))
                .find("has no 'shape'"),
            std::string::npos);
  EXPECT_NE(errorOf(writeNpy("badshape.npy",
                             npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", data)))
                .find("holds '-2'"),
            std::string::npos);
  EXPECT_NE(errorOf(writeNpy("missing.npy", "") + ".gone").find("missing.npy.gone': not found"),
            std::string::npos);
}

TEST(Npy, WhatIsNoFileOrTooLargeIsRefusedBeforeItIsRead) {
  const std::string fifo = writeNpy("x", "") + ".fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(errorOf(fifo).find(".fifo': is a FIFO (named pipe)"), std::string::npos) << errorOf(fifo);
  EXPECT_NE(errorOf("/dev/zero").find("/dev/zero': is a character device"), std::string::npos);
  const std::string data = rawBytes<float>(std::vector<float>(1000, 1.0f));
  const std::string path =
      writeNpy("large.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1000,), }", data));
  EXPECT_EQ(readNpy(path, 8192).values.size(), 1000u);
  try {
    readNpy(path, 1024);
    ADD_FAILURE() << "read past its bound";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("large.npy': is 4 KiB; at most 1 KiB is read"), std::string::npos)
        << e.message();
  }
}

// A file NumPy wrote (where the system Python has it) reads as NumPy reads it.
TEST(Npy, NumpysOwnFilesAreReadAsNumpyReadsThem) {
  const std::string dir = test::scratchDir("npy_numpy");
  const auto r = test::runCommand(
      "/usr/bin/python3 -c \"import numpy as np; "
      "np.save('" +
      dir +
      "/a.npy', (np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7) / 4); "
      "np.save('" +
      dir + "/b.npy', np.arange(6, dtype=np.uint16).reshape(3, 2) * 1000)\"");
  if (r.code != 0) GTEST_SKIP() << "no NumPy in /usr/bin/python3: " << r.output;
  const auto a = readNpy(dir + "/a.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3, 4}));
  for (size_t i = 0; i < a.values.size(); ++i) EXPECT_EQ(a.values[i], (double(i) - 7) / 4);
  const auto b = readNpy(dir + "/b.npy");
  EXPECT_EQ(b.dtype, "<u2");
  EXPECT_EQ(b.values, (std::vector<double>{0, 1000, 2000, 3000, 4000, 5000}));
}
