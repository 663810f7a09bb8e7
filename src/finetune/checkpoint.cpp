#include "tiler/finetune/checkpoint.hpp"

#include <torch/optim.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/dist/report.hpp"
#include "tiler/model/model_runtime.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// A count of a checkpoint's state.json (epoch, step): a whole number from 0 to `most`, else an IoError naming
// the file and the field (1e300 converted to an int was -2147483648: "names epoch -2147483648").
int64_t checkpointCount(const nlohmann::json& state, const char* key, int64_t most, const std::string& file) {
  const auto it = state.find(key);
  const bool fits = it != state.end() && it->is_number_integer() &&
                    (it->is_number_unsigned() ? it->get<uint64_t>() <= uint64_t(most)
                                              : it->get<int64_t>() >= 0 && it->get<int64_t>() <= most);
  TILER_CHECK(fits, IoError,
              "'" << file << "': " << key << " is "
                  << (it == state.end() ? std::string("missing") : it->dump())
                  << ", not a whole number from 0 to " << most);
  return it->get<int64_t>();
}

// `saved`'s parameters and buffers copied into `module`'s (`params`), which they must match in number and
// shape.
void copyWeights(torch::jit::Module& saved, torch::jit::Module& module,
                 const std::vector<torch::Tensor>& params, const std::string& file) {
  std::vector<torch::Tensor> from;
  for (const auto& p : saved.parameters()) from.push_back(p);
  TILER_CHECK(from.size() == params.size(), ModelError,
              "'" << file << "': " << from.size() << " parameter tensors, the model has " << params.size());
  for (size_t i = 0; i < from.size(); ++i)
    TILER_CHECK(from[i].sizes() == params[i].sizes(), ModelError,
                "'" << file << "': parameter " << i << " has shape " << from[i].sizes() << ", the model's is "
                    << params[i].sizes());
  torch::NoGradGuard ng;
  for (size_t i = 0; i < from.size(); ++i) params[i].detach().copy_(from[i].detach());
  auto dst_buffers = module.buffers(true);
  auto src_buffers = saved.buffers(true);
  auto sb = src_buffers.begin();
  for (const auto& b : dst_buffers) {
    TILER_CHECK(sb != src_buffers.end() && (*sb).sizes() == b.sizes(), ModelError,
                "'" << file << "': buffers do not match the model's");
    b.detach().copy_((*sb++).detach());
  }
}

}  // namespace

void saveTrainedModel(torch::jit::Module& module, const std::string& path, const TrainedSettings& settings) {
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  module.eval();
  std::string error;
  try {
    const nlohmann::json recorded = {{"window", settings.window},
                                     {"mpp", settings.mpp},
                                     {"magnification", settings.magnification},
                                     {"classes", settings.classes}};
    const torch::jit::ExtraFilesMap extra{{kTrainedSettingsFile, recorded.dump()}};
    error = writeFileAtomically(path, [&](std::ostream& out) { module.save(out, extra); });
  } catch (...) {
    error = describeException(std::current_exception());
  }
  module.train();
  TILER_CHECK(error.empty(), IoError, "'" << path << "': cannot save the model: " << error);
}

std::string Checkpoints::epochDir(int epoch) const {
  char name[32];
  std::snprintf(name, sizeof name, "epoch-%06d", epoch);
  return (fs::path(dir_) / name).string();
}

void Checkpoints::save(int epoch, torch::jit::Module& module, torch::optim::Optimizer& optimizer,
                       const TrainingState& state,
                       const std::function<void(const std::string&)>& before_write) const {
  const std::string final_dir = epochDir(epoch), dir = final_dir + ".partial";
  std::error_code ec;
  removeTree(dir);
  fs::create_directories(dir);
  saveTrainedModel(module, dir + "/model.pt", settings_);
  if (before_write) before_write(dir);
  const std::string optimizer_error =
      writeFileAtomically(dir + "/optimizer.pt", [&](std::ostream& out) { torch::save(optimizer, out); });
  TILER_CHECK(optimizer_error.empty(), IoError, "cannot save the optimizer state: " << optimizer_error);
  const nlohmann::json saved = {{"epoch", epoch},
                                {"loss_scale", state.scaler.scale},
                                {"good_steps", state.scaler.good_steps},
                                {"skipped_steps", state.scaler.skipped_steps},
                                {"step", state.step},
                                {"total_steps", state.total_steps},
                                {"seed", seed_},
                                {"history", state.history}};
  writeJsonAtomically(dir + "/state.json", saved);
  removeTree(final_dir);
  TILER_CHECK(std::rename(dir.c_str(), final_dir.c_str()) == 0, IoError,
              "'" << final_dir << "': cannot make the checkpoint current: " << std::strerror(errno));
  // Older checkpoints and leftovers of killed writes go once the new one is current.
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("epoch-", 0) == 0 && e.path().string() != final_dir) removeTree(e.path().string());
  }
}

int Checkpoints::latest() const {
  int latest = 0;
  std::error_code ec;
  if (dir_.empty() || !fs::is_directory(dir_, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    int epoch = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "epoch-%d%c", &epoch, &tail) == 1 && fs::exists(e.path() / "state.json"))
      latest = std::max(latest, epoch);
  }
  return latest;
}

void Checkpoints::load(int epoch, torch::jit::Module& module, const std::vector<torch::Tensor>& params,
                       torch::optim::Optimizer& optimizer, const torch::Device& device,
                       TrainingState& state) const {
  const fs::path dir(epochDir(epoch));
  TILER_CHECK(fs::exists(dir / "state.json"), IoError,
              "'" << dir.string() << "': rank 0 resumes from this checkpoint, but this rank cannot see it");
  std::ifstream in(dir / "state.json");
  auto saved = nlohmann::json::parse(in);
  const std::string state_file = (dir / "state.json").string();
  TILER_CHECK(checkpointCount(saved, "epoch", std::numeric_limits<int>::max(), state_file) == epoch, IoError,
              "'" << state_file << "': names epoch " << saved["epoch"].dump() << ", not " << epoch);
  auto model = loadTorchScript((dir / "model.pt").string(), device);
  copyWeights(model, module, params, (dir / "model.pt").string());
  {
    // Onto this rank's device: torch::load would put every rank's state where it was saved (cuda:0).
    torch::serialize::InputArchive archive;
    archive.load_from((dir / "optimizer.pt").string(), device);
    optimizer.load(archive);
  }
  TILER_CHECK(saved.contains("loss_scale") && saved["loss_scale"].is_number() &&
                  std::isfinite(saved["loss_scale"].get<double>()) && saved["loss_scale"].get<double>() > 0,
              IoError, "'" << state_file << "': loss_scale is not a number > 0");
  state.scaler.scale = saved["loss_scale"].get<double>();
  state.scaler.good_steps =
      checkpointCount(saved, "good_steps", std::numeric_limits<int64_t>::max(), state_file);
  if (saved.contains("skipped_steps"))
    state.scaler.skipped_steps =
        checkpointCount(saved, "skipped_steps", std::numeric_limits<int64_t>::max(), state_file);
  // Another seed would shuffle and augment the remaining epochs otherwise than the run being continued.
  TILER_CHECK(!saved.contains("seed") || saved["seed"] == seed_, ConfigError,
              "'" << state_file << "': the run used --seed " << saved["seed"].dump() << ", this one " << seed_
                  << "; resume with the same seed");
  state.step = checkpointCount(saved, "step", std::numeric_limits<int64_t>::max(), state_file);
  state.history = saved["history"];
}

bool LossScaler::update(bool finite_gradients) {
  if (!finite_gradients) {
    scale /= 2;
    good_steps = 0;
    ++skipped_steps;
    return false;
  }
  if (++good_steps >= growth_steps) {
    scale *= 2;
    good_steps = 0;
  }
  return true;
}

std::optional<TrainedSettings> readTrainedSettings(const std::string& model_path) {
  const std::string entry = std::string("/extra/") + kTrainedSettingsFile;
  const auto text = findZipEntry(
      model_path, [&entry](const std::string& name) { return nameEndsWith(name, entry); }, 1 << 20);
  if (!text || text->empty()) return std::nullopt;
  const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  TrainedSettings s;
  try {
    s.window = j.value("window", std::string());
    s.classes = j.value("classes", std::string());
    s.mpp = j.value("mpp", 0.0);
    s.magnification = j.value("magnification", 0.0);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // not what finetune writes: a file of someone else's
  }
  return s;
}

}  // namespace tiler
