#include "tiler/finetune/trainer.hpp"

#include <spdlog/spdlog.h>
#include <torch/optim.h>
#include <torch/script.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <opencv2/imgcodecs.hpp>

#include "tiler/core/error.hpp"
#include "tiler/core/fault.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/dist/report.hpp"
#include "tiler/dist/session.hpp"
#include "tiler/finetune/batches.hpp"
#include "tiler/finetune/checkpoint.hpp"
#include "tiler/finetune/label_source.hpp"
#include "tiler/finetune/losses.hpp"
#include "tiler/finetune/plan.hpp"
#include "tiler/finetune/train_metrics.hpp"
#include "tiler/finetune/training_data.hpp"
#include "tiler/finetune/validation.hpp"
#include "tiler/io/resolution.hpp"
#include "tiler/model/model.hpp"
#include "tiler/tasks/registry.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace tiler {
namespace {

constexpr size_t kBucketBytes = 25u << 20;  // gradient all-reduce bucket, as DDP's default

class Trainer {
 public:
  explicit Trainer(FinetuneOptions o) : o_(std::move(o)) {}
  int run();

 private:
  // The phases of run(), in order.
  void loadModel();   // the model in training mode, its parameters and the optimiser
  void connect();     // the process group, the checkpoint directory's lock and the data, on every rank
  int resumeEpoch();  // the last epoch done (0: none), its state loaded everywhere
  void broadcastState();
  // --class_weights auto: inverse frequency over the training windows' labelled pixels (every rank's share).
  void computeClassWeights();
  void planSteps();
  void trainEpoch(int epoch, Progress& progress);
  // One optimiser step: `micros` micro-batches' gradients summed, synchronised and applied (or skipped on
  // an fp16 overflow). Adds the micro-batches' losses to `loss_sum`, their count to `counted`.
  void trainStep(int epoch, int64_t s, const std::vector<WindowRef>& mine, WindowLoader& loader,
                 double& loss_sum, int64_t& counted);
  int finishRun();

  void loadData();
  // Rank 0's outputs (-o, --report, the checkpoints and their lock) are none of the files training reads
  // (the model, images, labels) nor each other: a ConfigError naming the clash.
  void checkWrittenPaths() const;
  bool syncGradients();  // returns false when a gradient is inf/nan (fp16 overflow) on any rank
  // Micro-batch `micro` of this rank's windows of an epoch.
  std::vector<WindowRef> microBatch(const std::vector<WindowRef>& mine, int64_t micro) const;
  // Rank 0, after each epoch: the CSV and the plot of the epochs, and --save_best's model.
  void writeEpochOutputs(int epoch);
  TrainedSettings trainedSettings() const;
  void saveModel(const std::string& path) { saveTrainedModel(runner_->module(), path, trainedSettings()); }
  std::string csvPath() const { return o_.output + ".epochs.csv"; }
  std::string plotPath() const { return o_.output + ".curves.png"; }
  std::string bestPath() const { return o_.output + ".best.pt"; }
  double learningRateNow() const {
    return learningRate(o_, plan_, double(state_.step) / double(state_.total_steps));
  }
  int rank() const { return session_->rank(); }
  StepExchange& exchange() { return session_->exchange(); }

  FinetuneOptions o_;
  FinetunePlan plan_;
  std::unique_ptr<RankSession> session_;  // from run() on
  FaultHooks faults_;                     // TILER_FAULT, this rank's
  std::unique_ptr<ModelRunner> runner_;
  ModelProbe probe_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<torch::Tensor> params_;
  TrainingData data_;
  std::unique_ptr<TrainingBatches> batches_;
  std::unique_ptr<Checkpoints> checkpoints_;
  torch::Tensor class_weights_;  // float32 [K] on the device; undefined: none
  std::unique_ptr<Loss> loss_;
  // Open readers of images and labels, kept across steps (a PNG is decoded once, not per batch): one cache
  // for the read-ahead thread, one for validation on the main thread.
  ReaderCache train_readers_, val_readers_;
  TrainingState state_;   // what a checkpoint keeps: the loss scaler (fp16, or --loss_scale), steps, history
  bool scaling_ = false;  // whether losses are scaled
  int64_t micro_per_epoch_ = 0, steps_per_epoch_ = 0;  // this rank's micro-batches, the optimiser's steps
  double sync_seconds_ = 0, step_seconds_ = 0;         // for the report
};

int Trainer::run() {
  session_ = std::make_unique<RankSession>(joinWorld());
  plan_ = planFinetune(o_);
  faults_ = faultHooks(Fault::fromEnvironment(), rank());
  const auto check_interrupt = [this] {
    if (o_.check_interrupt) o_.check_interrupt();
  };
  check_interrupt();
  loadModel();
  check_interrupt();
  connect();
  check_interrupt();
  const int first_epoch = resumeEpoch();
  broadcastState();
  if (plan_.auto_class_weights) computeClassWeights();
  check_interrupt();
  loss_ = makeLoss(plan_.loss, class_weights_);
  planSteps();
  Progress progress(state_.total_steps, "steps", !o_.no_progress && rank() == 0);
  for (int epoch = first_epoch + 1; epoch <= o_.epochs; ++epoch) trainEpoch(epoch, progress);
  return finishRun();
}

void Trainer::loadModel() {
  ModelOptions model = modelOptionsFor(o_, session_->world().local_rank);
  // Label maps train a map (the probe refuses any other output); window labels [B,K] class scores.
  if (plan_.labels->per_window) model.task = findTask("classify");
  requireTrainableModel(model.path);
  runner_ = std::make_unique<ModelRunner>(model);
  probe_ = runner_->probe(plan_.spec.window_w, plan_.spec.window_h);
  runner_->module().train();
  for (const auto& p : runner_->module().parameters(true)) {
    p.set_requires_grad(true);
    params_.push_back(p);
  }
  TILER_CHECK(!params_.empty(), ModelError, "'" << o_.model << "': the model has no parameters to train");
  const int64_t classes = metricClasses(plan_.loss, probe_.output_channels);
  const auto& names = plan_.class_names;
  TILER_CHECK(names.empty() || plan_.loss == LossKind::kMse || int64_t(names.size()) == classes, ConfigError,
              "--classes names " << names.size() << " classes, the model's " << classes);
  TILER_CHECK(plan_.class_weights.empty() || int64_t(plan_.class_weights.size()) == probe_.output_channels,
              ConfigError,
              "--class_weights has " << plan_.class_weights.size() << " weights, the model "
                                     << probe_.output_channels << " classes");
  if (!plan_.class_weights.empty())
    class_weights_ = torch::tensor(plan_.class_weights, torch::kFloat32).to(runner_->device());
  scaling_ = runner_->precision() == Precision::kFp16 || o_.loss_scale > 0;
  if (o_.loss_scale > 0) state_.scaler.scale = o_.loss_scale;
  state_.scaler.growth_steps = o_.loss_scale_growth_steps;
  if (plan_.optimizer == OptimizerKind::kAdam)
    optimizer_ = std::make_unique<torch::optim::Adam>(
        params_, torch::optim::AdamOptions(o_.lr).weight_decay(o_.weight_decay));
  else
    optimizer_ = std::make_unique<torch::optim::SGD>(
        params_, torch::optim::SGDOptions(o_.lr).momentum(o_.momentum).weight_decay(o_.weight_decay));
  checkpoints_ = std::make_unique<Checkpoints>(o_.checkpoint_dir, o_.seed, trainedSettings());
}

TrainedSettings Trainer::trainedSettings() const {
  // What infer needs to run the model as it was trained (readTrainedSettings).
  TrainedSettings s;
  s.window = std::to_string(plan_.spec.window_w) + "," + std::to_string(plan_.spec.window_h);
  s.classes = o_.classes;
  s.mpp = o_.mpp;
  s.magnification = o_.magnification;
  return s;
}

void Trainer::connect() {
  session_->connect(distOptionsFor(o_), runner_->device());
  session_->setup("the data check", [&] {
    // Two runs into one checkpoint directory would remove each other's epochs.
    if (rank() == 0 && !o_.checkpoint_dir.empty())
      session_->lockDirectory(o_.checkpoint_dir, "--checkpoint_dir");
    loadData();
    if (rank() == 0) checkWrittenPaths();
    // Training on upsampled pixels is as much the user's to know as inferring on them.
    if (rank() == 0)
      for (const CatalogImage& img : data_.catalog.images())
        if (const std::string upsampled = upsampleWarning(img.input, img.resolution); !upsampled.empty())
          spdlog::warn("{}", upsampled);
  });
  batches_ = std::make_unique<TrainingBatches>(o_, plan_, data_, *runner_, faults_,
                                               session_->world().world_size, rank());
}

void Trainer::loadData() {
  const LabelContext context{o_, plan_, probe_};
  const LabelSourceRow& held_out = heldOutLabelSource(o_, *plan_.labels);
  data_ = loadTrainingData(context, plan_.labels->make(context),
                           &held_out == plan_.labels ? nullptr : held_out.make(context));
}

void Trainer::checkWrittenPaths() const {
  PathRoles roles;
  roles.reads(o_.model, "the model");
  for (const CatalogImage& t : data_.catalog.images()) {
    roles.reads(t.input, "the training image");
    roles.reads(t.label, "the training label");
  }
  std::string clash;
  if (!o_.checkpoint_dir.empty()) {
    clash = roles.claim(DirectoryLock::pathFor(o_.checkpoint_dir), "the --checkpoint_dir lock");
    // Each epoch's checkpoint replaces the ones before it: epoch-NNNNNN[.partial] entries are removed whole.
    if (clash.empty()) clash = roles.claimEntries(o_.checkpoint_dir, "epoch-", "the checkpoints");
  }
  if (clash.empty()) clash = roles.claim(o_.output, "-o");
  if (clash.empty()) clash = roles.claim(o_.report, "--report");
  if (clash.empty()) clash = roles.claim(csvPath(), "the epochs CSV");
  if (clash.empty()) clash = roles.claim(plotPath(), "the curves PNG");
  if (clash.empty() && o_.save_best) clash = roles.claim(bestPath(), "--save_best's model");
  TILER_CHECK(clash.empty(), ConfigError, clash);
}

int Trainer::resumeEpoch() {
  // Rank 0 decides where training resumes; every rank loads that checkpoint (or fails, on every rank).
  auto resume =
      torch::tensor({int64_t(o_.resume && rank() == 0 ? checkpoints_->latest() : 0)}, torch::kInt64);
  exchange().broadcast(resume, 0, "the resume epoch");
  const int first_epoch = int(resume.item<int64_t>());
  if (o_.resume && first_epoch == 0 && rank() == 0)
    spdlog::info("no checkpoint in '{}': starting fresh", o_.checkpoint_dir);
  if (first_epoch > 0)
    session_->setup("the checkpoint load", [&] {
      checkpoints_->load(first_epoch, runner_->module(), params_, *optimizer_, runner_->device(), state_);
      if (rank() == 0)
        spdlog::info("resuming after epoch {} from '{}'", first_epoch, checkpoints_->epochDir(first_epoch));
    });
  return first_epoch;
}

void Trainer::broadcastState() {
  torch::NoGradGuard ng;
  for (auto& t : params_) {
    auto c = t.detach().clone();
    exchange().broadcast(c, 0, "the initial parameters");
    t.detach().copy_(c);
  }
  for (const auto& b : runner_->module().buffers(true)) {
    if (!b.is_floating_point() && b.scalar_type() != torch::kLong) continue;
    auto c = b.detach().clone();
    exchange().broadcast(c, 0, "the initial buffers");
    b.detach().copy_(c);
  }
}

void Trainer::computeClassWeights() {
  const int64_t K = probe_.output_channels;
  auto counts = torch::zeros({K}, torch::kDouble);
  std::vector<bool> padded;
  const auto mine = batches_->epochWindows(data_.train, 0, false, &padded);
  const auto [oh, ow, tc] = data_.labelShape();
  auto failure = captureFailure([&] {
    auto target = torch::zeros({oh, ow}, torch::kFloat32), valid = torch::zeros({oh, ow}, torch::kFloat32);
    for (size_t k = 0; k < mine.size(); ++k) {
      if (padded[k]) continue;  // a duplicate counts once
      target.zero_();
      valid.zero_();
      data_.readLabels(mine[k], train_readers_, target.data_ptr<float>(), valid.data_ptr<float>());
      const auto labelled = target.masked_select(valid > 0).to(torch::kLong).clamp(0, K - 1);
      counts += torch::bincount(labelled, {}, K).to(torch::kDouble);
    }
  });
  exchange().check(failure, "the class weights");
  exchange().allreduceSum(counts, "the class counts");
  const auto weights = inverseFrequencyWeights(counts);
  class_weights_ = weights.to(torch::kFloat32).to(runner_->device());
  if (rank() == 0) {
    std::string shown;
    for (int64_t c = 0; c < K; ++c) shown += fmt::format("{}{:.4g}", c ? "," : "", weights[c].item<double>());
    spdlog::info("class weights (inverse frequency of {} labelled pixels): {}",
                 int64_t(counts.sum().item<double>()), shown);
  }
}

void Trainer::planSteps() {
  const int64_t B = o_.batch_size, K = o_.grad_accum_steps;
  const int64_t per_rank = int64_t(batches_->epochWindows(data_.train, 0, true, nullptr).size());
  micro_per_epoch_ = o_.drop_last ? std::max<int64_t>(1, per_rank / B) : (per_rank + B - 1) / B;
  steps_per_epoch_ = (micro_per_epoch_ + K - 1) / K;
  state_.total_steps = steps_per_epoch_ * o_.epochs;
  if (rank() == 0)
    spdlog::info(
        "finetune: {} train / {} val windows of {}x{}, {} rank(s), {} step(s) of {} micro-batch(es) per "
        "epoch, loss {}, {} {}",
        data_.train.size(), data_.val.size(), plan_.spec.window_w, plan_.spec.window_h,
        session_->world().world_size, steps_per_epoch_, K, o_.loss, o_.optimizer,
        precisionName(runner_->precision()));
}

std::vector<WindowRef> Trainer::microBatch(const std::vector<WindowRef>& mine, int64_t micro) const {
  const size_t lo = size_t(micro * o_.batch_size),
               hi = std::min(mine.size(), size_t((micro + 1) * o_.batch_size));
  return std::vector<WindowRef>(mine.begin() + long(lo), mine.begin() + long(hi));
}

void Trainer::trainEpoch(int epoch, Progress& progress) {
  const auto t0 = Clock::now();
  const auto mine = batches_->epochWindows(data_.train, epoch, true, nullptr);
  // Windows past the epoch's micro-batches (--drop_last's tail) are never read.
  const std::vector<WindowRef> read(
      mine.begin(), mine.begin() + long(std::min(mine.size(), size_t(micro_per_epoch_ * o_.batch_size))));
  auto loader = batches_->loader(read, train_readers_, true);
  double loss_sum = 0;
  int64_t counted = 0;
  for (int64_t s = 0; s < steps_per_epoch_; ++s) {
    trainStep(epoch, s, mine, *loader, loss_sum, counted);
    progress.update(state_.step);
    if (o_.check_interrupt) o_.check_interrupt();
  }
  auto train_loss = torch::tensor({loss_sum, double(counted)}, torch::kDouble);
  exchange().allreduceSum(train_loss, "the training loss");
  nlohmann::json e = {
      {"epoch", epoch},
      {"train_loss", train_loss[0].item<double>() / std::max(1.0, train_loss[1].item<double>())}};
  e.update(validate({o_, plan_, *runner_, *loss_, *batches_, exchange()}, data_.val, val_readers_));
  e["lr"] = learningRateNow();
  if (scaling_) e["loss_scale"] = state_.scaler.scale;
  e["seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
  state_.history.push_back(e);
  if (rank() == 0 && !o_.no_progress) {
    std::string metrics;
    for (const char* k : {"val_loss", "val_accuracy", "val_iou", "val_dice", "val_psnr"})
      if (e.contains(k)) metrics += fmt::format(", {} {:.4f}", k, e[k].get<double>());
    std::cout << fmt::format("epoch {}/{}: train_loss {:.4f}{} ({:.1f} s)", epoch, o_.epochs,
                             e["train_loss"].get<double>(), metrics, e["seconds"].get<double>())
              << std::endl;
  }
  session_->setup("the checkpoint of epoch " + std::to_string(epoch), [&] {
    if (!o_.checkpoint_dir.empty() && rank() == 0)
      checkpoints_->save(epoch, runner_->module(), *optimizer_, state_, faults_.before_checkpoint);
    writeEpochOutputs(epoch);
  });
}

void Trainer::writeEpochOutputs(int epoch) {
  if (rank() != 0) return;
  const nlohmann::json& history = state_.history;
  // Beside -o, whose directory the model's first save would make: made here, before the first epoch's files.
  if (fs::path(o_.output).has_parent_path()) fs::create_directories(fs::path(o_.output).parent_path());
  std::vector<std::string> names;  // the classes the metrics name, in class order
  if (!history.empty() && history.back().contains("val_class_dice"))
    for (size_t c = 0; c < history.back()["val_class_dice"].size(); ++c)
      names.push_back(c < plan_.class_names.size() ? plan_.class_names[c] : "class_" + std::to_string(c));
  const std::string csv = epochsCsv(history, names);
  std::string error = writeFileAtomically(csvPath(), [&](std::ostream& out) { out << csv; });
  TILER_CHECK(error.empty(), IoError, "'" << csvPath() << "': " << error);
  std::vector<uchar> png;
  TILER_CHECK(cv::imencode(".png", drawCurves(history), png), IoError,
              "'" << plotPath() << "': cannot encode");
  error = writeFileAtomically(plotPath(), [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(png.data()), std::streamsize(png.size()));
  });
  TILER_CHECK(error.empty(), IoError, "'" << plotPath() << "': " << error);
  if (o_.save_best && bestEpoch(history) == epoch) saveModel(bestPath());
}

void Trainer::trainStep(int epoch, int64_t s, const std::vector<WindowRef>& mine, WindowLoader& loader,
                        double& loss_sum, int64_t& counted) {
  const auto ts = Clock::now();
  const int64_t K = o_.grad_accum_steps;
  const int64_t first = s * K, micros = std::min(K, micro_per_epoch_ - first);
  for (auto& g : optimizer_->param_groups())
    static_cast<torch::optim::OptimizerOptions&>(g.options()).set_lr(learningRateNow());
  optimizer_->zero_grad();
  LossScaler& scaler = state_.scaler;
  // Gradients of `micros` micro-batches summed, each loss weighted 1/micros: the same step as one batch
  // of them all (and as `micros` ranks each taking one).
  auto failure = captureFailure([&] {
    for (int64_t m = 0; m < micros; ++m) {
      const auto refs = microBatch(mine, first + m);
      const DeviceBatch batch = batches_->next(loader, refs, epoch);
      torch::Tensor loss = (*loss_)(runner_->apply(batch.x), batch.target, batch.mask);
      ((scaling_ ? loss * scaler.scale : loss) / double(micros)).backward();
      loss_sum += loss.item<double>();
      ++counted;
    }
  });
  const auto tsync = Clock::now();
  exchange().check(failure, "step " + std::to_string(s + 1) + " of epoch " + std::to_string(epoch));
  const bool finite = syncGradients();
  sync_seconds_ += std::chrono::duration<double>(Clock::now() - tsync).count();
  if (scaling_) {
    // Every rank sees the same all-reduced gradients, so every rank takes the same decision.
    torch::NoGradGuard ng;
    const double used = scaler.scale;
    if (!scaler.update(finite)) {
      if (rank() == 0) spdlog::warn("loss scale {} overflowed: step skipped, now {}", used, scaler.scale);
      ++state_.step;
      return;
    }
    for (auto& p : params_) p.mutable_grad().div_(used);
  }
  optimizer_->step();
  ++state_.step;
  step_seconds_ += std::chrono::duration<double>(Clock::now() - ts).count();
}

bool Trainer::syncGradients() {
  torch::NoGradGuard ng;
  const double world = double(session_->world().world_size);
  bool finite = true;
  if (world == 1) {
    // Nothing to exchange (the sum of one, divided by one, is the gradient itself, bit for bit): only
    // whether the loss scaler may step, without flattening and copying every gradient twice.
    for (auto& p : params_) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      if (scaling_ && finite) finite = p.grad().isfinite().all().item<bool>();
    }
    return finite;
  }
  size_t start = 0;
  while (start < params_.size()) {
    // A bucket of about kBucketBytes of gradients, flattened into one tensor for one all-reduce.
    size_t end = start, bytes = 0;
    std::vector<torch::Tensor> flat;
    while (end < params_.size() && (bytes < kBucketBytes || end == start)) {
      auto& p = params_[end];
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      flat.push_back(p.grad().reshape({-1}).to(torch::kFloat32));
      bytes += size_t(p.numel()) * 4;
      ++end;
    }
    auto bucket = torch::cat(flat);
    exchange().allreduceSum(bucket, "the gradient all-reduce");
    bucket = bucket / world;
    finite = finite && bucket.isfinite().all().item<bool>();
    int64_t offset = 0;
    for (size_t i = start; i < end; ++i) {
      auto& g = params_[i].mutable_grad();
      g.copy_(bucket.narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
    start = end;
  }
  return finite;
}

int Trainer::finishRun() {
  const nlohmann::json& history = state_.history;
  // Data parallelism promises identical parameters on every rank: check it rather than trust it.
  double checksum = 0;
  for (const auto& p : params_) checksum += p.detach().to(torch::kDouble).abs().sum().item<double>();
  auto sums = exchange().allgather(torch::tensor({checksum}, torch::kDouble), "the parameter checksum");
  // NaN is never equal to itself: parameters that are not numbers mean the training diverged, on every rank.
  for (size_t r = 0; r < sums.size(); ++r)
    TILER_CHECK(std::isfinite(sums[r].item<double>()), ModelError,
                "training diverged: rank " << r << "'s parameters are no longer finite (NaN or Inf) after "
                                           << state_.step << " steps; lower --lr, or check the labels");
  for (size_t r = 0; r < sums.size(); ++r)
    TILER_CHECK(sums[r].item<double>() == checksum, DistError,
                "rank " << r << " holds different parameters after training (checksum "
                        << sums[r].item<double>() << " vs " << checksum << ")");
  return session_->finish([&] {
    saveModel(o_.output);
    nlohmann::json report = {{"world_size", session_->world().world_size},
                             {"epochs", history},
                             {"output", o_.output},
                             {"seconds", session_->seconds()},
                             {"step_seconds", step_seconds_},
                             {"sync_seconds", sync_seconds_},
                             {"steps", state_.step},
                             {"grad_accum_steps", o_.grad_accum_steps},
                             {"parameter_checksum", checksum},
                             {"classes", plan_.class_names},
                             {"epochs_csv", csvPath()},
                             {"curves_png", plotPath()}};
    if (class_weights_.defined()) {
      auto w = class_weights_.to(torch::kCPU).to(torch::kDouble);
      report["class_weights"] = std::vector<double>(w.data_ptr<double>(), w.data_ptr<double>() + w.numel());
    }
    if (scaling_)
      report["loss_scale"] = {{"scale", state_.scaler.scale}, {"skipped_steps", state_.scaler.skipped_steps}};
    if (const int best = bestEpoch(history); o_.save_best && best > 0) {
      report["best"] = {{"epoch", best}, {"path", bestPath()}};
      for (const auto& e : history)
        if (e["epoch"] == best) report["best"]["val_dice"] = e["val_dice"];
    }
    writeJsonAtomically(o_.report, report);
    spdlog::info("finetune: wrote '{}' and '{}'", o_.output, o_.report);
    return kExitOk;
  });
}

}  // namespace

int runTraining(const FinetuneOptions& options) {
  return Trainer(options).run();
}

}  // namespace tiler
