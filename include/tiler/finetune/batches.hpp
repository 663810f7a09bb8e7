// finetune/batches: an epoch's windows dealt to this rank (DistributedSampler's shards), read by inference's
// window loader (its readers, read-ahead and byte batches) with each window's labels beside its pixels, and
// put on the model's device as the model is fed for inference (normalised), flipped and turned when
// augmenting. Promise: every rank deals the same list the same way for an epoch, and an augmented window is
// transformed the same way, image, target and mask together, for a given (seed, epoch, window) on any rank or
// world size. A window that fails to read throws its error as it was thrown.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tiler/core/fault.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/finetune/training_data.hpp"
#include "tiler/model/model.hpp"

namespace tiler {

// One batch on the model's device: the normalised input, its target [B,c,h,w] and valid mask [B,h,w].
struct DeviceBatch {
  torch::Tensor x, target, mask;
};

class TrainingBatches {
 public:
  // `data`, `runner` and `faults` outlive the batches; `world_size` ranks deal, this one being `rank`.
  TrainingBatches(const FinetuneOptions& o, const FinetunePlan& plan, const TrainingData& data,
                  ModelRunner& runner, const FaultHooks& faults, int world_size, int rank);
  // This rank's windows of `pool` for `epoch` (shuffled by seed and epoch when `shuffle`); `padded`, when
  // given, says which are a sampler's repeats that make every rank's count equal.
  std::vector<WindowRef> epochWindows(const std::vector<WindowRef>& pool, int64_t epoch, bool shuffle,
                                      std::vector<bool>* padded) const;
  // A loader over `windows` in batches of --batch_size, reading labels with `labels` (one thread's readers);
  // `count_for_fault`: its reads count towards TILER_FAULT's window count (training's).
  std::unique_ptr<WindowLoader> loader(const std::vector<WindowRef>& windows, ReaderCache& labels,
                                       bool count_for_fault) const;
  // The loader's next batch of `refs`, on the device; augmented (--augment) when epoch >= 0.
  DeviceBatch next(WindowLoader& loader, const std::vector<WindowRef>& refs, int64_t epoch) const;

 private:
  const FinetuneOptions& o_;
  const FinetunePlan& plan_;
  const TrainingData& data_;
  ModelRunner& runner_;
  const FaultHooks& faults_;
  int world_size_, rank_;
};

}  // namespace tiler
