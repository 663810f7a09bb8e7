#include "tiler/finetune/finetune.hpp"

#include <malloc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tiler/finetune/trainer.hpp"
#include "tiler/model/block_cache.hpp"
#include "tiler/model/model_runtime.hpp"

namespace tiler {

int runFinetune(const FinetuneOptions& options) {
  installLargeBlockCache();  // before the process group's and the stages' threads exist
  // A step allocates and frees the same tensors under 1 MiB (the large block cache's floor) every step;
  // glibc's default thresholds give them back to the system (mmap, heap trim) and take page faults on each
  // new step: 4 ms of a 40 ms step of the bench's loss and input alone. Kept on the heap, as PyTorch's loop
  // is run (scripts/python_finetune.py), unless the environment sets glibc's malloc.
  if (!std::getenv("GLIBC_TUNABLES") && !std::getenv("MALLOC_MMAP_THRESHOLD_") &&
      !std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  }
  return runTraining(options);
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
