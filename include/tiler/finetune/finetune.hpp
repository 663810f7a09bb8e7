// finetune: `tiler finetune`, data-parallel training of a TorchScript model on tiles of image/label pairs,
// over the same catalog, loader (with read-ahead), sampler and step exchange as inference, and fed exactly as
// inference feeds it (the shared JobOptions: scale, mean, std, output key). Its flags and entry point; the
// job is a plan (plan.hpp) and parts: label sources (label_source.hpp: label images, annotations, window
// labels), the data and its split (training_data.hpp), batches (batches.hpp), losses (losses.hpp), validation
// (validation.hpp), checkpoints and the model file (checkpoint.hpp), and the trainer's phases (trainer.hpp).
// Promise: parameters and buffers are broadcast from rank 0 at start, and every rank holds identical
// parameters after each step; an error on any rank ends every rank at that step with its message; --resume
// continues from the epoch rank 0 finds, to the same parameters as an uninterrupted run; the output is a
// TorchScript file that `tiler infer` loads as it is, and that records the window, the µm/px and the classes
// it was trained with (readTrainedSettings) for infer to take. Validation reports per-class IoU and Dice
// every epoch (and accuracy for window labels), in the report, a CSV and a PNG plot beside -o.
#pragma once

#include <cstdint>
#include <optional>
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
  double loss_scale = 0;  // the first dynamic loss scale; 0: 65536 under fp16, no scaling otherwise
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

int runFinetune(const FinetuneOptions& options);

// Dynamic loss scaling as PyTorch's GradScaler: a step whose gradients are not finite is skipped and the
// scale halved; after `growth_steps` finite steps in a row it doubles. Plain arithmetic: the same on every
// device.
struct LossScaler {
  double scale = 65536.0;
  int64_t growth_steps = 2000;
  int64_t good_steps = 0;     // finite steps since the last change
  int64_t skipped_steps = 0;  // steps skipped for gradients that were not finite
  // Records a step's outcome; returns whether the step is to be taken.
  bool update(bool finite_gradients);
};

// What a model `tiler finetune` wrote records of its training (its extra file extra/tiler.json): the
// window ("W,H"), the processing µm/px or magnification (0: not chosen) and the classes ("a,b,c"). nullopt
// for a file without it (another model, a package). `tiler infer` takes each where its flag is not given.
struct TrainedSettings {
  std::string window, classes;
  double mpp = 0, magnification = 0;
};
std::optional<TrainedSettings> readTrainedSettings(const std::string& model_path);
// The extra file of a model's archive (extra/<name>) that holds its TrainedSettings as JSON.
inline constexpr const char* kTrainedSettingsFile = "tiler.json";

}  // namespace tiler
