// model: a model (TorchScript or a .pt2 package: model_runtime) on one device, probed once, fed normalised
// batches. Promise: load() and probe() throw ModelError naming the file and what does not fit (missing,
// corrupt, not a model, wrong forward signature, a package for another window, non-tensor or non-NCHW output,
// output size not an exact integer multiple or fraction of the window). forward() takes raw sample values
// (float32 NCHW on the CPU, the model's input channel count) and per-sample scale factors, normalises on the
// model's device, runs under InferenceMode and autocast (bf16 CPU/CUDA, fp16 CUDA), and returns float32 NCHW
// predictions on the device with the activation applied. On the CPU one thread calls a runner's forward() and
// ForwardPool runs replicas of one model on threads of their own; on a GPU ForwardPool's threads share one
// runner (the weights once), each queueing on a stream of its own: forward() changes nothing in the runner,
// and TorchScript runs one module on several threads.
#pragma once

#include <c10/core/DeviceGuard.h>
#include <torch/types.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tiler/core/cpu_layout.hpp"
#include "tiler/core/grid.hpp"
#include "tiler/core/job_options.hpp"
#include "tiler/core/processing.hpp"
#include "tiler/model/block_cache.hpp"
#include "tiler/model/model_runtime.hpp"
#include "tiler/model/probe.hpp"

namespace tiler {

// The segment task's row, the default a model is probed for.
const Task& segmentTask();

// One output of a model that gives several (a tuple's or dict's tensors), run as a task of its own.
struct HeadOptions {
  std::string name;                           // what its outputs are named by (<stem>_<name>_...)
  std::string key;                            // a dict key, else a tuple or list index
  const Task* task = nullptr;                 // as --task, for this head (null: auto)
  Activation activation = Activation::kNone;  // as --activation, for this head
  bool classes_named = false;                 // --classes given for it
};

struct ModelOptions {
  std::string path;
  std::string sha256, sha256_card;  // RuntimeOptions' (a model card's digest of the weights, and the card)
  std::string device = "auto";      // auto | cpu | cuda | cuda:K
  std::string precision = "auto";   // auto | fp32 | fp16 | bf16
  int threads = 0;                  // LibTorch intra-op threads of each replica; 0: defaultIntraOpThreads()
  std::string output_key;           // dict output key or tuple index; empty: the first tensor
  std::vector<double> mean, std;    // per channel (1 or C values), applied after scaling
  // A card's steps (JobOptions::preprocessing, postprocessing): of input_steps, those from the first one that
  // is no affine map on (fixedTail) after the normalisation; output_steps after the activation (one output).
  std::vector<ProcessingStep> input_steps, output_steps;
  Activation activation = Activation::kNone;
  bool jit_optimize = false;  // freeze + optimize_for_inference
  // Without jit_optimize: optimise where that is safe (a TorchScript model, fp32 on the CPU, a module that
  // freezing takes) and keep it only if the probe's check finds its outputs within kJitOptimizeTolerance of
  // the module as loaded (jitOptimizeFallback() says why not).
  bool jit_optimize_default = false;
  Tta tta = Tta::kNone;               // forward() only
  int local_rank = 0;                 // for device auto/cuda
  const Task* task = &segmentTask();  // what probe() expects (null: the output's shape decides)
  bool classes_named = false;         // --classes given: a [B, K] output of kAuto is a classifier
  int64_t batch_size = 1;             // the most windows forward() takes (a package is probed at it)
  int preferred_input_channels = 0;   // probe() tries this count first (--channels' count); 0: none
  // Several outputs of one forward (--heads): each probed as its own task, activated on its own, and
  // forward() gives them side by side, each window's values of head 0, then head 1, ... ([B, sum of each
  // head's values a window]). Empty: one output (output_key, task, activation).
  std::vector<HeadOptions> heads;
};

// The model flags of a job (path, default: the bundled sample model; device, precision, threads, output
// key, mean, std, the count of --channels) for the rank with `local_rank`.
ModelOptions modelOptionsFor(const JobOptions& job, int local_rank);

// What a model's outputs become for `task` (its row's predictionType: float64 for instance maps, whose ids
// float32 holds exactly only below 2^24), float32 for null.
torch::ScalarType predictionType(const Task* task);

// Whether a forward failed for want of memory: c10's OutOfMemoryError, or that error (or the CPU allocator's)
// as the TorchScript interpreter rethrows it, as a std::runtime_error that keeps only its text.
bool isOutOfMemory(const std::exception& e);

// Throws ConfigError naming `path` unless training can change it: a .pt2 package (compiled code) is refused
// by what the file holds, before anything of it is loaded or checked.
void requireTrainableModel(const std::string& path);

// Resolves --device (auto: cuda:(local_rank mod count) when CUDA is usable, else cpu).
torch::Device resolveDevice(const std::string& spec, int local_rank);
// Resolves --precision for a device (auto: fp16 on CUDA, fp32 on CPU); fp16 on CPU is a ConfigError.
Precision resolvePrecision(const std::string& spec, const torch::Device& device);

// The largest difference between the optimised and the loaded module's outputs that probe() accepts, as a
// share of the loaded outputs' largest magnitude (at least 1): what the tests hold between runs.
constexpr double kJitOptimizeTolerance = 1e-5;

// Seconds this thread has spent in ModelRunner::normalize (the report's normalize_seconds).
double normalizeSecondsOfThisThread();

class ModelRunner {
 public:
  explicit ModelRunner(const ModelOptions& options);
  // One forward of a zero batch of the window size; cached.
  const ModelProbe& probe(int64_t window_w, int64_t window_h);
  const ModelProbe& probed() const { return probe_; }
  // With ModelOptions::heads: each head's probe, in their order (probe()'s is the first's); else probe()'s.
  const std::vector<ModelProbe>& headProbes() const { return head_probes_; }
  // Seconds per window of zero windows of the probed size through forward(), one window twice, then batches
  // of `batch`: on the CPU, CPU seconds of one intra-op thread (what the machine's other load does not
  // change); on a GPU, wall seconds to the result. The fastest of up to eight runs, stopping at the first
  // under `enough`, at the second window alone if over twice it, or at a run over twice it that took
  // 100 ms (past the first runs' one-time cost).
  double secondsPerWindow(int64_t window_w, int64_t window_h, int64_t batch, double enough);
  // Whether one window of varied values through forward() gives the same bytes with one intra-op thread as
  // with `threads` (a layout may then be chosen by speed alone: the job's bytes do not depend on it, nor on
  // how many ranks share the cores). False where the forward fails.
  bool sameOutputAtThreads(int64_t window_w, int64_t window_h, int threads);
  // batch: float32 or uint8 [B,C,H,W] raw values on the CPU; scales: float32 [B]; affine: float32 [B,2,C]
  // per-sample gains and offsets (WindowBatch::affine) that replace scale, mean and std, or undefined.
  // Returns [B,C',H',W'] of predictionType(), activation and output_steps applied, computed under
  // InferenceMode.
  torch::Tensor forward(const torch::Tensor& batch, const torch::Tensor& scales,
                        const torch::Tensor& affine = {});
  // The pieces of forward() that training reuses with autograd on: normalisation onto the device (NCHW), and
  // the module under autocast with its output tensor picked and cast to predictionType().
  torch::Tensor normalize(const torch::Tensor& batch, const torch::Tensor& scales,
                          const torch::Tensor& affine = {}) const;
  torch::Tensor apply(const torch::Tensor& nchw);
  const torch::Device& device() const { return device_; }
  // Waits for what this thread queued on the model's device (its current stream); nothing on the CPU.
  void synchronize() const;
  Precision precision() const { return precision_; }
  // "torchscript" or "pt2".
  const char* runtimeName() const { return runtime_->name(); }
  // Whether the model runs frozen + optimize_for_inference; where that was the default and it does not, why.
  bool jitOptimized() const { return runtime_->optimized(); }
  const std::string& jitOptimizeFallback() const { return jit_fallback_; }
  // The TorchScript module, for training; a ConfigError for a .pt2 package (compiled code).
  torch::jit::Module& module();
  // A copy of this probed runner with its own parameters, for another thread.
  std::unique_ptr<ModelRunner> replicate() const;

 private:
  ModelRunner(const ModelRunner& other, std::unique_ptr<ModelRuntime> runtime);
  // The output tensor of `key` (a dict key or tuple index; empty: the first tensor).
  torch::Tensor extractTensor(const c10::IValue& out, const std::string& key) const;
  // Each head's output of one forward (one: apply's), in predictionType().
  std::vector<torch::Tensor> applyHeads(const torch::Tensor& nchw);
  // Each head's output of one forward, activated, per-window ones as [B, D].
  std::vector<torch::Tensor> activatedHeads(const torch::Tensor& x);
  // ModelOptions::jit_optimize_default: the optimised module against the loaded one on a window of varied
  // values (`channels` x `window_h` x `window_w`); the loaded one runs instead when they differ.
  void checkOptimized(int channels, int64_t window_w, int64_t window_h);

  ModelOptions options_;
  torch::Device device_;
  Precision precision_;
  // The model's device made current on the thread that made the runner (restored when it goes): CUDA calls
  // that take the current device (events, pinned memory, cuBLAS handles) then use this rank's GPU, not GPU 0.
  c10::DeviceGuard current_device_;
  std::unique_ptr<ModelRuntime> runtime_;
  ModelProbe probe_;
  std::vector<ModelProbe> head_probes_;
  torch::Tensor mean_, inv_std_;            // [1,C,1,1] on device, or undefined
  std::vector<ProcessingStep> input_tail_;  // fixedTail(options_.input_steps)
  std::string jit_fallback_;
};

// Runs jobs on `layout.replicas` threads, each with the model's device current (and on the CPU
// `layout.threads` intra-op threads); a free thread takes the oldest job. On the CPU each thread has a
// replica of the probed model (the first is `model` itself); on a GPU they all run `model`, each on a stream
// of its own (made current for its jobs: a job ends with synchronize()). Thread safe. The destructor drops
// jobs not started (their futures report a broken promise), lets running ones finish and joins; jobs must not
// outlive what they capture.
class ForwardPool {
 public:
  ForwardPool(ModelRunner& model, ForwardLayout layout);
  ~ForwardPool();
  ForwardPool(const ForwardPool&) = delete;
  ForwardPool& operator=(const ForwardPool&) = delete;

  template <typename R>
  std::future<R> submit(std::function<R(ModelRunner&)> work) {
    auto task = std::make_shared<std::packaged_task<R(ModelRunner&)>>(std::move(work));
    auto result = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.emplace_back([task](ModelRunner& runner) { (*task)(runner); });
    }
    wake_.notify_one();
    return result;
  }
  int replicas() const { return int(threads_.size()); }

 private:
  void loop(ModelRunner& runner);

  int threads_each_ = 0;                              // intra-op threads of each CPU replica
  std::vector<std::unique_ptr<ModelRunner>> copies_;  // CPU replicas 1..R-1 (owned)
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void(ModelRunner&)>> jobs_;  // guarded by mutex_
  bool stopping_ = false;                               // guarded by mutex_
  std::vector<std::thread> threads_;                    // last: they use the members above
};

}  // namespace tiler
