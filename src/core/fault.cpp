#include "tiler/core/fault.hpp"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "tiler/core/error.hpp"

namespace tiler {

std::optional<Fault> Fault::fromEnvironment() {
  const char* spec = std::getenv("TILER_FAULT");
  if (spec == nullptr || *spec == '\0') return std::nullopt;
  // Only the first attempt faults, so that a restarted group (ctrun --max_restarts) can finish.
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (restart != nullptr && std::string(restart) != "0") return std::nullopt;
  Fault f;
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    auto colon = part.find(':');
    TILER_CHECK(colon != std::string::npos, ConfigError, "TILER_FAULT: bad item '" << part << "'");
    std::string key = part.substr(0, colon), value = part.substr(colon + 1);
    try {
      if (key == "rank")
        f.rank = std::stoi(value);
      else if (key == "after_windows")
        f.after_windows = std::stoll(value);
      else if (key == "kind")
        f.kind = value;
      else if (key == "stage")
        f.stage = value;
      else
        TILER_THROW(ConfigError, "TILER_FAULT: unknown key '" << key << "'");
    } catch (const std::logic_error&) {
      TILER_THROW(ConfigError, "TILER_FAULT: '" << value << "' is not a number");
    }
  }
  TILER_CHECK(
      f.kind == "crash" || f.kind == "hang" || f.kind == "exit" || f.kind == "throw" || f.kind == "oom",
      ConfigError, "TILER_FAULT: kind must be crash, hang, exit, throw or oom");
  if (f.kind == "oom" && f.stage != "stitch") f.stage = "forward";
  if (f.kind == "throw") {
    TILER_CHECK(f.stage == "read" || f.stage == "forward" || f.stage == "write" || f.stage == "checkpoint",
                ConfigError, "TILER_FAULT: kind:throw needs stage:read|forward|write|checkpoint");
  }
  return f;
}

std::string injectedFailure(const std::string& what) {
  return "TILER_FAULT: injected " + what;
}

void Fault::trigger(const std::string& what) const {
  std::cerr << "tiler: TILER_FAULT: injecting '" << kind << "' " << what << std::endl;
  if (kind == "crash") raise(SIGSEGV);
  if (kind == "exit") std::_Exit(3);
  if (kind == "throw") throw std::runtime_error(injectedFailure("failure " + what));
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

FaultHooks faultHooks(const std::optional<Fault>& fault, int rank, std::function<void()> out_of_memory) {
  FaultHooks hooks;
  if (!fault || fault->rank != rank) return hooks;
  const Fault f = *fault;
  const int64_t k = f.after_windows;
  if (f.stage == "read" || f.stage == "checkpoint") {
    // The windows read: the read fault's count, and the checkpoint fault's (the reads of the read-ahead
    // thread, looked at by the main thread).
    auto reads = std::make_shared<std::atomic<int64_t>>(0);
    auto fired = std::make_shared<std::atomic<bool>>(false);
    const bool throws = f.stage == "read" && f.kind == "throw";
    hooks.before_read = [f, k, reads, fired, throws](const std::string& input) {
      if (++*reads >= k && throws && !fired->exchange(true)) f.trigger("while reading '" + input + "'");
    };
    if (f.stage == "checkpoint") {
      hooks.before_checkpoint = [f, k, reads](const std::string& dir) {
        if (*reads >= k) f.trigger("while writing checkpoint '" + dir + "'");
      };
    }
  }
  if (f.stage == "forward" && (f.kind == "throw" || f.kind == "oom")) {
    auto started = std::make_shared<int64_t>(0);  // the caller's thread, in step order
    hooks.forward_slot = [k, started](const StepSlots& slots) {
      int64_t hit = -1;
      for (size_t j = 0; j < slots.size(); ++j)
        if (slots[j].ok() && ++*started == k) hit = int64_t(j);
      return hit;
    };
    // oom: every forward holding that window runs out of memory; throw: the one forward that holds it.
    if (f.kind == "oom" && out_of_memory)
      hooks.in_forward = out_of_memory;
    else
      hooks.in_forward = [f] { f.trigger("in the forward"); };
  }
  if (f.stage == "stitch" && f.kind == "oom" && out_of_memory) {
    auto made = std::make_shared<int64_t>(0);  // the output stage's thread
    hooks.before_device_stitcher = [k, made, out_of_memory] {
      if ((*made)++ == k) out_of_memory();
    };
  }
  if (f.stage == "write" && f.kind == "throw") {
    auto stitched = std::make_shared<int64_t>(0);  // the output stage's thread
    auto fired = std::make_shared<bool>(false);
    hooks.stitched_window = [k, stitched, fired] {
      if (*fired || ++*stitched < k) return false;
      *fired = true;
      return true;
    };
  }
  if ((f.kind == "crash" || f.kind == "hang" || f.kind == "exit") && f.stage.empty()) {
    hooks.after_windows = [f, k](int64_t windows) {
      if (windows >= k) f.trigger("after " + std::to_string(windows) + " windows");
    };
  }
  return hooks;
}

}  // namespace tiler
