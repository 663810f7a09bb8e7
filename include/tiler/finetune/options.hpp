// finetune/options: `tiler finetune`'s flags as the command line gives them (FinetuneOptions), which the plan
// (plan.hpp) parses and checks once; plain data, no LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include "tiler/core/job_options.hpp"

namespace tiler {

// The flat parameter struct of `tiler finetune`: the shared job flags plus one field per finetune flag.
struct FinetuneOptions : JobOptions {
  FinetuneOptions() {
    window = "128";
    pad = "reflect";
  }
  std::string images_dir, labels_dir;
  std::string annotations;           // GeoJSON file (one image) or directory of <stem>.geojson
  std::string window_labels;         // CSV image,x,y,label: a class a window, for [B,K] models
  std::string classes;               // NAME[:#rrggbb],... for classes 0..K-1 (annotations name them)
  std::string unlabeled = "ignore";  // ignore | background: pixels (windows) no annotation (row) labels
  std::string class_weights;         // empty: none | auto | w1,w2,...
  std::string val_images, val_labels, val_annotations;  // held-out images instead of --val_fraction
  bool save_best = false;  // also <output>.best.pt: the model of the epoch with the best mean Dice
  std::string mask = "none";
  double mask_fraction = 0.05;
  std::string roi;
  int level = -1;
  double mpp = 0, magnification = 0, input_mpp = 0;
  bool no_upsample = false;  // a target finer than an image's level 0 stops the run instead of upsampling
  double loss_scale = 0;     // the first dynamic loss scale; 0: 65536 under fp16, no scaling otherwise
  int64_t loss_scale_growth_steps = 2000;  // finite steps after which the scale doubles
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

}  // namespace tiler
