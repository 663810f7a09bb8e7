// torch_compat: the one place where LibTorch 1.13 (Debian) and 2.x (pytorch.org, pip wheels) differ.
// Covers: (1) autocast enable/dtype calls (per-device functions in 1.13..2.3, set_autocast_*(DeviceType)
// from 2.4); (2) the c10d collective type (ProcessGroupGloo/NCCL derive from ProcessGroup in 1.13 and from
// Backend in 2.x) and the USE_C10D_* macros the c10d headers need; (3) whether NCCL is compiled in
// (TILER_WITH_NCCL from CMake: the torch_cuda target's USE_C10D_NCCL); (4) the environment variables
// that make NCCL's wait(timeout) throw (renamed with a TORCH_ prefix in 2.2); (5) TCPStore's libuv default
// (2.4+); (6) AOTInductor's package loader for .pt2 files (TILER_HAVE_AOTI: 2.6+).
// Include only from .cpp files that need c10d or autocast: it pulls in heavy headers.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cstdlib>

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#if TILER_WITH_NCCL && !defined(USE_C10D_NCCL)
#define USE_C10D_NCCL
#endif

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if TILER_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#define TILER_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if TILER_TORCH_AT_LEAST(2, 6) && __has_include(<torch/csrc/inductor/aoti_package/model_package_loader.h>)
#define TILER_HAVE_AOTI 1
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#else
#define TILER_HAVE_AOTI 0
#endif

namespace tiler::compat {

constexpr bool kNcclCompiled = TILER_WITH_NCCL != 0;

// LibTorch 2.6's oneDNN (Debian trixie, 3.6) computes bf16 convolutions 30-45% off their fp32 values with its
// AVX-512 kernels (seen on an AMD EPYC with avx512_bf16; with AVX2 kernels they are within 1%); 1.13's is
// right.
constexpr bool kOneDnnBf16NeedsAvx2 = TILER_TORCH_AT_LEAST(2, 0);

#if TILER_TORCH_AT_LEAST(2, 0)
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

// Turns autocast on for `device` (cpu or cuda) with `dtype`, or off.
inline void setAutocast(c10::DeviceType device, bool enabled, at::ScalarType dtype) {
#if TILER_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
  if (enabled) at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
    if (enabled) at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(enabled);
    if (enabled) at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

// TCPStore options on the classic socket backend: from 2.4 TCPStore asks for libuv by default and throws
// when the build has none (Debian's 2.6); the classic backend exists in every version.
inline c10d::TCPStoreOptions storeOptions() {
  c10d::TCPStoreOptions options;
#if TILER_TORCH_AT_LEAST(2, 3)
  options.useLibUV = false;
#endif
  return options;
}

// RAII: autocast on for a scope (forward passes), restored and its cast cache cleared on exit.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, bool enabled, at::ScalarType dtype)
      : device_(device), enabled_(enabled) {
    if (enabled_) {
      setAutocast(device_, true, dtype);
      at::autocast::increment_nesting();
    }
  }
  ~AutocastScope() {
    if (enabled_) {
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      setAutocast(device_, false, at::kFloat);
    }
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
};

// NCCL work only honours wait(timeout) with blocking wait on, and only tears down a hung communicator with
// async error handling on. Sets both (unless the user set them) before a ProcessGroupNCCL is made.
inline void enableNcclTimeouts() {
#if TILER_TORCH_AT_LEAST(2, 2)
  setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", 0);
#else
  setenv("NCCL_BLOCKING_WAIT", "1", 0);
  setenv("NCCL_ASYNC_ERROR_HANDLING", "1", 0);
#endif
}

// Shuts a NCCL group down before it is destroyed (2.2+; without it the destructor warns and may wait on a
// dead peer's communicator); gloo and older versions need nothing.
inline void shutdownGroup(Collectives* group) {
#if TILER_WITH_NCCL && TILER_TORCH_AT_LEAST(2, 2)
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(group)) nccl->shutdown();
#else
  (void)group;
#endif
}

}  // namespace tiler::compat
