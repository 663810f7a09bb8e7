#include "tiler/infer/pipeline.hpp"

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/core/fault.hpp"
#include "tiler/core/output_kinds.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/core/sampler.hpp"
#include "tiler/core/version.hpp"
#include "tiler/ctrun/launcher.hpp"
#include "tiler/dist/dist.hpp"
#include "tiler/dist/exchange.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/dist/report.hpp"
#include "tiler/dist/session.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/model/model.hpp"
#include "tiler/stitch/outputs.hpp"
#include "tiler/tasks/heads.hpp"
#include "tiler/tasks/registry.hpp"
#include "tiler/writers/blend.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace tiler {
namespace {

// Where start-up goes (TILER_LOG=debug): the first step waits for all of it.
void startupMark(const char* what) {
  if (!spdlog::should_log(spdlog::level::debug)) return;  // no read of /proc/self/stat otherwise
  spdlog::debug("start-up: {} at {:.2f} s", what, secondsSinceProcessStart());
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Reading a window and stitching and writing its predictions take about 15 ns per window pixel of one
// core (null model, 8192 px RGB tiled deflate TIFF, 2 channels out: 0.36 ms read + 0.57 ms output per 256 px
// window). On 2 cores a null model (1x1 convolution, 0.4-2 ms per 256 px window on one thread) runs 1.56x
// faster as one replica of one thread than as two replicas of one thread, and the sample UNet (33 ms) 1.41x
// faster as two: the bar sits between the two (8 ms at 256 px), far from both. A per-window model's output
// (a vector) costs next to nothing, so its bar is 8x the read alone (6 ns a pixel, 3 ms at 256 px): the
// bundled encoder (7 ms) under the map bar ran as one replica of one thread, 0.51x the windows/s of two.
double lightModelSeconds(const GridSpec& spec, bool per_window) {
  return 8 * (per_window ? 6e-9 : 15e-9) * double(spec.window_w) * double(spec.window_h);
}

// A window's forward cost is timed at this batch at most: as much as at any larger batch, without its memory.
constexpr int kTimingBatch = 64;

// Threads past what can be busy only cost memory (--write_threads 100000 took 3.7 GB and aborted): a flag's
// count is capped at 4 a CPU this rank may use and at `useful`, with a warning.
int usefulThreads(const char* flag, int requested, int useful) {
  const int cap = std::max(1, std::min(useful, 4 * usableCpus()));
  if (requested <= cap) return requested;
  spdlog::warn("{} {}: capped at {} (4 threads a usable CPU, and no more than can be busy)", flag, requested,
               cap);
  return cap;
}

// --save's kinds, checked against `requested` (--task) when it is given; a task no output shape says (detect,
// instances) becomes `requested` when the kinds say it.
std::vector<std::string> saveKindsOf(const std::string& save, ModelTask& requested) {
  std::vector<std::string> kinds;
  const std::string bad_save = "--save takes " + saveKindsText() + ", comma-separated; got '" + save + "'";
  // "" and "labels," name nothing (or end in nothing), which getline would not return.
  TILER_CHECK(!save.empty() && save.back() != ',', ConfigError, bad_save);
  std::stringstream ss(save);
  std::string part;
  while (std::getline(ss, part, ',')) {
    TILER_CHECK(taskOfOutputKind(part) != ModelTask::kAuto, ConfigError, bad_save);
    TILER_CHECK(requested == ModelTask::kAuto || taskWrites(requested, part), ConfigError,
                "--save " << part << " is an output of --task " << taskName(taskOfOutputKind(part))
                          << ", not of --task " << taskName(requested));
    if (std::find(kinds.begin(), kinds.end(), part) == kinds.end()) kinds.push_back(part);
  }
  // The first task that writes every kind asked for (objects: detect, unless --task instances says so).
  ModelTask task = requested;
  for (const Task* t : allTasks())
    if (task == ModelTask::kAuto && std::all_of(kinds.begin(), kinds.end(), [t](const std::string& kind) {
          return taskWrites(t->id(), kind);
        }))
      task = t->id();
  TILER_CHECK(task != ModelTask::kAuto, ConfigError,
              "--save " << save << " mixes the outputs of two tasks ("
                        << taskName(taskOfOutputKind(kinds.front())) << " and "
                        << taskName(taskOfOutputKind(kinds.back())) << ")");
  // No output shape says "boxes" or "instances" for sure: the outputs asked for say it.
  if (task != ModelTask::kAuto && !taskOf(task).claimedByShape()) requested = task;
  return kinds;
}

class InferJob {
 public:
  explicit InferJob(InferOptions o) : o_(std::move(o)) {}
  int run();

 private:
  // The phases of run(), in order.
  void validateOptions();
  void parseSaveKinds();  // --save's kinds, checked against --task when it is given
  void settleTask();      // after the probe: the task, its outputs and (per window) the overlap
  // A head of a model with several outputs (--heads): its own task, flags and outputs, and where its values
  // lie in each window's prediction.
  struct JobHead {
    HeadSpec spec;
    ModelTask task = ModelTask::kAuto;  // its own, or --task
    Activation activation = Activation::kNone;
    std::vector<ClassInfo> classes;
    SampleType probs_type = SampleType::kF32;
    std::vector<std::string> kinds;  // its --save, or its task's defaults
    ModelProbe probe;
    int64_t offset = 0, values = 0;  // its values in a window's prediction
  };
  void parseHeadFlags();  // --heads and --head_opt, each head's flags parsed
  void settleHeads();     // after the probe: each head's task and outputs, one grid for all
  TaskFlags headFlags(const JobHead& head) const;
  std::vector<std::string> catalogKinds() const;  // the outputs' kinds (a head's: headKind)
  std::string reportedTask() const;               // the task, or the heads' NAME:TASK,...
  void loadModel();  // the model, its probe, the forward layout and the read threads
  void connect();    // the process group, on the model's device
  // The images and their windows, the same on every rank (or every rank stops with the reason).
  void planImages();
  // The report (rank 0's) is none of the files the run reads (inputs, the model, the mask), its outputs or
  // its lock: a ConfigError naming the clash. The catalog checked the outputs against what is read.
  void checkReportPath() const;
  // This rank's share of the windows (parts of every row) and the images it writes.
  struct Deal {
    std::vector<SampleSlot> slots;
    int64_t steps = 0;
  };
  Deal dealWindows();
  int runSteps(Deal deal);

  OutputOptions outputOptions() const;
  TaskFlags taskFlags() const;  // what the task checks and its outputs are made from
  LoaderOptions loaderOptions() const;
  StepExchange& exchange() { return session_->exchange(); }
  int rank() const { return session_->rank(); }
  int worldSize() const { return session_->world().world_size; }
  // A step's batch on its way through a model replica. A fatal message ends every rank at that step.
  struct ForwardedBatch {
    std::optional<WindowBatch> batch;
    torch::Tensor preds;
    double forward_seconds = 0;
    std::optional<std::string> fatal;
  };
  // Reads the next step's batch (main thread, in step order) and queues its forward on a free replica.
  std::future<ForwardedBatch> startStep(WindowLoader& loader, ForwardPool& pool);
  // A batch's predictions on the device of the exchange (the CPU but for NCCL), contiguous.
  torch::Tensor toCommDevice(const torch::Tensor& preds) const;
  // One step, once its forward is done: share its status and window list, gather predictions to their images'
  // owners. Steps after it are already running on the other replicas, so the exchange overlaps their
  // forwards.
  void runStep(int64_t step, int64_t steps, ForwardedBatch forwarded, WindowLoader& loader,
               OutputStage& outputs);
  // Every rank's predictions of a step to the owners of their images: one gather per owner that has windows
  // in the step. Returns this rank's slots (preds undefined when it owns none of the step's windows).
  StepResult routePredictions(const std::vector<StepSlots>& every_rank, const torch::Tensor& preds,
                              const std::string& what);
  // Object tasks: each of the batch's windows' objects (instances) or boxes (detect) that the window keeps,
  // found on this rank (which ran them), as the record its image's owner takes (slot.record_bytes set); an
  // output that is no map of ids, or a box that is no box, fails its image.
  std::vector<std::string> windowRecords(WindowBatch& batch, const torch::Tensor& preds);
  // Reports the batch's failures from `first` on (each fails its image on every rank); with --on_error
  // abort, the first of them ends the job.
  void reportFailures(const WindowBatch& batch, size_t first);
  // The records of a step to the owners of their images, one gather per owner as for predictions, each
  // rank's records end to end and padded to the most bytes any rank sends that owner.
  StepResult routeRecords(const std::vector<StepSlots>& every_rank, const std::vector<std::string>& records,
                          const std::string& what);
  torch::Tensor forward(ModelRunner& model, WindowBatch& batch, int64_t fault_slot);
  std::vector<int64_t> predictionSizes(int64_t windows) const;  // a forward's output for this many windows
  torch::Tensor zeroPredictions() const;                        // a batch's, on the exchange's device
  // Slots [first, first + count) of `batch` into `out`: out of memory splits them in halves down to one.
  void forwardSlots(ModelRunner& model, WindowBatch& batch, int64_t first, int64_t count, int64_t fault_slot,
                    torch::Tensor& out);
  // After the last of `steps`: every output stage drained, the report written.
  int finishRun(OutputStage& outputs, int64_t steps);
  RunSummary runSummary() const;  // the report's run fields, by name

  InferOptions o_;
  std::unique_ptr<RankSession> session_;  // from run() on
  GridSpec spec_;
  PadMode pad_ = PadMode::kConstant;
  StitchOptions stitch_;
  MaskSpec mask_;
  std::vector<int> channels_;  // --channels
  ResolutionSpec resolution_;
  std::vector<ClassInfo> classes_;  // --classes
  Activation activation_ = Activation::kNone;
  Tta tta_ = Tta::kNone;
  ModelTask task_ = ModelTask::kAuto;       // --task; probe_.task says what it became
  std::vector<std::string> save_kinds_;     // --save, or the task's default
  bool abort_on_error_ = false;             // --on_error abort
  std::optional<Compression> compression_;  // unset: each output's default
  SampleType probs_type_ = SampleType::kF32;
  FaultHooks faults_;  // TILER_FAULT, this rank's
  std::unique_ptr<ModelRunner> model_;
  ForwardLayout layout_;
  int read_threads_ = 1;
  int64_t shard_run_ = 1;          // the most windows one rank takes in a row (RowDeal::longest_part)
  std::string cpu_blas_;           // cpuBlasName(), asked once
  bool stitch_on_device_ = false;  // blend on the model's device (--stitch)
  ModelProbe probe_;
  std::vector<JobHead> heads_;  // --heads; empty: one output
  // Object tasks (instances, detect): what this rank sends of a window's output: the record of what it keeps.
  RecordMaker record_of_;
  WindowCatalog catalog_;
  std::set<int> failed_;                 // images this rank knows to have failed (main thread)
  std::vector<int> owners_;              // the rank that stitches and writes each image (assignOwners)
  std::atomic<bool> oom_logged_{false};  // replica threads
  RankStats stats_;
};

void InferJob::validateOptions() {
  spec_ = parseGridSpec(o_.window, o_.overlap);
  pad_ = parsePadMode(o_.pad);
  stitch_.mode = parseBlendMode(o_.blend);
  stitch_.sigma_scale = o_.sigma_scale;
  if (stitch_.mode == BlendMode::kGaussian) gaussianImportance(4, 4, o_.sigma_scale);  // validates sigma
  activation_ = parseActivation(o_.activation);
  tta_ = parseTta(o_.tta);
  TILER_CHECK(tta_ != Tta::kD4 || spec_.window_w == spec_.window_h, ConfigError,
              "--tta d4 rotates windows, so they must be square; got --window " << o_.window);
  TILER_CHECK(o_.batch_size >= 1, ConfigError, "--batch_size must be >= 1");
  TILER_CHECK(o_.prefetch >= 1, ConfigError, "--prefetch must be >= 1");
  TILER_CHECK(
      o_.read_threads >= 0, ConfigError,
      "--read_threads must be >= 0 (0: the CPUs the forward leaves, up to " << kMaxAutoReadThreads << ")");
  TILER_CHECK(o_.shard_buffer >= 0, ConfigError,
              "--shard_buffer must be >= 0 (MiB; 0: one batch a rank per piece of a row)");
  checkTimeout(o_.timeout);
  TILER_CHECK(o_.threads >= 0, ConfigError,
              "--threads must be >= 0 (0: LibTorch's default); got " << o_.threads);
  TILER_CHECK(std::isfinite(o_.scale) && o_.scale >= 0, ConfigError,
              "--scale must be a finite number >= 0 (0: by sample type); got " << o_.scale);
  TILER_CHECK(o_.on_error == "skip" || o_.on_error == "abort", ConfigError,
              "--on_error must be skip or abort");
  abort_on_error_ = o_.on_error == "abort";
  TILER_CHECK(o_.format == "tif" || o_.format == "png", ConfigError, "--format must be tif or png");
  TILER_CHECK(!(o_.resume && o_.overwrite), ConfigError, "--resume and --overwrite exclude each other");
  if (!o_.compression.empty()) {
    compression_ = parseCompression(o_.compression);
    checkCompression(*compression_);
  }
  probs_type_ = parseProbsType(o_.probs_dtype);
  TILER_CHECK(o_.stitch == "auto" || o_.stitch == "host" || o_.stitch == "device", ConfigError,
              "--stitch must be auto, host or device; got '" << o_.stitch << "'");
  TILER_CHECK(o_.write_threads >= 0, ConfigError,
              "--write_threads must be >= 0 (0: the CPUs this rank may use)");
  TILER_CHECK(o_.edge == "auto" || o_.edge == "lattice" || o_.edge == "shift", ConfigError,
              "--edge must be auto, lattice or shift; got '" << o_.edge << "'");
  o_.read_threads = usefulThreads("--read_threads", o_.read_threads, o_.batch_size);
  o_.write_threads = usefulThreads("--write_threads", o_.write_threads, std::numeric_limits<int>::max());
  task_ = parseTask(o_.task);
  parseSaveKinds();
  parseHeadFlags();
  mask_ = parseMaskSpec(o_.mask, o_.mask_fraction, o_.roi, o_.roi_class);
  channels_ = parseChannelList(o_.channels);
  TILER_CHECK((o_.level >= 0) + (o_.mpp > 0) + (o_.magnification > 0) <= 1, ConfigError,
              "--level, --mpp and --magnification choose the same thing; give at most one");
  TILER_CHECK(o_.mpp >= 0 && o_.magnification >= 0 && o_.input_mpp >= 0, ConfigError,
              "--mpp, --magnification and --input_mpp must be positive");
  resolution_ = ResolutionSpec{o_.level, o_.mpp, o_.magnification, o_.input_mpp};
  classes_ = parseClasses(o_.classes);
  TILER_CHECK(o_.simplify >= 0, ConfigError, "--simplify must be >= 0");
  TILER_CHECK(o_.replicas >= 0, ConfigError,
              "--replicas must be >= 0 (0: one per CPU core, up to " << kMaxAutoReplicas << ")");
  if (o_.inputs.empty()) o_.inputs = {bundledSamplesDir() + "/images"};
  if (o_.report.empty()) o_.report = (fs::path(o_.output_dir) / "report.json").string();
}

void InferJob::parseSaveKinds() {
  save_kinds_.clear();
  if (o_.save) save_kinds_ = saveKindsOf(*o_.save, task_);  // else the task's default, once it is known
}

void InferJob::settleTask() {
  const Task& task = taskOf(probe_.task);
  if (save_kinds_.empty()) save_kinds_ = task.defaultKinds();
  for (const std::string& kind : save_kinds_)
    if (*findOutputKind(kind)->feature) requireFeature(findOutputKind(kind)->feature, "--save " + kind);
  task.settle(probe_, taskFlags(), spec_);
}

TaskFlags InferJob::taskFlags() const {
  TaskFlags f;
  f.model = o_.model;
  f.save = o_.save;
  f.kinds = save_kinds_;
  f.edge = o_.edge;
  f.overlap_given = o_.overlap_given;
  f.nms = o_.nms;
  f.tta = tta_;
  f.activation = activation_;
  f.activation_name = o_.activation;
  f.classes = classes_;
  const InferOptions defaults;
  const std::pair<const char*, bool> map_flags[] = {{"--blend", o_.blend != defaults.blend},
                                                    {"--format", o_.format != defaults.format},
                                                    {"--probs_dtype", o_.probs_dtype != defaults.probs_dtype},
                                                    {"--stitch", o_.stitch != defaults.stitch}};
  for (const auto& [flag, given] : map_flags)
    if (given) f.map_flags.push_back(flag);
  f.encoder = o_.encoder_name.empty() ? fs::path(o_.model).stem().string() : o_.encoder_name;
  return f;
}

void InferJob::parseHeadFlags() {
  for (const HeadSpec& spec : parseHeads(o_.heads, o_.head_opt)) {
    JobHead head;
    head.spec = spec;
    head.task = spec.task.value_or(task_);
    head.activation = spec.activation ? parseActivation(*spec.activation) : activation_;
    head.classes = spec.classes ? parseClasses(*spec.classes) : classes_;
    head.probs_type = spec.probs_dtype ? parseProbsType(*spec.probs_dtype) : probs_type_;
    if (spec.save || o_.save) head.kinds = saveKindsOf(spec.save.value_or(o_.save.value_or("")), head.task);
    heads_.push_back(head);
  }
  TILER_CHECK(heads_.empty() || o_.output_key.empty(), ConfigError,
              "--output_key picks one output, --heads several: give one of them");
}

void InferJob::settleHeads() {
  const std::vector<ModelProbe>& probes = model_->headProbes();
  int64_t offset = 0;
  for (size_t h = 0; h < heads_.size(); ++h) {
    JobHead& head = heads_[h];
    const JobHead& first = heads_.front();
    head.probe = probes[h];
    head.task = head.probe.task;
    const Task& task = taskOf(head.task);
    // Records are made where a window ran, from its whole prediction, and routed on their own.
    TILER_CHECK(task.recordMaker(TaskOutputs{}) == nullptr, ConfigError,
                "--heads: head '" << head.spec.name << "' is --task " << task.name() << ", whose windows "
                                  << "send records, not predictions: run it alone (--output_key "
                                  << head.spec.name << ")");
    TILER_CHECK(head.probe.perWindow() == first.probe.perWindow(), ConfigError,
                "--heads mixes a stitched map and one vector a window (head '"
                    << first.spec.name << "': --task " << taskName(first.task) << ", head '" << head.spec.name
                    << "': --task " << task.name() << "): a map takes MONAI's grid, a vector the patch "
                    << "lattice, and one run lays one grid: run them as two jobs (--output_key)");
    TILER_CHECK(head.probe.scale == first.probe.scale, ConfigError,
                "--heads: head '" << head.spec.name << "' gives maps at " << head.probe.scale.value()
                                  << "x the window, head '" << first.spec.name << "' at "
                                  << first.probe.scale.value() << "x: the heads of one run share one scale");
    if (head.kinds.empty()) head.kinds = task.defaultKinds();
    for (const std::string& kind : head.kinds)
      if (*findOutputKind(kind)->feature) requireFeature(findOutputKind(kind)->feature, "--save " + kind);
    task.settle(head.probe, headFlags(head), spec_);
    head.offset = offset;
    head.values = 1;
    for (int64_t size : task.predictionSizes(head.probe, spec_, 1)) head.values *= size;
    offset += head.values;
  }
}

TaskFlags InferJob::headFlags(const JobHead& head) const {
  TaskFlags f = taskFlags();
  f.save = head.spec.save ? head.spec.save : o_.save;
  f.kinds = head.kinds;
  f.activation = head.activation;
  f.activation_name = head.spec.activation.value_or(o_.activation);
  f.classes = head.classes;
  f.head = head.spec.name;
  return f;
}

std::string InferJob::reportedTask() const {
  if (heads_.empty()) return taskName(probe_.task);
  std::string text;
  for (const JobHead& head : heads_)
    text += (text.empty() ? "" : ",") + head.spec.name + ":" + taskName(head.task);
  return text;
}

std::vector<std::string> InferJob::catalogKinds() const {
  if (heads_.empty()) return save_kinds_;
  std::vector<std::string> kinds;
  for (const JobHead& head : heads_)
    for (const std::string& kind : head.kinds) kinds.push_back(headKind(head.spec.name, kind));
  return kinds;
}

OutputOptions InferJob::outputOptions() const {
  OutputOptions oo;
  oo.format = o_.format;
  oo.compression = compression_;
  oo.classes = probe_.output_channels;
  oo.scale = probe_.scale;
  oo.stitch = stitch_;
  oo.label_threshold = activation_ == Activation::kSigmoid ? 0.5f : 0.0f;
  oo.abort_on_error = abort_on_error_;
  oo.pyramid = o_.pyramid;
  oo.simplify = o_.simplify;
  oo.classes_named = classes_;
  oo.probs_type = probs_type_;
  oo.write_threads = o_.write_threads > 0 ? o_.write_threads : usableCpus();
  if (compression_) oo.write_threads = compressionThreads(*compression_, oo.write_threads);
  oo.owners = owners_;
  oo.rank = session_->rank();
  oo.stitched_window = faults_.stitched_window;
  if (stitch_on_device_) oo.stitch_device = model_->device();
  oo.before_device_stitcher = faults_.before_device_stitcher;
  if (heads_.empty()) oo.parts = {{consumersFor(probe_.task, TaskOutputs{oo, probe_, spec_, taskFlags()})}};
  for (const JobHead& head : heads_) {
    OutputOptions part = oo;
    part.classes = head.probe.output_channels;
    part.classes_named = head.classes;
    part.probs_type = head.probs_type;
    part.label_threshold = head.activation == Activation::kSigmoid ? 0.5f : 0.0f;
    std::vector<int64_t> sizes = taskOf(head.task).predictionSizes(head.probe, spec_, 1);
    sizes.erase(sizes.begin());
    oo.parts.push_back(
        {consumersFor(head.task, TaskOutputs{part, head.probe, spec_, headFlags(head)}), head.offset, sizes});
  }
  return oo;
}

LoaderOptions InferJob::loaderOptions() const {
  LoaderOptions lo;
  lo.batch_size = o_.batch_size;
  lo.input_channels = probe_.input_channels;
  lo.pad = pad_;
  lo.cval = o_.cval;
  lo.depth = size_t(o_.prefetch);
  lo.read_threads = read_threads_;
  lo.pinned = model_->device().is_cuda();
  lo.bytes = inputAsBytes(catalog_);
  lo.device = model_->device();
  lo.before_read = faults_.before_read;
  return lo;
}

std::future<InferJob::ForwardedBatch> InferJob::startStep(WindowLoader& loader, ForwardPool& pool) {
  ForwardedBatch f;
  f.fatal = captureFailure([&] {
    f.batch = loader.next();
    TILER_CHECK(f.batch.has_value(), DistError, "the loader stopped early");
  });
  // TILER_FAULT in the forward: the slot holding this rank's K-th window.
  const int64_t fault_slot = f.batch && faults_.forward_slot ? faults_.forward_slot(f.batch->slots) : -1;
  if (f.fatal) {
    std::promise<ForwardedBatch> ready;
    ready.set_value(std::move(f));
    return ready.get_future();
  }
  return pool.submit<ForwardedBatch>([this, f, fault_slot](ModelRunner& model) mutable {
    f.fatal = captureFailure([&] {
      const auto t0 = Clock::now();
      f.preds = forward(model, *f.batch, fault_slot);
      // Kernels and copies run asynchronously on this thread's stream: the predictions are whole after this.
      model.synchronize();
      f.forward_seconds = secondsSince(t0);
    });
    return f;
  });
}

torch::Tensor InferJob::forward(ModelRunner& model, WindowBatch& batch, int64_t fault_slot) {
  torch::Tensor out;  // the forward's own output when one forward covers the batch, else zeros filled in
  if (batch.valid > 0) forwardSlots(model, batch, 0, o_.batch_size, fault_slot, out);
  return out.defined() ? out : zeroPredictions();
}

torch::Tensor InferJob::toCommDevice(const torch::Tensor& preds) const {
  const torch::Device to = stitch_on_device_ ? preds.device() : session_->dist().commDevice();
  if (preds.device() == to) return preds.contiguous();
  // To a CPU from a GPU: into page-locked memory, queued on the stream (the forward's synchronize() waits).
  // A pageable copy stops the stream and goes through the driver's staging buffer: 3.8 ms of a sample UNet
  // batch of 64 on an H200, 40% of its forward.
  auto host = torch::empty(preds.sizes(), preds.options().device(to).pinned_memory(to.is_cpu()));
  host.copy_(preds, /*non_blocking=*/true);
  return host;
}

torch::Tensor InferJob::zeroPredictions() const {
  return torch::zeros(
      predictionSizes(o_.batch_size),
      torch::TensorOptions(stitch_on_device_ ? model_->device() : session_->dist().commDevice())
          .dtype(predictionType(probe_.task)));
}

std::vector<int64_t> InferJob::predictionSizes(int64_t windows) const {
  if (!heads_.empty()) return {windows, heads_.back().offset + heads_.back().values};
  return taskOf(probe_.task).predictionSizes(probe_, spec_, windows);
}

void InferJob::forwardSlots(ModelRunner& model, WindowBatch& batch, int64_t first, int64_t count,
                            int64_t fault_slot, torch::Tensor& out) {
  StepSlots& slots = batch.slots;
  bool any = false;
  for (int64_t j = first; j < first + count; ++j) any = any || slots[size_t(j)].ok();
  if (!any) return;
  std::string message;
  try {
    if (fault_slot >= first && fault_slot < first + count) faults_.in_forward();
    auto preds = model.forward(batch.pixels.narrow(0, first, count), batch.scales.narrow(0, first, count));
    TILER_CHECK(preds.sizes() == torch::IntArrayRef(predictionSizes(count)), ModelError,
                "the model's output is " << preds.sizes() << " for " << count << " windows, not "
                                         << torch::IntArrayRef(predictionSizes(count))
                                         << " as for the first");
    if (!out.defined() && count == o_.batch_size) {
      out = toCommDevice(preds);
      return;
    }
    out.narrow(0, first, count).copy_(preds);
    return;
  } catch (const std::exception& e) {
    if (count > 1 && isOutOfMemory(e)) {
      // Out of memory: the same windows in halves, down to one at a time; the outputs do not change.
      if (!oom_logged_.exchange(true))
        spdlog::warn("[rank {}] out of memory in a forward of {} windows: retrying in halves", rank(), count);
      const int64_t half = count / 2;
      if (!out.defined()) out = zeroPredictions();
      forwardSlots(model, batch, first, half, fault_slot, out);
      forwardSlots(model, batch, first + half, count - half, fault_slot, out);
      return;
    }
    message = describeException(std::current_exception());
  } catch (...) {
    message = describeException(std::current_exception());
  }
  // The images of these slots fail, wherever their other windows are; the run goes on.
  std::set<int> images;
  for (int64_t j = first; j < first + count; ++j) {
    WindowSlot& slot = slots[size_t(j)];
    if (!slot.ok()) continue;
    slot.status = SlotStatus::kFailed;
    if (images.insert(slot.image).second)
      batch.failures.emplace_back(slot.image, errorRankPrefix() + "'" + catalog_.image(slot.image).input +
                                                  "': the model's forward failed: " + message);
  }
}

void InferJob::reportFailures(const WindowBatch& batch, size_t first) {
  for (size_t i = first; i < batch.failures.size(); ++i)
    exchange().reportImageFailure(batch.failures[i].first, batch.failures[i].second);
  if (abort_on_error_ && batch.failures.size() > first)
    throw IoError(batch.failures[first].second + " (--on_error abort)");
}

void InferJob::runStep(int64_t step, int64_t steps, ForwardedBatch forwarded, WindowLoader& loader,
                       OutputStage& outputs) {
  const int64_t B = o_.batch_size;
  const std::string what = "step " + std::to_string(step) + " of " + std::to_string(steps);
  exchange().markStep(step);
  std::optional<std::string> fatal = forwarded.fatal;
  std::optional<WindowBatch>& batch = forwarded.batch;
  torch::Tensor& preds = forwarded.preds;
  if (!fatal) {
    fatal = captureFailure([&] {
      if (auto e = outputs.error()) throw std::runtime_error(*e);
      stats_.read_seconds += batch->read_seconds;
      stats_.forward_seconds += forwarded.forward_seconds;
      reportFailures(*batch, 0);
    });
  }
  if (!batch || fatal) {
    // Still take part in the step, with an empty window list, so that the status reaches everyone.
    batch = WindowBatch{};
    batch->slots.assign(size_t(B), WindowSlot{});
  }
  std::vector<std::string> records;
  if (record_of_ && !fatal) {
    // Like a read or a forward: a map that is no map of ids fails its image; anything else, every rank.
    fatal = captureFailure([&] {
      const size_t reported = batch->failures.size();
      records = windowRecords(*batch, preds);
      reportFailures(*batch, reported);
    });
  }
  const auto t1 = Clock::now();
  // The window lists carry every rank's status: a fatal error anywhere throws here on every rank.
  const auto every_rank = exchange().shareSlots(batch->slots, fatal, "the window list of " + what);
  StepResult result =
      record_of_ ? routeRecords(every_rank, records, what) : routePredictions(every_rank, preds, what);
  stats_.gather_seconds += secondsSince(t1);
  stats_.windows += batch->valid;
  for (const StepSlots& slots : every_rank) {
    for (const WindowSlot& slot : slots) {
      if (slot.status != SlotStatus::kFailed || !failed_.insert(slot.image).second) continue;
      loader.skipImage(slot.image);
      result.failures.emplace(
          slot.image, exchange().imageFailure(
                          slot.image, "'" + catalog_.image(slot.image).input + "': failed on another rank"));
    }
  }
  outputs.submit(std::move(result));  // a stopped stage says why at the next step
}

std::vector<std::string> InferJob::windowRecords(WindowBatch& batch, const torch::Tensor& preds) {
  std::vector<std::string> records(batch.slots.size());
  if (!preds.defined()) return records;  // every slot failed in the forward
  const torch::Tensor maps = preds.cpu().contiguous();
  std::set<int> failed;
  for (size_t k = 0; k < batch.slots.size(); ++k) {
    WindowSlot& slot = batch.slots[k];
    if (!slot.ok()) continue;
    const auto [image, window] = catalog_.locate(slot.window);
    try {
      records[k] = record_of_(catalog_.image(image), window, maps[int64_t(k)]);
      slot.record_bytes = int64_t(records[k].size());
    } catch (...) {
      slot.status = SlotStatus::kFailed;
      if (failed.insert(slot.image).second)
        batch.failures.emplace_back(slot.image,
                                    errorRankPrefix() + describeException(std::current_exception()));
    }
  }
  return records;
}

StepResult InferJob::routeRecords(const std::vector<StepSlots>& every_rank,
                                  const std::vector<std::string>& records, const std::string& what) {
  const int W = worldSize();
  const auto routes = routeSlots(every_rank, owners_);
  StepResult result;
  for (int owner = 0; owner < W; ++owner) {
    const auto& mine = routes[size_t(owner)];
    int64_t longest = 0;
    bool any = false;
    for (int r = 0; r < W; ++r) {
      int64_t bytes = 0;
      for (int64_t k : mine[size_t(r)]) bytes += every_rank[size_t(r)][size_t(k)].record_bytes;
      longest = std::max(longest, bytes);
      any = any || !mine[size_t(r)].empty();
    }
    if (!any) continue;
    auto part = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kUInt8);
    auto* to = reinterpret_cast<char*>(part.data_ptr<uint8_t>());
    for (int64_t k : mine[size_t(rank())]) {
      const std::string& record = records[size_t(k)];
      std::memcpy(to, record.data(), record.size());
      to += record.size();
    }
    const std::string of = "the objects of " + what + (W > 1 ? " for rank " + std::to_string(owner) : "");
    const auto gathered = exchange().gather(part, owner, of);
    if (owner != rank()) continue;
    const auto* base = reinterpret_cast<const char*>(gathered.data_ptr<uint8_t>());
    for (int r = 0; r < W; ++r) {
      const char* at = base + r * part.size(0);
      for (int64_t k : mine[size_t(r)]) {
        const WindowSlot& slot = every_rank[size_t(r)][size_t(k)];
        result.slots.push_back(slot);
        result.records.emplace_back(at, size_t(slot.record_bytes));
        at += slot.record_bytes;
      }
    }
  }
  return result;
}

StepResult InferJob::routePredictions(const std::vector<StepSlots>& every_rank, const torch::Tensor& preds,
                                      const std::string& what) {
  const int W = worldSize();
  const auto routes = routeSlots(every_rank, owners_);
  std::vector<int64_t> ok(size_t(W), 0);
  for (int r = 0; r < W; ++r)
    for (const WindowSlot& slot : every_rank[size_t(r)]) ok[size_t(r)] += slot.ok();
  StepResult result;
  for (int owner = 0; owner < W; ++owner) {
    const auto& mine = routes[size_t(owner)];
    size_t most = 0;
    bool everything = true;  // every rank's windows of the step go to this owner
    for (int r = 0; r < W; ++r) {
      most = std::max(most, mine[size_t(r)].size());
      everything = everything && int64_t(mine[size_t(r)].size()) == ok[size_t(r)];
    }
    if (most == 0) continue;
    const std::string of = "the predictions of " + what + (W > 1 ? " for rank " + std::to_string(owner) : "");
    const auto& own = mine[size_t(rank())];
    torch::Tensor part;
    if (everything) {
      // The usual step (its windows in images of one owner): the whole batch as it is, no copy.
      part = preds;
    } else {
      // Only this owner's slots, packed in slot order and padded to the most any rank sends.
      std::vector<int64_t> sizes = predictionSizes(int64_t(most));
      part = torch::zeros(sizes, preds.options());
      if (!own.empty()) {
        auto index = torch::tensor(own, torch::kInt64).to(preds.device());
        part.narrow(0, 0, int64_t(own.size())).copy_(preds.index_select(0, index));
      }
    }
    // Stitching on the model's device: the predictions stay there (one rank: no collective at all).
    auto gathered =
        stitch_on_device_ && W == 1 ? part : exchange().gather(part, owner, of, /*stay=*/stitch_on_device_);
    if (owner != rank()) continue;
    // The gathered slots: each rank's part in rank order, padded to the longest part.
    const size_t per_rank = size_t(part.size(0));
    result.slots.assign(per_rank * size_t(W), WindowSlot{});
    for (int r = 0; r < W; ++r) {
      const StepSlots& theirs = every_rank[size_t(r)];
      auto into = result.slots.begin() + std::ptrdiff_t(size_t(r) * per_rank);
      if (everything) {
        std::copy(theirs.begin(), theirs.begin() + std::ptrdiff_t(per_rank), into);
      } else {
        for (int64_t k : mine[size_t(r)]) *into++ = theirs[size_t(k)];
      }
    }
    // One rank: its own tensors, not a copy (8 MB a step for two channels of 16 windows of 256 px).
    result.preds = gathered.contiguous();
  }
  return result;
}

RunSummary InferJob::runSummary() const {
  RunSummary run;
  run.world_size = worldSize();
  run.backend = session_->dist().backendName();
  run.device = model_->device().str();
  run.precision = precisionName(model_->precision());
  run.model = o_.model;
  run.seconds = session_->seconds();
  run.window = spec_;
  run.output_scale = probe_.scale.value();
  run.tta = ttaName(tta_);
  run.replicas = layout_.replicas;
  run.threads = layout_.threads;
  run.read_threads = read_threads_;
  run.shard_run = shard_run_;
  run.cpu_blas = cpu_blas_;
  run.gather = session_->dist().gatherTransport();
  run.task = reportedTask();
  run.feature_dim = probe_.perWindow() ? int64_t(probe_.output_channels) : 0;
  run.runtime = model_->runtimeName();
  run.stitch = stitch_on_device_ ? "device" : "host";
  run.model_card = o_.model_card;
  run.settings_from = o_.settings_from;
  return run;
}

int InferJob::finishRun(OutputStage& outputs, int64_t steps) {
  // Every rank's output stage drains; a failure of one ends every rank here with its message.
  std::string owned;
  auto drained = captureFailure([&] {
    outputs.finish();
    if (auto e = outputs.error()) throw std::runtime_error(*e);
    owned = outputs.ownedResults();
  });
  // Past the last step: an owner still writing its outputs is the rank a timeout from here names.
  exchange().markStep(steps);
  exchange().check(drained, "the end of the output stages");
  stats_.peak_rss_mb = peakRssMegabytes();
  stats_.tiles_decoded = tiffChunksDecoded();
  stats_.write_seconds = outputs.stats().write_seconds;
  stats_.bytes_written = outputs.stats().bytes_written;
  stats_.images_owned = outputs.stats().images_owned;
  auto packed = exchange().allgather(torch::tensor(stats_.pack(), torch::kDouble), "the final statistics");
  const std::vector<std::string> results = exchange().allgatherStrings(owned, "the images' results");
  // Every rank fetched its own windows' bytes of a remote input: rank 0 sums them (remote_bytes_read).
  std::vector<torch::Tensor> fetched;
  if (anyRemoteInput(catalog_))
    fetched =
        exchange().allgather(torch::tensor(fetchedBytesPerImage(catalog_), torch::kDouble), "bytes fetched");
  // Rank 0's verdict (or its fatal error) reaches every rank, so ctrun sees one code from all of them.
  return session_->finish([&] {
    for (int r = 1; r < worldSize(); ++r) OutputStage::applyResults(catalog_, results[size_t(r)]);
    for (const auto& t : fetched)
      addFetchedBytes(catalog_, std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel()));
    std::vector<RankStats> per_rank;
    for (const auto& t : packed)
      per_rank.push_back(
          RankStats::unpack(std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel())));
    const RunSummary run = runSummary();
    nlohmann::json j = inferReport(run, catalog_, per_rank);
    writeJsonAtomically(o_.report, j);
    int failed = 0, ok = 0, skipped = 0;
    for (const auto& e : j["images"]) {
      failed += e["status"] == "error";
      ok += e["status"] == "ok";
      skipped += e["status"] == "skipped";
    }
    spdlog::info("{} image(s) done, {} skipped, {} failed in {:.1f} s ({:.1f} windows/s); report: {}", ok,
                 skipped, failed, run.seconds, j["windows_per_second"].get<double>(), o_.report);
    for (const auto& e : j["images"])
      if (e["status"] == "error") spdlog::error("{}", e["error"].get<std::string>());
    return exitCodeOf(j);
  });
}

int InferJob::run() {
  startupMark("main");
  session_ = std::make_unique<RankSession>(joinWorld());
  startupMark("world joined");
  cpu_blas_ = cpuBlasName();
  validateOptions();
  faults_ = faultHooks(Fault::fromEnvironment(), rank(), [] {
    throw c10::OutOfMemoryError({__func__, __FILE__, uint32_t(__LINE__)},
                                injectedFailure("out of memory in the forward"));
  });
  loadModel();
  connect();
  startupMark("connected");
  planImages();
  startupMark("images planned");
  return runSteps(dealWindows());
}

void InferJob::loadModel() {
  ModelOptions mo = modelOptionsFor(o_, session_->world().local_rank);
  o_.model = mo.path;  // the report names the model that ran
  layout_ = chooseForwardLayout(o_.threads, o_.replicas,
                                resolveDevice(mo.device, session_->world().local_rank).is_cuda(),
                                defaultIntraOpThreads());
  mo.threads = layout_.threads;
  mo.activation = activation_;
  mo.tta = tta_;
  mo.jit_optimize = o_.jit_optimize;
  mo.task = task_;
  mo.classes_named = !classes_.empty();
  for (const JobHead& head : heads_)
    mo.heads.push_back(
        HeadOptions{head.spec.name, head.spec.name, head.task, head.activation, !head.classes.empty()});
  mo.batch_size = o_.batch_size;
  model_ = std::make_unique<ModelRunner>(mo);
  startupMark("model loaded");
  probe_ = model_->probe(spec_.window_w, spec_.window_h);
  startupMark("model probed");
  if (heads_.empty())
    settleTask();
  else
    settleHeads();
  if (o_.threads == 0 && o_.replicas == 0 && model_->device().is_cpu() && layout_.replicas > 1) {
    const double bar = lightModelSeconds(spec_, probe_.perWindow());
    const int timing_batch = std::min(o_.batch_size, kTimingBatch);
    const double per_window = model_->secondsPerWindow(spec_.window_w, spec_.window_h, timing_batch, bar);
    const bool light = per_window < bar;
    spdlog::debug("a window's forward takes {:.2f} ms: {}", per_window * 1e3,
                  light ? "light, one replica of one thread" : "replicas");
    if (light) {
      layout_ = chooseForwardLayout(0, 0, false, defaultIntraOpThreads(), /*light=*/true);
      at::set_num_threads(layout_.threads);
    }
  }
  // The owner's windows of other ranks must arrive on the model's device too: one rank, or ranks that gather
  // on it (NCCL; gloo between CPU ranks); through the host (gloo between GPU ranks) the host stitches.
  stitch_on_device_ = taskOf(probe_.task).stitches() &&
                      (o_.stitch == "device" || (o_.stitch == "auto" && model_->device().is_cuda()));
  read_threads_ =
      chooseReadThreads(o_.read_threads, layout_, model_->device().is_cuda(), defaultIntraOpThreads());
}

void InferJob::connect() {
  DistOptions dopts = distOptionsFor(o_);
  dopts.shared_memory = !o_.no_shared_memory;
  session_->connect(dopts, model_->device());
  if (worldSize() > 1 && session_->dist().commDevice() != model_->device()) stitch_on_device_ = false;
}

void InferJob::planImages() {
  // Setup that one rank can fail alone goes through the exchange, so that every rank stops with its message.
  auto setup = captureFailure([&] {
    if (rank() == 0) session_->lockDirectory(o_.output_dir, "output directory");
    InferCatalogOptions co;
    co.inputs = o_.inputs;
    co.recursive = o_.recursive;
    co.output_dir = o_.output_dir;
    co.format = o_.format;
    co.kinds = catalogKinds();
    co.resume = o_.resume;
    co.overwrite = o_.overwrite;
    co.remove_stale_partials = rank() == 0;
    co.also_read = {o_.model};
    if (mask_.mode == MaskMode::kPath) co.also_read.push_back(mask_.path);
    if (!mask_.roi.empty()) co.also_read.push_back(mask_.roi);
    catalog_ = buildInferCatalog(co, CatalogSpec{spec_, probe_.input_channels, probe_.scale, o_.scale, mask_,
                                                 resolution_, true, channels_});
    if (rank() == 0) checkReportPath();
    if (abort_on_error_) {
      for (const auto& img : catalog_.images())
        TILER_CHECK(img.status != "error", IoError, img.error << " (--on_error abort)");
    }
    // Slots beyond the job's windows would be padding only (--batch_size 100000 for one window asked LibTorch
    // for 78 GB); every rank plans the same windows, so every rank takes the same batch.
    o_.batch_size = int(std::min<int64_t>(o_.batch_size, std::max<int64_t>(1, catalog_.totalWindows())));
    const double batch_gb = double(o_.batch_size) * probe_.input_channels * double(spec_.window_w) *
                            double(spec_.window_h) * double(sizeof(float)) / 1e9;
    const double memory_gb = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) / 1e9;
    TILER_CHECK(batch_gb <= memory_gb / 4, ConfigError,
                "--batch_size " << o_.batch_size << ": one batch of " << probe_.input_channels << "x"
                                << spec_.window_h << "x" << spec_.window_w << " windows takes " << batch_gb
                                << " GB as input alone, over a quarter of this machine's " << memory_gb
                                << " GB (the loader holds several); lower --batch_size");
  });
  // Every rank must hold the same plan, or the shards would not fit together.
  auto agree = torch::tensor({{catalog_.totalWindows(), int64_t(catalog_.plannedImages())}}, torch::kInt64);
  auto plans = exchange().share(agree, setup, "the plan check");
  for (size_t r = 0; r < plans.size(); ++r) {
    TILER_CHECK(torch::equal(plans[r], agree), DistError,
                "rank " << r << " planned " << plans[r][0][0].item<int64_t>() << " windows, rank " << rank()
                        << " planned " << catalog_.totalWindows() << ": the ranks see different inputs");
  }
}

void InferJob::checkReportPath() const {
  PathRoles roles;
  roles.reads(o_.model, "the model");
  if (mask_.mode == MaskMode::kPath) roles.reads(mask_.path, "the mask");
  if (!mask_.roi.empty()) roles.reads(mask_.roi, "the ROI");
  for (const auto& img : catalog_.images()) {
    roles.reads(img.input, "the input");
    for (const auto& [kind, out] : img.outputs) roles.writes(out, "the " + kind + " output");
  }
  roles.writes(DirectoryLock::pathFor(o_.output_dir), "the output directory's lock");
  const std::string clash = roles.claim(o_.report, "--report");
  TILER_CHECK(clash.empty(), ConfigError, clash);
}

InferJob::Deal InferJob::dealWindows() {
  const int64_t B = o_.batch_size;
  // Each rank takes parts of every grid row of windows (they share input tiles), in pieces short enough that
  // the windows of the other ranks' parts, which reach their owner before their turn, fit in --shard_buffer.
  int64_t window_bytes = int64_t(sizeof(float));
  for (int64_t size : predictionSizes(1)) window_bytes *= size;
  window_bytes = std::max<int64_t>(window_bytes, 1);  // a detector without rows ([B, 0, 6]) gives none
  const int64_t early_windows = (int64_t(o_.shard_buffer) << 20) / window_bytes;
  RowDeal deal =
      dealRows(catalog_.rowLengths(), worldSize(), rank(), maxPiece(worldSize(), B, early_windows));
  shard_run_ = deal.longest_part;
  session_->dist().reserveGather(size_t(B * window_bytes));
  // Each image's stitching and writing belong to one rank, balanced by windows (an image with none still
  // weighs one: it is written all the same).
  std::vector<int64_t> weights;
  for (const auto& img : catalog_.images())
    weights.push_back(img.status == "ok" && img.first_window >= 0 ? img.plannedWindows() + 1 : 0);
  owners_ = assignOwners(weights, worldSize());
  const int64_t steps = (int64_t(deal.slots.size()) + B - 1) / B;
  if (rank() == 0) {
    const bool cpu = model_->device().is_cpu();
    spdlog::info(
        "{} image(s), {} windows of {}x{} on {} rank(s), {} step(s) of batch {}, {} {} on {}{}, {} "
        "replica(s) x {} thread(s), {} read thread(s), parts of up to {} window(s) a row per rank",
        catalog_.images().size(), catalog_.totalWindows(), spec_.window_w, spec_.window_h, worldSize(), steps,
        B, session_->dist().backendName(), precisionName(model_->precision()), model_->device().str(),
        cpu ? " with " + cpu_blas_ : "", layout_.replicas, layout_.threads, read_threads_, shard_run_);
    if (cpu && cpu_blas_ == kReferenceBlas)
      spdlog::warn(
          "LibTorch calls the reference BLAS: convolutions lowered to matrix products run up to 1.8x slower "
          "than with OpenBLAS (Debian/Ubuntu: apt install libopenblas0-openmp)");
  }
  return Deal{std::move(deal.slots), steps};
}

int InferJob::runSteps(Deal deal) {
  // Object tasks send only what each window keeps, found where the window ran.
  const OutputOptions oo = outputOptions();
  record_of_ = taskOf(probe_.task).recordMaker(TaskOutputs{oo, probe_, spec_, taskFlags()});
  const int64_t B = o_.batch_size, steps = deal.steps;
  OutputStage outputs(catalog_, oo);
  WindowLoader loader(catalog_, spec_, loaderOptions(), std::move(deal.slots), steps);
  ForwardPool pool(*model_, layout_);
  // Every replica busy and one more batch queued, so that none waits while this thread exchanges.
  const int64_t ahead = pool.replicas() + 1;
  std::deque<std::future<ForwardedBatch>> started;
  Progress progress(catalog_.totalWindows(), "windows", !o_.no_progress && rank() == 0);
  stats_.startup_seconds = secondsSinceProcessStart();
  startupMark("first step");
  // A collective that times out names the ranks behind this one (markStep).
  for (int64_t step = 0; step < steps; ++step) {
    while (int64_t(started.size()) < ahead && step + int64_t(started.size()) < steps)
      started.push_back(startStep(loader, pool));
    ForwardedBatch forwarded = started.front().get();
    started.pop_front();
    runStep(step, steps, std::move(forwarded), loader, outputs);
    progress.update(std::min(catalog_.totalWindows(), (step + 1) * B * worldSize()));
    if (faults_.after_windows) faults_.after_windows(stats_.windows);
  }
  loader.stop();
  return finishRun(outputs, steps);
}

}  // namespace

int runInfer(InferOptions options) {
  installLargeBlockCache();  // before the process group's and the stages' threads exist
  return InferJob(std::move(options)).run();
}

}  // namespace tiler
