// job_options: the flags `tiler infer` and `tiler finetune` share, in one struct both parameter structs
// extend, so that a model is fed the same way when it is trained and when it is run (same scale, mean, std,
// output key). Plain data, no LibTorch.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tiler/core/processing.hpp"

namespace tiler {

struct JobOptions {
  std::string model;  // empty: the bundled sample model
  std::string device = "auto";
  std::string backend = "auto";
  std::string precision = "auto";
  int threads = 0;         // LibTorch intra-op threads (infer: of each model replica); 0: a default
  double timeout = 300.0;  // seconds any rendezvous or collective may take
  std::string window = "256";
  std::string overlap = "0.25";  // F or FX,FY
  int batch_size = 8;
  std::string pad = "constant";
  std::string channels;  // --channels: the input channels taken, in order ("2,0,1", "0-2"); empty: all
  double scale = 0.0;    // input scale; 0: by sample type (u8 1/255, u16 1/65535, f32 1)
  std::vector<double> mean, std;
  // A model card's steps beyond scale, mean, std and activation (ModelCard::preprocessing, postprocessing):
  // preprocessing after (x * scale - mean) / std, with each image's statistics; postprocessing after the
  // activation, on each window up to its first statistics step, from it on the blended image
  // (splitAtStatistics). Empty: none.
  std::vector<ProcessingStep> preprocessing, postprocessing;
  std::string output_key;  // dict key or tuple index of the model's output; empty: the first tensor
  int prefetch = 2;        // batches read ahead
  bool no_progress = false;
  // The model card the settings came from (model_card.hpp; the report's model_card), and where each of
  // its settings came from: {"window", "card"}, {"mpp", "flag"}, ... (the report's settings_from). Empty:
  // no card.
  std::string model_card;
  // The sha256 the card states of `model` (lowercase hex; empty: none), checked on the bytes the model is
  // loaded from.
  std::string model_sha256;
  std::vector<std::pair<std::string, std::string>> settings_from;
  // Called between the phases before the first step (the model loaded, the data planned) and after each
  // training step (finetune), on the thread that runs the job: a caller's interruption (the Python module's
  // Ctrl-C), what it throws ending the run as a fatal error of this rank. Empty: none.
  std::function<void()> check_interrupt;
};

}  // namespace tiler
