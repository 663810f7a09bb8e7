// fault: the testing hook TILER_FAULT=rank:R,after_windows:K,kind:KIND[,stage:STAGE], read only from the
// environment and only on a first attempt (TORCHELASTIC_RESTART_COUNT unset or 0). KIND crash | hang | exit
// acts once rank R has processed K windows; throw (a std::runtime_error, not a tiler error) acts in STAGE
// read | forward | write | checkpoint for the image of rank R's K-th window; oom is LibTorch's
// out-of-memory error from every forward of rank R that holds that window, or, with stage stitch, when
// rank R makes the device stitcher of an image after K others (that image is then stitched on the host).
// Promise: the stages never look for faults. A job turns the fault into hooks for its rank once
// (faultHooks) and installs each where it acts: before the loader's window reads, around the forward,
// on the output stage's stitched windows, after each step, before a checkpoint. A hook that is not this
// rank's is empty, and a stage given none runs as it always does. No LibTorch.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tiler/core/slots.hpp"

namespace tiler {

// The message of an injected failure, "TILER_FAULT: injected <what>": the one spelling tests look for, so
// that no stage writes the variable's name itself.
std::string injectedFailure(const std::string& what);

struct Fault {
  int rank = -1;
  int64_t after_windows = 0;
  std::string kind;   // crash | hang | exit | throw | oom
  std::string stage;  // read | forward | write | checkpoint (throw; oom: forward or stitch)

  // nullopt when unset or on a restarted attempt; throws ConfigError on a malformed value.
  static std::optional<Fault> fromEnvironment();
  // crash: SIGSEGV; exit: _exit(3); hang: sleeps forever; throw: std::runtime_error naming `what`.
  [[noreturn]] void trigger(const std::string& what) const;
};

// One rank's fault as hooks. Each counts this rank's windows in its own stage's order.
struct FaultHooks {
  // Before each window is read, with its file (the loader's serial pass, finetune's training reads):
  // throws at the K-th (throw, stage read), once.
  std::function<void(const std::string& input)> before_read;
  // Each step's slots as the forward gets them, in step order: the slot holding the K-th window (throw or
  // oom, stage forward) or -1; and what a forward holding that slot does (throw; or `out_of_memory`).
  std::function<int64_t(const StepSlots& slots)> forward_slot;
  std::function<void()> in_forward;
  // Each window stitched, in the output stage's order: true at the K-th (throw, stage write), once; the
  // stage then makes that window's image's tiles throw as they are compressed.
  std::function<bool()> stitched_window;
  // Before each image's device stitcher is made, in the output stage's order: `out_of_memory` for the one
  // made after K others (oom, stage stitch).
  std::function<void()> before_device_stitcher;
  // After each step, with the windows this rank has done: crash | hang | exit once they reach K.
  std::function<void(int64_t windows)> after_windows;
  // Before a checkpoint's files are written (throw, stage checkpoint), once K windows were read.
  std::function<void(const std::string& dir)> before_checkpoint;
};

// The hooks of `fault` for `rank` (all empty when there is no fault or it is another rank's).
// `out_of_memory` throws LibTorch's out-of-memory error (kind oom); the caller gives it, this floor has no
// LibTorch.
FaultHooks faultHooks(const std::optional<Fault>& fault, int rank,
                      std::function<void()> out_of_memory = nullptr);

}  // namespace tiler
