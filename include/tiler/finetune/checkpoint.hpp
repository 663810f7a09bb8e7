// finetune/checkpoint: what training writes to keep and to resume from: the model file `tiler infer` loads as
// it is, recording the settings it was trained with (readTrainedSettings reads them), and an epoch's
// checkpoint (the model, the optimizer's state, the loss scaler, the step and the history of the epochs).
// Promise: files are written atomically; a checkpoint goes into a fresh directory that one rename makes
// current (a crash at any point leaves the previous one whole, never new weights beside old state), and the
// older ones go once it is. Loading refuses a checkpoint of another model, another --seed, or with a count
// out of range, naming the file; the optimizer's state lands on the model's device, whichever device saved
// it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tiler/finetune/options.hpp"

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace tiler {

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

// Saves `module` (in eval mode while it is written, then back in training) to `path` with `settings` as its
// extra file, making `path`'s directory. IoError naming the path when it cannot.
void saveTrainedModel(torch::jit::Module& module, const std::string& path, const TrainedSettings& settings);

// What resuming continues from besides the weights and the optimizer: the scheduler is a function of the
// step, the sampler of (seed, epoch).
struct TrainingState {
  LossScaler scaler;
  int64_t step = 0, total_steps = 0;
  nlohmann::json history = nlohmann::json::array();  // the report's epochs so far
};

// The checkpoints of --checkpoint_dir, epoch-NNNNNN directories.
class Checkpoints {
 public:
  Checkpoints(std::string dir, uint64_t seed, TrainedSettings settings)
      : dir_(std::move(dir)), seed_(seed), settings_(std::move(settings)) {}
  // `before_write`: called with the partial directory once the model is in it (TILER_FAULT's checkpoint
  // hook).
  void save(int epoch, torch::jit::Module& module, torch::optim::Optimizer& optimizer,
            const TrainingState& state, const std::function<void(const std::string&)>& before_write) const;
  // The last complete checkpoint's epoch as this process sees the directory; 0: none.
  int latest() const;
  // Epoch `epoch`'s checkpoint into `module` (its parameters `params`, in module order), `optimizer` (on
  // `device`) and `state`.
  void load(int epoch, torch::jit::Module& module, const std::vector<torch::Tensor>& params,
            torch::optim::Optimizer& optimizer, const torch::Device& device, TrainingState& state) const;
  std::string epochDir(int epoch) const;

 private:
  std::string dir_;
  uint64_t seed_;
  TrainedSettings settings_;
};

}  // namespace tiler
