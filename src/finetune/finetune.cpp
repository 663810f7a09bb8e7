#include "tiler/finetune/finetune.hpp"

#include <malloc.h>

#include <cstdlib>

#include "tiler/finetune/trainer.hpp"
#include "tiler/model/block_cache.hpp"
#include "tiler/model/model_runtime.hpp"

namespace tiler {

int runFinetune(const FinetuneOptions& options) {
  installLargeBlockCache();  // before the process group's and the stages' threads exist
  // A step allocates and frees the same tensors under 1 MiB (the large block cache's floor) every step;
  // glibc's default thresholds give them back to the system (mmap, heap trim) and take page faults on each
  // new step, a tenth of a small model's step (docs/performance.md). Kept on the heap, as PyTorch's loop is
  // run (scripts/python_finetune.py), unless the environment sets glibc's malloc.
  if (!std::getenv("GLIBC_TUNABLES") && !std::getenv("MALLOC_MMAP_THRESHOLD_") &&
      !std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  }
  return runTraining(options);
}

}  // namespace tiler
