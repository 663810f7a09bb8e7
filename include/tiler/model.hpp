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

#include <torch/script.h>

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

#include "tiler/grid.hpp"
#include "tiler/job_options.hpp"
#include "tiler/model_runtime.hpp"

namespace tiler {

enum class Precision { kFp32, kFp16, kBf16 };
enum class Activation { kNone, kSoftmax, kSigmoid };
Activation parseActivation(const std::string& name);
// Intra-op threads when --threads is not given: OMP_NUM_THREADS if set; under Slurm SLURM_CPUS_PER_TASK, or
// all the CPUs this process may use (usableCpus()) where Slurm bound it to fewer than the job's CPUs on the
// node; else those CPUs divided by the ranks on this node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE,
// SLURM_NTASKS_PER_NODE), which share them.
int defaultIntraOpThreads();
// The same for a process that may use `cpus` CPUs.
int defaultIntraOpThreads(int cpus);
// The BLAS that LibTorch's CPU kernels call (convolutions it lowers to matrix products), as the process
// loaded it: "OpenBLAS <its config>", "Intel MKL", "BLIS", or kReferenceBlas, the reference BLAS of
// Debian's libblas3, which makes the sample UNet's forward 1.5-1.8x slower than OpenBLAS does.
inline constexpr const char* kReferenceBlas = "reference BLAS (netlib)";
std::string cpuBlasName();

// How a rank runs its forwards: `replicas` copies of the model, each on a thread of its own with `threads`
// intra-op threads. On the CPU a batch per core scales better than one intra-op pool over small windows
// (the sample UNet's pure forward: 2 replicas x 1 thread 1.41x faster than 1 x 2 threads on 2 cores), so
// without --threads a rank's share of the CPUs becomes replicas (at most kMaxAutoReplicas, each holding a
// batch's activations). --threads alone pins one replica with that many threads: the outputs of that thread
// count, bit for bit. On CUDA kCudaStreams forward threads unless --replicas says how many: each queues its
// batches on a stream of its own, so one batch's copies in and out and its kernel launches overlap another's
// kernels (the sample UNet on an H200 waited 3.8 ms of a 9.5 ms batch for its results to reach the host).
struct ForwardLayout {
  int replicas = 1;
  int threads = 1;
};
constexpr int kMaxAutoReplicas = 4;
constexpr int kCudaStreams = 2;
// `threads_flag`, `replicas_flag`: --threads and --replicas (0: not given); `cpus`: defaultIntraOpThreads().
// `light`: the model's forward costs less than reading and stitching its windows (a threshold, a 1x1
// convolution): without flags one replica of one thread, the other cores left to the loader and the outputs.
ForwardLayout chooseForwardLayout(int threads_flag, int replicas_flag, bool cuda, int cpus,
                                  bool light = false);
// Threads that read a batch's windows: `read_threads_flag` (--read_threads) when given, else the CPUs of
// the rank (`cpus`) that the forward leaves free (all of them on CUDA), at least 1, at most
// kMaxAutoReadThreads. On a CPU rank whose replicas take every core, more read threads only take turns with
// the forward (null model, 2 cores: 2 read threads 1.12x slower than one).
constexpr int kMaxAutoReadThreads = 4;
int chooseReadThreads(int read_threads_flag, const ForwardLayout& layout, bool cuda, int cpus);
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
  int threads = 0;                 // LibTorch intra-op threads of each replica; 0: defaultIntraOpThreads()
  std::string output_key;          // dict output key or tuple index; empty: the first tensor
  std::vector<double> mean, std;   // per channel (1 or C values), applied after scaling
  Activation activation = Activation::kNone;
  bool jit_optimize = false;             // freeze + optimize_for_inference
  Tta tta = Tta::kNone;                  // forward() only
  int local_rank = 0;                    // for device auto/cuda
  ModelTask task = ModelTask::kSegment;  // what probe() expects (kAuto: the output's shape decides)
  bool classes_named = false;            // --classes given: a [B, K] output of kAuto is a classifier
};

// The model flags of a job (path, default: the bundled sample model; device, precision, threads, output
// key, mean, std) for the rank with `local_rank`.
ModelOptions modelOptionsFor(const JobOptions& job, int local_rank);

struct ModelProbe {
  int input_channels = 0;   // what the model takes
  int output_channels = 0;  // segment: channels C; classify: classes K; embed: features D
  Scale scale;              // output size / window size (segment)
  ModelTask task = ModelTask::kSegment;
  bool perWindow() const { return task == ModelTask::kClassify || task == ModelTask::kEmbed; }
};

// The task of a model whose output for one window has `sizes`, when `requested` (--task): NCHW maps are
// segment; [1, D] vectors (or [1, D, 1, 1] when classify or embed is asked for) are classify when asked,
// or when auto and the outputs are activated (softmax, sigmoid) or classes are named, else embed. Throws
// ModelError naming `path`, the shape and the --task choices for any other shape or a mismatch.
ModelTask resolveTask(ModelTask requested, const std::vector<int64_t>& sizes, Activation activation,
                      bool classes_named, const std::string& path);

// LibTorch's CPU allocator for tiler's processes: tensors of kMinBlockBytes and more come from mapped blocks
// that are kept for reuse (at most as many bytes as were ever live at once, or `min_cached_bytes`), smaller
// ones from LibTorch's default allocator. A forward then reuses the last forward's blocks without faulting
// their pages in again, and no heap high-water mark stays resident. Thread safe.
class LargeBlockCache final : public c10::Allocator {
 public:
  static constexpr size_t kMinBlockBytes = 1 << 20;
  explicit LargeBlockCache(size_t min_cached_bytes);
  ~LargeBlockCache() override;
  // The process's cache, the one installLargeBlockCache() installs.
  static LargeBlockCache& instance();

  // LibTorch 1.13 declares allocate() const, 2.x not: one of the two overrides, the other is never called.
  c10::DataPtr allocate(size_t n) const { return take(n); }
  c10::DataPtr allocate(size_t n) { return take(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &LargeBlockCache::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const;  // virtual in LibTorch 2.x
  // Bytes held in free blocks.
  size_t cachedBytes() const;
  // Block size for a request of `n` bytes (64 KiB granules).
  static size_t blockSize(size_t n);

 private:
  c10::DataPtr take(size_t n) const;
  void markInUse(void* block, size_t size) const;  // caller holds mutex_
  static void release(void* block);                // the blocks of instance() only
  void give(void* block) const;

  c10::Allocator* fallback_;  // LibTorch's default CPU allocator (not owned)
  size_t min_cached_bytes_;
  mutable std::mutex mutex_;
  struct FreeBlock {
    void* block;
    uint64_t freed;  // order of freeing, for eviction
  };
  mutable std::multimap<size_t, FreeBlock> free_;  // size -> block, guarded by mutex_
  mutable uint64_t frees_ = 0;                     // guarded by mutex_
  mutable std::map<void*, size_t> live_;           // block -> size, guarded by mutex_
  mutable size_t cached_bytes_ = 0, in_use_bytes_ = 0, peak_in_use_bytes_ = 0;  // guarded by mutex_
};

// Installs LargeBlockCache as LibTorch's CPU allocator and gives glibc one arena (unless GLIBC_TUNABLES is
// set), once per process. ModelRunner calls it; infer and finetune call it first, before threads make arenas.
void installLargeBlockCache();

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
  // Seconds per window of zero windows of the probed size through forward(), one window twice, then batches
  // of `batch`: on the CPU, CPU seconds of one intra-op thread (what the machine's other load does not
  // change); on a GPU, wall seconds to the result. The fastest of up to eight runs, stopping at the first
  // under `enough`, at the second window alone if over twice it, or at a run over twice it that took
  // 100 ms (past the first runs' one-time cost).
  double secondsPerWindow(int64_t window_w, int64_t window_h, int64_t batch, double enough);
  // batch: float32 [B,C,H,W] raw values on the CPU; scales: float32 [B]. Returns float32 [B,C',H',W'],
  // activation applied, computed under InferenceMode.
  torch::Tensor forward(const torch::Tensor& batch, const torch::Tensor& scales);
  // The pieces of forward() that training reuses with autograd on: normalisation onto the device (NCHW), and
  // the module under autocast with its output tensor picked and cast to float32.
  torch::Tensor normalize(const torch::Tensor& batch, const torch::Tensor& scales) const;
  torch::Tensor apply(const torch::Tensor& nchw);
  const torch::Device& device() const { return device_; }
  // Waits for what this thread queued on the model's device (its current stream); nothing on the CPU.
  void synchronize() const;
  Precision precision() const { return precision_; }
  // "torchscript" or "pt2".
  const char* runtimeName() const { return runtime_->name(); }
  // The TorchScript module, for training; a ConfigError for a .pt2 package (compiled code).
  torch::jit::Module& module();
  // A copy of this probed runner with its own parameters, for another thread.
  std::unique_ptr<ModelRunner> replicate() const;

 private:
  ModelRunner(const ModelRunner& other, std::unique_ptr<ModelRuntime> runtime);
  torch::Tensor extractTensor(const c10::IValue& out) const;

  ModelOptions options_;
  torch::Device device_;
  Precision precision_;
  // The model's device made current on the thread that made the runner (restored when it goes): CUDA calls
  // that take the current device (events, pinned memory, cuBLAS handles) then use this rank's GPU, not GPU 0.
  c10::DeviceGuard current_device_;
  std::unique_ptr<ModelRuntime> runtime_;
  ModelProbe probe_;
  torch::Tensor mean_, inv_std_;  // [1,C,1,1] on device, or undefined
};

// Runs jobs on `layout.replicas` threads, each with the model's device current; a free thread takes the
// oldest job. On the CPU each thread has a replica of the probed model (the first is `model` itself); on a
// GPU they all run `model`, each on a stream of its own (made current for its jobs: a job ends with
// synchronize()). Thread safe. The destructor drops jobs not started (their futures report a broken promise),
// lets running ones finish and joins; jobs must not outlive what they capture.
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

  std::vector<std::unique_ptr<ModelRunner>> copies_;  // CPU replicas 1..R-1 (owned)
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void(ModelRunner&)>> jobs_;  // guarded by mutex_
  bool stopping_ = false;                               // guarded by mutex_
  std::vector<std::thread> threads_;                    // last: they use the members above
};

}  // namespace tiler
