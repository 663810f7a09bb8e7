#include "tiler/infer/job.hpp"

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
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
#include "tiler/core/platform.hpp"
#include "tiler/core/sampler.hpp"
#include "tiler/core/version.hpp"
#include "tiler/ctrun/launcher.hpp"
#include "tiler/dist/dist.hpp"
#include "tiler/dist/exchange.hpp"
#include "tiler/dist/image_statistics.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/dist/report.hpp"
#include "tiler/dist/session.hpp"
#include "tiler/infer/forward.hpp"
#include "tiler/infer/plan.hpp"
#include "tiler/infer/routing.hpp"
#include "tiler/infer/summary.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/model/model.hpp"
#include "tiler/model/model_card.hpp"
#include "tiler/stitch/outputs.hpp"
#include "tiler/tasks/heads.hpp"
#include "tiler/tasks/registry.hpp"
#include "tiler/writers/blend.hpp"
#include "tiler/writers/memory_output.hpp"
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

// A model is light when its forward costs less than 8 times what tiler's own work on a window costs a core
// (reading, and for a map stitching and writing; a vector's output costs next to nothing): such a model runs
// faster as one replica of one thread, a heavier one as replicas side by side. The per-pixel costs and the
// runs that placed the bar between the two are in docs/performance.md ("The light-model bar").
double lightModelSeconds(const GridSpec& spec, bool per_window) {
  return 8 * (per_window ? 6e-9 : 15e-9) * double(spec.window_w) * double(spec.window_h);
}

// A window's forward cost is timed at this batch at most: as much as at any larger batch, without its memory.
constexpr int kTimingBatch = 64;

// The main thread's time, lap by lap, each lap added to one part of the critical path (RankStats): the parts
// add up to the time since the first lap began.
class Laps {
 public:
  void start() { last_ = Clock::now(); }
  void lap(double& part) {
    const auto now = Clock::now();
    part += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  Clock::time_point last_ = Clock::now();
};

// Without --threads and --replicas, a CPU rank whose model is not light times one replica of every thread
// (`threads`) against its replicas (`replicas`) on the job's first batches and keeps the faster. Each
// layout's first batches a replica warm it (LibTorch 1.13 profiles and optimises a shape's first forwards),
// the next ones are timed; a job of fewer than kMinTrialShare times the trial's batches is not timed.
constexpr int64_t kTrialWarmBatches = 1, kTrialTimedBatches = 2, kMinTrialShare = 2;

class LayoutTrial {
 public:
  LayoutTrial() = default;
  // One replica of every thread first, then `replicas`; inactive when `steps` is too few.
  LayoutTrial(ForwardLayout replicas, int64_t steps) {
    const ForwardLayout threads{1, replicas.replicas * replicas.threads};
    layouts_ = {threads, replicas};
    int64_t end = 0;
    for (const ForwardLayout& l : layouts_) {
      end += int64_t(l.replicas) * (kTrialWarmBatches + kTrialTimedBatches);
      ends_.push_back(end);
    }
    active_ = replicas.replicas > 1 && steps >= kMinTrialShare * end;
  }
  bool active() const { return active_ && phase_ < layouts_.size(); }
  // The layout to run the trial's steps from `step` on in (the current one until the phase's last step).
  const ForwardLayout& layout() const { return layouts_[phase_]; }
  int64_t phaseEnd() const { return ends_[phase_]; }
  // Step `step`'s batch took `seconds` on its replica; past a phase's last step the next phase begins.
  void record(int64_t step, double seconds) {
    const int64_t begin = phase_ == 0 ? 0 : ends_[phase_ - 1];
    if (step - begin >= int64_t(layouts_[phase_].replicas) * kTrialWarmBatches)
      timed_[phase_].push_back(seconds);
    if (step + 1 == ends_[phase_]) ++phase_;
  }
  // Seconds a batch of the whole rank: a batch's mean seconds over the replicas that run side by side.
  double batchSeconds(size_t k) const {
    double sum = 0;
    for (double t : timed_[k]) sum += t;
    return timed_[k].empty() ? 0.0 : sum / double(timed_[k].size()) / layouts_[k].replicas;
  }
  ForwardLayout faster() const { return batchSeconds(0) < batchSeconds(1) ? layouts_[0] : layouts_[1]; }
  bool measured() const { return active_ && phase_ == layouts_.size(); }
  std::vector<std::pair<std::string, double>> timings(int64_t batch) const {
    std::vector<std::pair<std::string, double>> out;
    for (size_t k = 0; k < layouts_.size(); ++k)
      out.emplace_back(std::to_string(layouts_[k].replicas) + "x" + std::to_string(layouts_[k].threads),
                       batchSeconds(k) / double(batch));
    return out;
  }

 private:
  bool active_ = false;
  size_t phase_ = 0;
  std::vector<ForwardLayout> layouts_;
  std::vector<int64_t> ends_;  // each phase's end step
  std::vector<double> timed_[2];
};

class InferJob {
 public:
  explicit InferJob(InferOptions o) : o_(std::move(o)) {}
  int run();

 private:
  // The phases of run(), in order.
  void settleTask();   // after the probe: the task, its outputs and (per window) the overlap
  void settleHeads();  // after the probe: each head's task and outputs, one grid for all
  std::vector<SavedOutput> catalogOutputs() const;  // the outputs' kinds (a head's: headKind), named
  std::string reportedTask() const;                 // the task, or the heads' NAME:TASK,...
  void loadModel();  // the model, its probe, the forward layout and the read threads
  void connect();    // the process group, on the model's device
  // The images and their windows, the same on every rank (or every rank stops with the reason).
  void planImages();
  // A card's preprocessing chain: each planned image's statistics (when the chain reads any), gathered by
  // one rank and shared with all, and its map of raw values to the model's input (CatalogImage::
  // input_affine), before any window is read.
  void prepareImages();
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
  LoaderOptions loaderOptions() const;
  StepExchange& exchange() { return session_->exchange(); }
  int rank() const { return session_->rank(); }
  int worldSize() const { return session_->world().world_size; }
  // A step's batch on its way through a model replica. A fatal message ends every rank at that step.
  struct ForwardedBatch {
    std::optional<WindowBatch> batch;
    torch::Tensor preds;
    double forward_seconds = 0, normalize_seconds = 0;
    std::optional<std::string> fatal;
  };
  // Reads the next step's batch (main thread, in step order) and queues its forward on a free replica.
  std::future<ForwardedBatch> startStep(WindowLoader& loader, ForwardPool& pool);
  // One step, once its forward is done: share its status and window list, gather predictions to their images'
  // owners. Steps after it are already running on the other replicas, so the exchange overlaps their
  // forwards.
  void runStep(int64_t step, int64_t steps, ForwardedBatch forwarded, WindowLoader& loader,
               OutputStage& outputs);
  RouteContext routeContext();  // this rank's routing, through the step exchange
  // Object tasks: each of the batch's windows' objects (instances) or boxes (detect) that the window keeps,
  // found on this rank (which ran them), as the record its image's owner takes (slot.record_bytes set); an
  // output that is no map of ids, or a box that is no box, fails its image.
  std::vector<std::string> windowRecords(WindowBatch& batch, const torch::Tensor& preds);
  // Reports the batch's failures from `first` on (each fails its image on every rank); with --on_error
  // abort, the first of them ends the job.
  void reportFailures(const WindowBatch& batch, size_t first);
  std::vector<int64_t> predictionSizes(int64_t windows) const;  // a forward's output for this many windows
  // After the last of `steps`: every output stage drained, the report written.
  int finishRun(OutputStage& outputs, int64_t steps);
  RunSummary runSummary() const;  // the report's run fields, by name

  InferOptions o_;
  std::unique_ptr<RankSession> session_;  // from run() on
  InferPlan plan_;                        // the flags, parsed once
  FaultHooks faults_;                     // TILER_FAULT, this rank's
  std::shared_ptr<ModelRunner> model_;    // the caller's too, with InferOptions::load_model
  ForwardLayout layout_;
  int read_threads_ = 1;
  int64_t shard_run_ = 1;          // the most windows one rank takes in a row (RowDeal::longest_part)
  std::string cpu_blas_;           // cpuBlasName(), asked once
  bool stitch_on_device_ = false;  // blend on the model's device (--stitch)
  ModelProbe probe_;
  // Object tasks (instances, detect): what this rank sends of a window's output: the record of what it keeps.
  RecordMaker record_of_;
  WindowCatalog catalog_;
  std::set<int> failed_;                   // images this rank knows to have failed (main thread)
  std::vector<int> owners_;                // the rank that stitches and writes each image (assignOwners)
  std::unique_ptr<BatchForward> forward_;  // from runSteps on (the model's device and the exchange's known)
  RankStats stats_;
  Laps laps_;                    // the main thread's, from the first step on
  bool measure_layout_ = false;  // time the layouts on the first batches (LayoutTrial)
  std::vector<std::pair<std::string, double>> layouts_timed_;
  std::string jit_fallback_;  // why the default --jit_optimize was not kept
};

void InferJob::settleTask() {
  const Task& task = *probe_.task;
  const std::vector<ProcessingStep>& blended = plan_.flags.blended_steps;
  // The output's statistics are a blended map's: a vector a window has no whole image to gather them over.
  TILER_CHECK(blended.empty() || task.stitches(), ConfigError,
              "the model card's outputs[0].postprocessing ("
                  << stepNames(blended) << ") reads the output's "
                  << "statistics over the whole blended map; --task " << task.name() << " gives "
                  << "no map to blend (tiler follows it for --task segment and regress)");
  for (const ProcessingStep& step : blended) {
    for (const auto* list : {&step.gain, &step.offset, &step.threshold})
      TILER_CHECK(list->size() <= 1 || int(list->size()) == probe_.output_channels, ConfigError,
                  "'" << o_.model << "': the card's outputs[0].postprocessing step " << step.id << " has "
                      << list->size() << " values, one a channel, but the model's tensor there has "
                      << probe_.output_channels << " channels");
    TILER_CHECK(!step.reference_input || !step.per_channel || probe_.input_channels == probe_.output_channels,
                ConfigError,
                "the model card's outputs[0].postprocessing "
                    << step.id << " over y, x of each channel "
                    << "matches output channel k to input channel k, but the model takes "
                    << probe_.input_channels << " channel(s) and gives " << probe_.output_channels);
  }
  if (plan_.flags.kinds.empty()) plan_.flags.kinds = task.defaultKinds();
  plan_.flags.kinds = task.settledKinds(plan_.flags);
  for (const std::string& kind : plan_.flags.kinds) requireFormatFeature(kind);
  tiler::settleTask(task, probe_, plan_.flags, plan_.spec);
}

void InferJob::settleHeads() {
  const std::vector<ModelProbe>& probes = model_->headProbes();
  int64_t offset = 0;
  for (size_t h = 0; h < plan_.heads.size(); ++h) {
    InferHead& head = plan_.heads[h];
    const InferHead& first = plan_.heads.front();
    head.probe = probes[h];
    head.task = head.probe.task;
    const Task& task = *head.task;
    // Records are made where a window ran, from its whole prediction, and routed on their own.
    TILER_CHECK(!task.sendsRecords(), ConfigError,
                "--heads: head '" << head.spec.name << "' is --task " << task.name() << ", whose windows "
                                  << "send records, not predictions: run it alone (--output_key "
                                  << head.spec.name << ")");
    TILER_CHECK(perWindow(head.probe) == perWindow(first.probe), ConfigError,
                "--heads mixes a stitched map and one vector a window (head '"
                    << first.spec.name << "': --task " << taskName(first.task) << ", head '" << head.spec.name
                    << "': --task " << task.name() << "): a map takes MONAI's grid, a vector the patch "
                    << "lattice, and one run lays one grid: run them as two jobs (--output_key)");
    TILER_CHECK(head.probe.scale == first.probe.scale, ConfigError,
                "--heads: head '" << head.spec.name << "' gives maps at " << head.probe.scale.value()
                                  << "x the window, head '" << first.spec.name << "' at "
                                  << first.probe.scale.value() << "x: the heads of one run share one scale");
    if (head.flags.kinds.empty()) head.flags.kinds = task.defaultKinds();
    head.flags.kinds = task.settledKinds(head.flags);
    for (const std::string& kind : head.flags.kinds) requireFormatFeature(kind);
    tiler::settleTask(task, head.probe, head.flags, plan_.spec);
    head.offset = offset;
    head.values = 1;
    for (int64_t size : task.predictionSizes(head.probe, plan_.spec, 1)) head.values *= size;
    offset += head.values;
  }
}

std::string InferJob::reportedTask() const {
  if (plan_.heads.empty()) return taskName(probe_.task);
  std::string text;
  for (const InferHead& head : plan_.heads)
    text += (text.empty() ? "" : ",") + head.spec.name + ":" + taskName(head.task);
  return text;
}

std::vector<SavedOutput> InferJob::catalogOutputs() const {
  std::vector<SavedOutput> outputs;
  if (plan_.heads.empty())
    for (const std::string& kind : plan_.flags.kinds) outputs.push_back({kind, outputNaming(kind)});
  for (const InferHead& head : plan_.heads)
    for (const std::string& kind : head.flags.kinds)
      outputs.push_back({headKind(head.spec.name, kind), outputNaming(kind)});
  return outputs;
}

OutputOptions InferJob::outputOptions() const {
  OutputOptions oo;
  oo.compression = plan_.compression;
  oo.scale = probe_.scale;
  oo.abort_on_error = plan_.abort_on_error;
  oo.pyramid = o_.pyramid;
  oo.write_threads = o_.write_threads > 0 ? o_.write_threads : usableCpus();
  if (plan_.compression) oo.write_threads = compressionThreads(*plan_.compression, oo.write_threads);
  oo.owners = owners_;
  oo.rank = session_->rank();
  oo.stitched_window = faults_.stitched_window;
  if (stitch_on_device_) oo.stitch_device = model_->device();
  oo.before_device_stitcher = faults_.before_device_stitcher;
  if (plan_.heads.empty())
    oo.parts = {{consumersFor(*probe_.task, TaskOutputs{oo, probe_, plan_.spec, plan_.flags}), 0, {}}};
  for (const InferHead& head : plan_.heads) {
    std::vector<int64_t> sizes = head.task->predictionSizes(head.probe, plan_.spec, 1);
    sizes.erase(sizes.begin());
    oo.parts.push_back(
        {consumersFor(*head.task, TaskOutputs{oo, head.probe, plan_.spec, head.flags}), head.offset, sizes});
  }
  return oo;
}

LoaderOptions InferJob::loaderOptions() const {
  LoaderOptions lo;
  lo.batch_size = o_.batch_size;
  lo.input_channels = probe_.input_channels;
  lo.pad = plan_.pad;
  lo.cval = o_.cval;
  lo.depth = size_t(o_.prefetch);
  lo.read_threads = read_threads_;
  lo.pinned = model_->device().is_cuda();
  lo.bytes = inputAsBytes(catalog_);
  lo.device = model_->device();
  lo.before_read = faults_.before_read;
  lo.affine = !o_.preprocessing.empty();
  return lo;
}

std::future<InferJob::ForwardedBatch> InferJob::startStep(WindowLoader& loader, ForwardPool& pool) {
  ForwardedBatch f;
  laps_.lap(stats_.other_seconds);
  f.fatal = captureFailure([&] {
    f.batch = loader.next();
    TILER_CHECK(f.batch.has_value(), DistError, "the loader stopped early");
  });
  laps_.lap(stats_.wait_read_seconds);
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
      const double normalized = normalizeSecondsOfThisThread();
      f.preds = forward_->run(model, *f.batch, fault_slot);
      // Kernels and copies run asynchronously on this thread's stream: the predictions are whole after this.
      model.synchronize();
      f.forward_seconds = secondsSince(t0);
      f.normalize_seconds = normalizeSecondsOfThisThread() - normalized;
    });
    return f;
  });
}

std::vector<int64_t> InferJob::predictionSizes(int64_t windows) const {
  if (!plan_.heads.empty()) return {windows, plan_.heads.back().offset + plan_.heads.back().values};
  return probe_.task->predictionSizes(probe_, plan_.spec, windows);
}

void InferJob::reportFailures(const WindowBatch& batch, size_t first) {
  for (size_t i = first; i < batch.failures.size(); ++i)
    exchange().reportImageFailure(batch.failures[i].first, batch.failures[i].second);
  if (plan_.abort_on_error && batch.failures.size() > first)
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
      stats_.normalize_seconds += forwarded.normalize_seconds;
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
  laps_.lap(stats_.other_seconds);
  // The window lists carry every rank's status: a fatal error anywhere throws here on every rank.
  const auto every_rank = exchange().shareSlots(batch->slots, fatal, "the window list of " + what);
  const RouteContext route = routeContext();
  std::vector<int64_t> window_sizes = predictionSizes(1);
  window_sizes.erase(window_sizes.begin());
  StepResult result = record_of_ ? routeRecords(every_rank, records, route, what)
                                 : routePredictions(every_rank, preds, window_sizes, route, what);
  laps_.lap(stats_.gather_seconds);
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
  laps_.lap(stats_.other_seconds);
  outputs.submit(std::move(result));  // a stopped stage says why at the next step
  laps_.lap(stats_.submit_seconds);
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

RouteContext InferJob::routeContext() {
  RouteContext route;
  route.rank = rank();
  route.world_size = worldSize();
  route.owners = owners_;
  route.gather = [this](const torch::Tensor& part, int owner, const std::string& what) {
    // Stitching on the model's device: the predictions stay there (one rank: no collective at all).
    if (stitch_on_device_ && worldSize() == 1) return part;
    return exchange().gather(part, owner, what, /*stay=*/stitch_on_device_);
  };
  return route;
}

RunSummary InferJob::runSummary() const {
  RunSummary run;
  run.world_size = worldSize();
  run.backend = session_->dist().backendName();
  run.device = model_->device().str();
  run.precision = precisionName(model_->precision());
  run.model = o_.model;
  run.seconds = session_->seconds();
  run.window = plan_.spec;
  run.output_scale = probe_.scale.value();
  run.halo = plan_.flags.halo;
  run.tta = ttaName(plan_.flags.tta);
  run.replicas = layout_.replicas;
  run.threads = layout_.threads;
  run.read_threads = read_threads_;
  run.shard_run = shard_run_;
  run.cpu_blas = cpu_blas_;
  run.gather = session_->dist().gatherTransport();
  run.task = reportedTask();
  run.feature_dim = perWindow(probe_) ? int64_t(probe_.output_channels) : 0;
  run.runtime = model_->runtimeName();
  run.jit_optimize = model_->jitOptimized();
  run.jit_optimize_fallback = jit_fallback_;
  run.layouts_timed = layouts_timed_;
  run.stitch = stitch_on_device_ ? "device" : "host";
  run.model_card = o_.model_card;
  run.settings_from = o_.settings_from;
  return run;
}

int InferJob::finishRun(OutputStage& outputs, int64_t steps) {
  // Every rank's output stage drains; a failure of one ends every rank here with its message.
  std::string owned;
  laps_.lap(stats_.other_seconds);
  auto drained = captureFailure([&] {
    outputs.finish();
    if (auto e = outputs.error()) throw std::runtime_error(*e);
    owned = outputs.ownedResults();
  });
  laps_.lap(stats_.drain_seconds);
  // Past the last step: an owner still writing its outputs is the rank a timeout from here names.
  exchange().markStep(steps);
  exchange().check(drained, "the end of the output stages");
  stats_.peak_rss_mb = peakRssMegabytes();
  stats_.tiles_decoded = tiffChunksDecoded();
  stats_.write_seconds = outputs.stats().write_seconds;
  stats_.bytes_written = outputs.stats().bytes_written;
  stats_.images_owned = outputs.stats().images_owned;
  laps_.lap(stats_.other_seconds);
  stats_.wall_seconds = secondsSinceProcessStart();
  RanksAtEnd ranks;
  ranks.stats = exchange().allgather(torch::tensor(stats_.pack(), torch::kDouble), "the final statistics");
  ranks.results = exchange().allgatherStrings(owned, "the images' results");
  // Every rank fetched its own windows' bytes of a remote input: rank 0 sums them (remote_bytes_read).
  if (anyRemoteInput(catalog_))
    ranks.fetched =
        exchange().allgather(torch::tensor(fetchedBytesPerImage(catalog_), torch::kDouble), "bytes fetched");
  // Rank 0's verdict (or its fatal error) reaches every rank, so ctrun sees one code from all of them.
  return session_->finish([&] { return writeRunReport(catalog_, runSummary(), ranks, o_.report); });
}

int InferJob::run() {
  startupMark("main");
  stats_.libtorch_seconds = std::max(0.0, secondsSinceProcessStart());
  session_ = std::make_unique<RankSession>(joinWorld());
  startupMark("world joined");
  cpu_blas_ = cpuBlasName();
  const auto check_interrupt = [this] {
    if (o_.check_interrupt) o_.check_interrupt();
  };
  try {
    plan_ = planInfer(o_);
    faults_ = faultHooks(Fault::fromEnvironment(), rank(), [] {
      throw c10::OutOfMemoryError({__func__, __FILE__, uint32_t(__LINE__)},
                                  injectedFailure("out of memory in the forward"));
    });
    check_interrupt();
    loadModel();
    check_interrupt();
    connect();
    startupMark("connected");
    planImages();
    check_interrupt();
    prepareImages();
    check_interrupt();
  } catch (const ConfigError& e) {
    if (o_.model_card.empty()) throw;
    TILER_THROW(ConfigError, cardBlamed(e.message(), o_.settings_from, o_.model_card));
  }
  startupMark("images planned");
  return runSteps(dealWindows());
}

void InferJob::loadModel() {
  ModelOptions mo = modelOptionsFor(o_, session_->world().local_rank);
  o_.model = mo.path;  // the report names the model that ran, and so do the tasks' messages
  plan_.flags.model = o_.model;
  for (InferHead& head : plan_.heads) head.flags.model = o_.model;
  layout_ = chooseForwardLayout(o_.threads, o_.replicas,
                                resolveDevice(mo.device, session_->world().local_rank).is_cuda(),
                                defaultIntraOpThreads());
  mo.threads = layout_.threads;
  mo.activation = plan_.flags.activation;
  mo.tta = plan_.flags.tta;
  TILER_CHECK(!o_.jit_optimize || !o_.no_jit_optimize, ConfigError,
              "--jit_optimize and --no_jit_optimize: give one of them");
  mo.jit_optimize = o_.jit_optimize;
  mo.jit_optimize_default = !o_.jit_optimize && !o_.no_jit_optimize;
  mo.task = plan_.task;
  mo.classes_named = !plan_.flags.classes.empty();
  for (const InferHead& head : plan_.heads)
    mo.heads.push_back(HeadOptions{head.spec.name, head.spec.name, head.task, head.flags.activation,
                                   !head.flags.classes.empty()});
  mo.batch_size = o_.batch_size;
  auto t0 = Clock::now();
  model_ = o_.load_model ? o_.load_model(mo, plan_.spec.window_w, plan_.spec.window_h)
                         : std::make_shared<ModelRunner>(mo);
  stats_.model_load_seconds = secondsSince(t0);
  startupMark("model loaded");
  t0 = Clock::now();
  probe_ = model_->probe(plan_.spec.window_w, plan_.spec.window_h);
  jit_fallback_ = model_->jitOptimizeFallback();
  startupMark("model probed");
  if (plan_.heads.empty())
    settleTask();
  else
    settleHeads();
  // An output directory in memory holds the formats it can keep, and no other (before any window is read).
  if (isMemoryOutput(o_.output_dir))
    for (const SavedOutput& saved : catalogOutputs())
      TILER_CHECK(memoryKindRefusal(saved.kind).empty(), ConfigError, memoryKindRefusal(saved.kind));
  if (o_.threads == 0 && o_.replicas == 0 && model_->device().is_cpu() && layout_.replicas > 1) {
    const double bar = lightModelSeconds(plan_.spec, perWindow(probe_));
    const int timing_batch = std::min(o_.batch_size, kTimingBatch);
    const double per_window =
        model_->secondsPerWindow(plan_.spec.window_w, plan_.spec.window_h, timing_batch, bar);
    const bool light = per_window < bar;
    spdlog::debug("a window's forward takes {:.2f} ms: {}", per_window * 1e3,
                  light ? "light, one replica of one thread" : "replicas");
    if (light) {
      layout_ = chooseForwardLayout(0, 0, false, defaultIntraOpThreads(), /*light=*/true);
      at::set_num_threads(layout_.threads);
    }
    // Timing may pick one replica of every thread only where that gives the bytes one thread gives: each
    // rank's forward then writes what one process would, whichever layout wins.
    measure_layout_ = !light && model_->sameOutputAtThreads(plan_.spec.window_w, plan_.spec.window_h,
                                                            layout_.replicas * layout_.threads);
    if (!light && !measure_layout_)
      spdlog::debug("the layouts are not timed: {} threads give other bytes than one",
                    layout_.replicas * layout_.threads);
  }
  stats_.probe_seconds = secondsSince(t0);
  // The owner's windows of other ranks must arrive on the model's device too: one rank, or ranks that gather
  // on it (NCCL; gloo between CPU ranks); through the host (gloo between GPU ranks) the host stitches.
  stitch_on_device_ =
      probe_.task->stitches() && (plan_.stitch_place == StitchPlace::kDevice ||
                                  (plan_.stitch_place == StitchPlace::kAuto && model_->device().is_cuda()));
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
    // An output directory in memory is this process's alone.
    if (rank() == 0 && !isMemoryOutput(o_.output_dir))
      session_->lockDirectory(o_.output_dir, "output directory");
    InferCatalogOptions co;
    co.inputs = o_.inputs;
    co.recursive = o_.recursive;
    co.output_dir = o_.output_dir;
    co.format = o_.format;
    co.outputs = catalogOutputs();
    co.resume = o_.resume;
    co.overwrite = o_.overwrite;
    co.remove_stale_partials = rank() == 0;
    co.also_read = {o_.model};
    if (plan_.mask.mode == MaskMode::kPath) co.also_read.push_back(plan_.mask.path);
    co.roi = plan_.mask.roi;
    catalog_ = buildInferCatalog(co, CatalogSpec{plan_.spec, probe_.input_channels, probe_.scale, o_.scale,
                                                 plan_.mask, plan_.resolution, true, plan_.channels});
    if (rank() == 0) checkReportPath();
    if (rank() == 0)
      for (const auto& img : catalog_.images())
        if (const std::string upsampled = upsampleWarning(img.input, img.resolution);
            img.status == "ok" && !upsampled.empty())
          spdlog::warn("{}", upsampled);
    if (plan_.abort_on_error) {
      for (const auto& img : catalog_.images())
        TILER_CHECK(img.status != "error", IoError, img.error << " (--on_error abort)");
    }
    // Slots beyond the job's windows would be padding only (--batch_size 100000 for one window asked LibTorch
    // for 78 GB); every rank plans the same windows, so every rank takes the same batch.
    o_.batch_size = int(std::min<int64_t>(o_.batch_size, std::max<int64_t>(1, catalog_.totalWindows())));
    const double batch_gb = double(o_.batch_size) * probe_.input_channels * double(plan_.spec.window_w) *
                            double(plan_.spec.window_h) * double(sizeof(float)) / 1e9;
    const double memory_gb = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) / 1e9;
    TILER_CHECK(batch_gb <= memory_gb / 4, ConfigError,
                "--batch_size " << o_.batch_size << ": one batch of " << probe_.input_channels << "x"
                                << plan_.spec.window_h << "x" << plan_.spec.window_w << " windows takes "
                                << batch_gb << " GB as input alone, over a quarter of this machine's "
                                << memory_gb << " GB (the loader holds several); lower --batch_size");
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

namespace {

// One image's statistics as a row of doubles (each channel's, then those over all: count, mean, std, then
// each of `qs`), and back.
void packStatistics(const ImageStatistics& s, const std::vector<double>& qs, double* row) {
  std::vector<const ValueStatistics*> parts;
  for (const auto& c : s.channels) parts.push_back(&c);
  parts.push_back(&s.all);
  for (const ValueStatistics* v : parts) {
    *row++ = v->count, *row++ = v->mean, *row++ = v->std;
    for (double q : qs) *row++ = v->percentiles.at(q);
  }
}

ImageStatistics unpackStatistics(const double* row, int channels, const std::vector<double>& qs) {
  ImageStatistics s;
  for (int c = 0; c <= channels; ++c) {
    ValueStatistics v;
    v.count = *row++, v.mean = *row++, v.std = *row++;
    for (double q : qs) v.percentiles[q] = *row++;
    (c < channels ? s.channels.emplace_back(v) : s.all) = v;
  }
  return s;
}

}  // namespace

void InferJob::prepareImages() {
  const std::vector<ProcessingStep>& steps = o_.preprocessing;
  // A postprocessing step's reference_tensor: the input's statistics as read, the same pass's.
  const bool reference = readsInputStatistics(plan_.flags.blended_steps);
  if (steps.empty() && !reference) return;
  const int C = probe_.input_channels;
  std::vector<double> qs = percentilesRead(steps);
  for (double q : percentilesRead(plan_.flags.blended_steps, true))
    if (std::find(qs.begin(), qs.end(), q) == qs.end()) qs.push_back(q);
  std::sort(qs.begin(), qs.end());
  std::vector<int> planned;
  for (int id = 0; id < int(catalog_.images().size()); ++id)
    if (catalog_.image(id).status == "ok" && catalog_.image(id).first_window >= 0) planned.push_back(id);
  if (usesStatistics(steps) || reference) {
    // Rank r gathers the statistics of every W-th planned image from the r-th; every rank then holds all
    // of them (the same numbers wherever they were gathered: outputs do not depend on the world size).
    const int64_t fields = int64_t((3 + qs.size()) * size_t(C + 1));
    torch::Tensor mine = torch::zeros({int64_t(planned.size()), fields}, torch::kDouble);
    std::string errors;  // "<image id>\t<message>\n" each
    auto fatal = captureFailure([&] {
      for (size_t k = size_t(rank()); k < planned.size(); k += size_t(worldSize())) {
        const CatalogImage& img = catalog_.image(planned[k]);
        try {
          packStatistics(gatherImageStatistics(img, C, qs), qs, mine[int64_t(k)].data_ptr<double>());
        } catch (const std::bad_alloc&) {
          throw;
        } catch (...) {
          // The loader of each rank that meets its windows fails the image with this message.
          std::string message =
              "'" + img.input + "': reading its statistics: " + describeException(std::current_exception());
          std::replace(message.begin(), message.end(), '\n', ' ');
          std::replace(message.begin(), message.end(), '\t', ' ');
          errors += std::to_string(planned[k]) + "\t" + message + "\n";
        }
      }
    });
    exchange().check(fatal, "the images' statistics");
    const auto every = exchange().allgather(mine, "the images' statistics");
    for (const std::string& text : exchange().allgatherStrings(errors, "the images' statistics")) {
      std::istringstream lines(text);
      std::string line;
      while (std::getline(lines, line)) {
        const size_t tab = line.find('\t');
        catalog_.image(std::stoi(line.substr(0, tab))).statistics_error = line.substr(tab + 1);
      }
    }
    for (size_t k = 0; k < planned.size(); ++k) {
      CatalogImage& img = catalog_.image(planned[k]);
      if (img.statistics_error.empty())
        img.input_statistics = unpackStatistics(
            every[k % size_t(worldSize())].to(torch::kDouble).contiguous()[int64_t(k)].data_ptr<double>(), C,
            qs);
    }
  }
  if (steps.empty()) return;
  for (int id : planned) {
    CatalogImage& img = catalog_.image(id);
    if (!img.statistics_error.empty()) continue;
    // Tiler's own normalisation first, (x * scale - mean) / std, then the chain's affine steps.
    ChannelAffine before;
    for (int c = 0; c < C; ++c) {
      const double mean = o_.mean.empty() ? 0.0 : o_.mean[o_.mean.size() == 1 ? 0 : size_t(c)];
      const double std = o_.std.empty() ? 1.0 : o_.std[o_.std.size() == 1 ? 0 : size_t(c)];
      before.gain.push_back(img.scale / std);
      before.offset.push_back(-mean / std);
    }
    ImageStatistics none;
    none.channels.resize(size_t(C));
    img.input_affine = inputAffine(steps, img.input_statistics ? *img.input_statistics : none, before,
                                   "'" + img.input + "'");
  }
}

void InferJob::checkReportPath() const {
  PathRoles roles;
  roles.reads(o_.model, "the model");
  if (plan_.mask.mode == MaskMode::kPath) roles.reads(plan_.mask.path, "the mask");
  for (const auto& img : catalog_.images()) {
    roles.reads(img.input, "the input");
    if (!plan_.mask.roi.empty()) roles.reads(roiFileFor(plan_.mask.roi, img.input), "the ROI");
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
        catalog_.images().size(), catalog_.totalWindows(), plan_.spec.window_w, plan_.spec.window_h,
        worldSize(), steps, B, session_->dist().backendName(), precisionName(model_->precision()),
        model_->device().str(), cpu ? " with " + cpu_blas_ : "", layout_.replicas, layout_.threads,
        read_threads_, shard_run_);
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
  record_of_ = probe_.task->recordMaker(TaskOutputs{oo, probe_, plan_.spec, plan_.flags});
  const int64_t B = o_.batch_size, steps = deal.steps;
  ForwardSpec fs;
  fs.batch_size = B;
  fs.window_sizes = predictionSizes(1);
  fs.window_sizes.erase(fs.window_sizes.begin());
  fs.type = predictionType(probe_.task);
  fs.to = stitch_on_device_ ? model_->device() : session_->dist().commDevice();
  fs.rank = rank();
  forward_ = std::make_unique<BatchForward>(fs, catalog_, faults_);
  OutputStage outputs(catalog_, oo);
  WindowLoader loader(catalog_, plan_.spec, loaderOptions(), std::move(deal.slots), steps);
  LayoutTrial trial = measure_layout_ ? LayoutTrial(layout_, steps) : LayoutTrial();
  ForwardLayout running = trial.active() ? trial.layout() : layout_;
  auto pool = std::make_unique<ForwardPool>(*model_, running);
  std::deque<std::future<ForwardedBatch>> started;
  Progress progress(catalog_.totalWindows(), "windows", !o_.no_progress && rank() == 0);
  stats_.startup_seconds = secondsSinceProcessStart();
  stats_.setup_seconds = std::max(0.0, stats_.startup_seconds - stats_.libtorch_seconds -
                                           stats_.model_load_seconds - stats_.probe_seconds);
  laps_.start();
  startupMark("first step");
  // A collective that times out names the ranks behind this one (markStep).
  for (int64_t step = 0; step < steps; ++step) {
    // Every replica busy and one more batch queued, so that none waits while this thread exchanges; a
    // layout on trial takes only its own steps.
    const int64_t ahead = pool->replicas() + 1, last = trial.active() ? trial.phaseEnd() : steps;
    while (int64_t(started.size()) < ahead && step + int64_t(started.size()) < last)
      started.push_back(startStep(loader, *pool));
    ForwardedBatch forwarded = started.front().get();
    laps_.lap(stats_.wait_forward_seconds);
    started.pop_front();
    if (trial.active()) {
      trial.record(step, forwarded.forward_seconds);
      if (!trial.active()) {
        layout_ = trial.faster();
        layouts_timed_ = trial.timings(o_.batch_size);
        if (rank() == 0)
          spdlog::info("{} replica(s) x {} thread(s): a window's forward {:.2f} ms, against {:.2f} ms as {}",
                       layout_.replicas, layout_.threads,
                       1e3 * std::min(layouts_timed_[0].second, layouts_timed_[1].second),
                       1e3 * std::max(layouts_timed_[0].second, layouts_timed_[1].second),
                       layout_.replicas == 1 ? layouts_timed_[1].first : layouts_timed_[0].first);
      }
      const ForwardLayout next = trial.active() ? trial.layout() : layout_;
      if (next.replicas != running.replicas || next.threads != running.threads) {
        pool.reset();  // no step of its layout is left
        running = next;
        pool = std::make_unique<ForwardPool>(*model_, running);
      }
    }
    runStep(step, steps, std::move(forwarded), loader, outputs);
    const int64_t done = std::min(catalog_.totalWindows(), (step + 1) * B * worldSize());
    progress.update(done);
    if (o_.after_step) o_.after_step(done, catalog_.totalWindows());
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
