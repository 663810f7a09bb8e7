#include "tiler/error.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.hpp"

namespace tiler {
namespace {

TEST(Error, ThrowAddsFileAndLineButMessageStaysClean) {
  try {
    TILER_THROW(IoError, "'a.tif': bad tile " << 3);
    FAIL() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.message(), "'a.tif': bad tile 3");
    EXPECT_NE(std::string(e.what()).find("'a.tif': bad tile 3 [error_test.cpp:"), std::string::npos)
        << e.what();
    EXPECT_STREQ(e.kind(), "io");
  }
}

TEST(Error, HierarchyLetsCallersCatchByFamily) {
  EXPECT_THROW(TILER_THROW(TimeoutError, "x"), DistError);
  EXPECT_THROW(TILER_THROW(ModelError, "x"), Error);
  EXPECT_THROW(TILER_THROW(ConfigError, "x"), std::runtime_error);
  try {
    TILER_THROW(TimeoutError, "late");
  } catch (const Error& e) {
    EXPECT_STREQ(e.kind(), "timeout");
  }
}

TEST(Error, CheckThrowsOnlyWhenFalse) {
  int evaluated = 0;
  EXPECT_NO_THROW(TILER_CHECK(1 + 1 == 2, ConfigError, "never " << ++evaluated));
  EXPECT_EQ(evaluated, 0) << "the message must not be built on success";
  EXPECT_THROW(TILER_CHECK(false, ConfigError, "boom"), ConfigError);
}

TEST(Error, ReportFatalPrintsOneLineAndWritesTheElasticErrorFile) {
  const std::string path = ::testing::TempDir() + "/error_file_" + std::to_string(getpid()) + ".json";
  std::remove(path.c_str());
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  setenv("RANK", "3", 1);
  setErrorRankPrefix("[rank 3] ");
  ::testing::internal::CaptureStderr();
  int code = reportFatal("tiler", ModelError("'m.pt': not TorchScript", "x.cpp", 7));
  std::string err = ::testing::internal::GetCapturedStderr();
  setErrorRankPrefix("");
  unsetenv("TORCHELASTIC_ERROR_FILE");
  unsetenv("RANK");
  EXPECT_EQ(code, kExitFatal);
  EXPECT_EQ(err, "tiler: error: [rank 3] 'm.pt': not TorchScript [x.cpp:7]\n");
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["message"], "[rank 3] 'm.pt': not TorchScript [x.cpp:7]");
  EXPECT_GT(j["time"].get<double>(), 1.6e9);
}

// LibTorch's errors (--batch_size 100000 asked for 78 GB) printed their 24-frame backtrace at exit.
TEST(Error, ReportFatalDropsLibTorchsBacktrace) {
  ::testing::internal::CaptureStderr();
  reportFatal("tiler", std::runtime_error("DefaultCPUAllocator: not enough memory\nException raised from "
                                          "alloc_cpu at alloc_cpu.cpp:72\nframe #0: c10::Error::Error()"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "tiler: error: DefaultCPUAllocator: not enough memory\n");
  EXPECT_EQ(withoutBacktrace("plain"), "plain");
  EXPECT_EQ(withoutBacktrace("a\nException raised from x\n"), "a");
}

TEST(Error, ExitCodesAreTheContract) {
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitFatal, 1);
  EXPECT_EQ(kExitSomeFailed, 2);
}

TEST(Error, Utf8CheckAndEscape) {
  EXPECT_TRUE(isUtf8(""));
  EXPECT_TRUE(isUtf8("plain"));
  EXPECT_TRUE(isUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\xac"));
  EXPECT_FALSE(isUtf8("\xff"));
  EXPECT_FALSE(isUtf8("\xc3"));              // cut short
  EXPECT_FALSE(isUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(isUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(isUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_EQ(utf8Safe("a\xc3\xa9"), "a\xc3\xa9");
  EXPECT_EQ(utf8Safe("bad\xff\xfe.tif"), "bad\\xff\\xfe.tif");
  EXPECT_EQ(utf8Safe("\xe2\x82"), "\\xe2\\x82");
  EXPECT_TRUE(isUtf8(utf8Safe("\xc0\xaf\xf4\x90\x80\x80x")));
}

}  // namespace
}  // namespace tiler
