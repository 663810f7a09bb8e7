// finetune: data-parallel training of a TorchScript model on tiles of image/label pairs, over the same grid,
// sampler and process group as inference.
// Promise: parameters and buffers are broadcast from rank 0 at start; gradients are all-reduced in ~25 MB
// flat buckets and averaged before every step, so every rank holds identical parameters; checkpoints are
// written atomically each epoch and --resume continues to the same parameters as an uninterrupted run; the
// output is a TorchScript file that `tiler infer` loads as it is.
#pragma once

#include <cstdint>
#include <string>

namespace tiler {

// The flat parameter struct of `tiler finetune`, one field per flag.
struct FinetuneOptions {
  std::string images_dir, labels_dir;
  std::string model;  // empty: the bundled sample model
  std::string output = "finetuned.pt";
  int epochs = 5;
  double lr = 1e-3;
  std::string optimizer = "adam";  // adam | sgd
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::string schedule = "constant";  // constant | cosine
  int warmup_epochs = 0;
  std::string loss = "ce";  // ce | bce | mse | dice
  std::string window = "128";
  std::string overlap = "0.25";
  int batch_size = 8;
  std::string pad = "reflect";
  uint64_t seed = 0;
  double val_fraction = 0.2;
  bool augment = false;
  bool drop_last = false;
  std::string checkpoint_dir;
  bool resume = false;
  std::string report;  // empty: <output>.report.json
  std::string device = "auto";
  std::string backend = "auto";
  std::string precision = "auto";
  int threads = 0;
  double timeout = 300.0;
  bool no_progress = false;
};

int runFinetune(const FinetuneOptions& options);

}  // namespace tiler
