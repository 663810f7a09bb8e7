// writers/hdf5: --save features, <stem>.h5: `features` float32 (N, D) and `coords` int64 (N, 2) as TRIDENT
// and CLAM read them, streamed. No LibTorch; without HDF5 in the build opening one throws requireFeature's
// error. Promise: the datasets are chunked along N and extended a chunk at a time (the last one at finish),
// so a file is never all in memory; the bytes depend only on the rows and the attributes (no timestamps,
// whole chunks in a fixed order). Written as "<path>.partial" (HDF5 creates it exclusively: a planted link is
// refused) and renamed by the commit protocol (output_file.hpp). Every failure is an IoError naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "tiler/writers/output_file.hpp"

namespace tiler {

// A scalar attribute: int64, float64, or a variable-length UTF-8 string (as h5py writes a Python str).
struct Hdf5Attribute {
  std::string name;
  std::variant<int64_t, double, std::string> value;
};

struct FeaturesHdf5Layout {
  int64_t dim = 0;       // D
  int64_t max_rows = 0;  // the rows the file will hold at most (a chunk is never longer)
  // Written, in this order, on the file and on `coords` (TRIDENT and CLAM read the latter) ...
  std::vector<Hdf5Attribute> attributes;
  // ... and on `features` (TRIDENT reads these there).
  std::vector<Hdf5Attribute> features_attributes;
};

class FeaturesHdf5 : public OutputWriter {
 public:
  FeaturesHdf5(std::string path, FeaturesHdf5Layout layout);
  ~FeaturesHdf5() override;
  FeaturesHdf5(const FeaturesHdf5&) = delete;
  FeaturesHdf5& operator=(const FeaturesHdf5&) = delete;
  // One row: its D values and its coordinates (level-0 x, y).
  void append(const float* values, int64_t x, int64_t y);
  void finish() override;
  void commit(std::vector<std::string>& renamed) override;

 private:
  class File;
  std::unique_ptr<File> file_;  // owned; the HDF5 handles
};

}  // namespace tiler
