// npy: NumPy's .npy files (format versions 1, 2 and 3) read as float64 values with their shape: bioimage.io's
// test tensors are stored so. Debian packages no maintained C++ reader (cnpy is not in the archive), so this
// is tiler's own, for the little it needs. Promise: C-order arrays of little-endian <f4, <f8, <i1/|i1,
// <u1/|u1, <i2, <u2, <i4, <u4, <i8 are read exactly (every value, integers past 2^53 rounded); anything else
// (a Fortran-order array, another dtype, big-endian data, a bad magic, header or shape, a file shorter or
// longer than its shape says) is an IoError naming the file and the problem. numpyTypestr names a sample
// type as NumPy does, for the formats that store NumPy's dtypes (Zarr). No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tiler/io/image_io.hpp"

namespace tiler {

struct NpyArray {
  std::string dtype;           // as the header gives it: "<f4", "|u1", ...
  std::vector<int64_t> shape;  // () is a scalar: one value
  std::vector<double> values;  // row-major (C order)
};

constexpr int64_t kMaxNpyBytes = int64_t(1) << 30;

// The array in `path`; IoError naming it when it is not a regular file (a FIFO, /dev/zero) or holds more
// than `max_bytes`, refused before a byte is read.
NpyArray readNpy(const std::string& path, int64_t max_bytes = kMaxNpyBytes);
// The array a .npy file's `bytes` hold (a zip member's, say), its errors naming `path`.
NpyArray parseNpy(const std::string& bytes, const std::string& path);

// NumPy's typestr of a sample type, as its data is laid out here (little-endian): "|u1", "<u2", "<i2",
// "<f2", "<f4", ...
std::string numpyTypestr(SampleType type);

}  // namespace tiler
