// finetune: data-parallel training of a TorchScript model on tiles of image/label pairs, over the same
// catalog, loader (with read-ahead), sampler and step exchange as inference, and fed exactly as inference
// feeds it (the shared JobOptions: scale, mean, std, output key).
// Promise: parameters and buffers are broadcast from rank 0 at start; gradients are summed over
// --grad_accum_steps micro-batches, then all-reduced in ~25 MB flat buckets and averaged, so every rank
// holds identical parameters (K ranks x batch B equal 1 rank x K micro-batches of B). Every step first
// shares each rank's status: an error on any rank (a label that cannot be read, an out-of-memory forward)
// ends every rank at that step with its message. Checkpoints are written to a fresh directory per epoch
// and made current by one rename; --resume continues from the epoch rank 0 finds, to the same parameters
// as an uninterrupted run; the output is a TorchScript file that `tiler infer` loads as it is.
#pragma once

#include <cstdint>
#include <string>

#include "tiler/job_options.hpp"

namespace tiler {

// The flat parameter struct of `tiler finetune`: the shared job flags plus one field per finetune flag.
struct FinetuneOptions : JobOptions {
  FinetuneOptions() {
    window = "128";
    pad = "reflect";
  }
  std::string images_dir, labels_dir;
  std::string output = "finetuned.pt";
  int epochs = 5;
  double lr = 1e-3;
  std::string optimizer = "adam";  // adam | sgd
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::string schedule = "constant";  // constant | cosine
  int warmup_epochs = 0;
  std::string loss = "ce";   // ce | bce | mse | dice
  int grad_accum_steps = 1;  // micro-batches per optimizer step
  uint64_t seed = 0;
  double val_fraction = 0.2;
  bool augment = false;
  bool drop_last = false;
  std::string checkpoint_dir;
  bool resume = false;
  std::string report;  // empty: <output>.report.json
};

int runFinetune(const FinetuneOptions& options);

}  // namespace tiler
