// forward: a step's batch through a model replica, whatever memory allows.
// Promise: run() returns the batch's predictions ([batch, a window's prediction], contiguous, on
// ForwardSpec::to); a forward that runs out of memory is retried in halves down to one window, with the same
// outputs; any other failure of a forward fails the images of its slots (WindowBatch::failures, the slots
// marked failed, their rows zero) and the run goes on. Safe to call from several replica threads at once.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <vector>

#include "tiler/core/fault.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/model/model.hpp"

namespace tiler {

struct ForwardSpec {
  int64_t batch_size = 1;
  std::vector<int64_t> window_sizes;  // one window's prediction
  torch::ScalarType type = torch::kFloat32;
  // Where the predictions go: the exchange's device (the CPU but for NCCL), or the model's when it stitches.
  torch::Device to = torch::kCPU;
  int rank = 0;  // for the out-of-memory warning
};

class BatchForward {
 public:
  // `catalog` and `faults` must outlive this (TILER_FAULT's in_forward fires in the forward it names).
  BatchForward(ForwardSpec spec, const WindowCatalog& catalog, const FaultHooks& faults)
      : spec_(std::move(spec)), catalog_(catalog), faults_(faults) {}
  // `fault_slot`: the slot whose forward TILER_FAULT fails (-1: none).
  torch::Tensor run(ModelRunner& model, WindowBatch& batch, int64_t fault_slot);

 private:
  std::vector<int64_t> sizesOf(int64_t windows) const;
  torch::Tensor zeros() const;
  torch::Tensor toDestination(const torch::Tensor& preds) const;
  // Slots [first, first + count) into `out`: out of memory splits them in halves down to one.
  void forwardSlots(ModelRunner& model, WindowBatch& batch, int64_t first, int64_t count, int64_t fault_slot,
                    torch::Tensor& out);
  void failSlots(WindowBatch& batch, int64_t first, int64_t count, const std::string& message) const;

  ForwardSpec spec_;
  const WindowCatalog& catalog_;
  const FaultHooks& faults_;
  std::atomic<bool> oom_logged_{false};
};

}  // namespace tiler
