#include "tiler/finetune.hpp"

#include "tiler/error.hpp"

namespace tiler {
int runFinetune(const FinetuneOptions&) {
  TILER_THROW(ConfigError, "finetune: not built yet");
}
}  // namespace tiler
