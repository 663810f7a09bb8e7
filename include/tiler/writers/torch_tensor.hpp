// writers/torch_tensor: --save features_pt, <stem>.pt: the features as one float32 tensor (N, D) in the
// layout torch.save writes (a zip of data.pkl, the storage as data/0, byteorder and version), which
// torch.load reads, weights_only or not: CLAM's pt_files/<slide>.pt. No tensor library: the archive is
// written by c10's zip writer (PyTorchStreamWriter), the one LibTorch header below the compute floor
// (cmake/floors.cmake). Promise: the rows go to a scratch file ("<path>.rows.partial", never committed) as
// they come and are stored from a read-only mapping of it at finish: the features are never on tiler's heap.
// Fixed records, so the bytes depend only on the rows. Written as "<path>.partial" and renamed by the commit
// protocol (output_file.hpp); both partial files go when the writer is destroyed uncommitted. Every failure
// is an IoError naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tiler/writers/output_file.hpp"

namespace tiler {

class TorchTensorFile : public OutputWriter {
 public:
  TorchTensorFile(const std::string& path, int64_t dim);
  // One row of D values.
  void append(const float* values);
  void finish() override;
  void commit(std::vector<std::string>& renamed) override { file_.commit(renamed); }

 private:
  void store(const void* data, size_t bytes);

  int64_t dim_;
  int64_t count_ = 0;  // rows appended
  TextFile rows_;      // scratch, never committed: removed with this object
  TextFile file_;      // the archive
};

// The pickle (protocol 2) torch.save writes for a contiguous float32 CPU tensor (rows, dim) whose storage is
// record "0".
std::string tensorPickle(int64_t rows, int64_t dim);

}  // namespace tiler
