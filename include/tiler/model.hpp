// model: a TorchScript model on one device, probed once, fed normalised batches.
// Promise: load() and probe() throw ModelError naming the file and what does not fit (missing, corrupt, not
// TorchScript, wrong forward signature, non-tensor or non-NCHW output, output size not an exact integer
// multiple or fraction of the window). forward() takes raw sample values (float32 NHWC on the CPU, the
// model's input channel count) and per-sample scale factors, normalises on the model's device, runs under
// InferenceMode and autocast (bf16 CPU/CUDA, fp16 CUDA), and returns float32 NCHW predictions on the device
// with the activation applied. Not thread safe: one thread calls forward().
#pragma once

#include <torch/script.h>

#include <optional>
#include <string>
#include <vector>

#include "tiler/grid.hpp"
#include "tiler/job_options.hpp"

namespace tiler {

enum class Precision { kFp32, kFp16, kBf16 };
enum class Activation { kNone, kSoftmax, kSigmoid };
Activation parseActivation(const std::string& name);
// Intra-op threads when --threads is not given: OMP_NUM_THREADS if set, else the CPUs this process may use
// divided by the ranks on this node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE).
int defaultIntraOpThreads();
// Test-time augmentation: each window also runs mirrored (flip: left-right; d4: the 8 rotations and
// mirrors of a square), in the same batch; predictions are mapped back and averaged after the activation.
enum class Tta { kNone, kFlip, kD4 };
Tta parseTta(const std::string& name);
const char* ttaName(Tta tta);
const char* precisionName(Precision p);

struct ModelOptions {
  std::string path;
  std::string device = "auto";     // auto | cpu | cuda | cuda:K
  std::string precision = "auto";  // auto | fp32 | fp16 | bf16
  int threads = 0;                 // LibTorch intra-op threads for this rank; 0 keeps LibTorch's default
  std::string output_key;          // dict output key or tuple index; empty: the first tensor
  std::vector<double> mean, std;   // per channel (1 or C values), applied after scaling
  Activation activation = Activation::kNone;
  bool jit_optimize = false;  // freeze + optimize_for_inference
  Tta tta = Tta::kNone;       // forward() only
  int local_rank = 0;         // for device auto/cuda
};

// The model flags of a job (path, default: the bundled sample model; device, precision, threads, output
// key, mean, std) for the rank with `local_rank`.
ModelOptions modelOptionsFor(const JobOptions& job, int local_rank);

struct ModelProbe {
  int input_channels = 0;  // what the model takes
  int output_channels = 0;
  Scale scale;  // output size / window size
};

// Sets glibc's allocator for inference (large blocks kept in the heap, one arena), once per process, unless
// GLIBC_TUNABLES is set. ModelRunner calls it; infer and finetune call it first, before threads make arenas.
void keepLargeBlocksInHeap();

// Whether a forward failed for want of memory: c10's OutOfMemoryError, or that error (or the CPU allocator's)
// as the TorchScript interpreter rethrows it, as a std::runtime_error that keeps only its text.
bool isOutOfMemory(const std::exception& e);

// Resolves --device (auto: cuda:(local_rank mod count) when CUDA is usable, else cpu).
torch::Device resolveDevice(const std::string& spec, int local_rank);
// Resolves --precision for a device (auto: fp16 on CUDA, fp32 on CPU); fp16 on CPU is a ConfigError.
Precision resolvePrecision(const std::string& spec, const torch::Device& device);

class ModelRunner {
 public:
  explicit ModelRunner(const ModelOptions& options);
  // One forward of a zero batch of the window size; cached.
  const ModelProbe& probe(int64_t window_w, int64_t window_h);
  const ModelProbe& probed() const { return probe_; }
  // batch_nhwc: float32 [B,H,W,C] raw values on the CPU; scales: float32 [B]. Returns float32 [B,C',H',W'],
  // activation applied, computed under InferenceMode.
  torch::Tensor forward(const torch::Tensor& batch_nhwc, const torch::Tensor& scales);
  // The pieces of forward() that training reuses with autograd on: normalisation onto the device (NCHW), and
  // the module under autocast with its output tensor picked and cast to float32.
  torch::Tensor normalize(const torch::Tensor& batch_nhwc, const torch::Tensor& scales) const;
  torch::Tensor apply(const torch::Tensor& nchw);
  const torch::Device& device() const { return device_; }
  Precision precision() const { return precision_; }
  torch::jit::Module& module() { return module_; }

 private:
  torch::Tensor extractTensor(const c10::IValue& out) const;

  ModelOptions options_;
  torch::Device device_;
  Precision precision_;
  // The model's device made current on the thread that made the runner (restored when it goes): CUDA calls
  // that take the current device (events, pinned memory, cuBLAS handles) then use this rank's GPU, not GPU 0.
  c10::DeviceGuard current_device_;
  torch::jit::Module module_;
  ModelProbe probe_;
  torch::Tensor mean_, inv_std_;  // [1,C,1,1] on device, or undefined
};

// Loads a TorchScript module with tiler's error messages (used by infer and finetune).
torch::jit::Module loadTorchScript(const std::string& path, const torch::Device& device);

}  // namespace tiler
