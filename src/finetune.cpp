#include "tiler/finetune.hpp"

#include <spdlog/spdlog.h>
#include <torch/nn/functional.h>
#include <torch/optim.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>
#include <random>

#include "tiler/dist.hpp"
#include "tiler/error.hpp"
#include "tiler/model.hpp"
#include "tiler/pipeline.hpp"
#include "tiler/sampler.hpp"
#include "tiler/torch_compat.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace tiler {
namespace {

constexpr size_t kBucketBytes = 25u << 20;  // gradient all-reduce bucket, as DDP's default

enum class Loss { kCe, kBce, kMse, kDice };

Loss parseLoss(const std::string& name) {
  if (name == "ce") return Loss::kCe;
  if (name == "bce") return Loss::kBce;
  if (name == "mse") return Loss::kMse;
  if (name == "dice") return Loss::kDice;
  TILER_THROW(ConfigError, "--loss must be ce, bce, mse or dice; got '" << name << "'");
}

struct TrainImage {
  std::string image, label;
  ImageInfo info, label_info;
  WindowGrid grid;
  ChannelAdapt adapt = ChannelAdapt::kNone;
  double scale = 1.0;
  int64_t first = 0;  // first window in the pooled list
};

// A window of the pooled list: image and local window index.
struct WindowRef {
  int image = 0;
  int64_t local = 0;
};

class Trainer {
 public:
  explicit Trainer(FinetuneOptions o) : o_(std::move(o)) {}
  int run();

 private:
  void loadData();
  void checkLabels(TrainImage& t);
  void splitValidation();
  // Reads windows into (normalised input, target, valid mask) on the device.
  void makeBatch(const std::vector<WindowRef>& refs, int64_t epoch, torch::Tensor& x, torch::Tensor& target,
                 torch::Tensor& mask);
  torch::Tensor lossOf(const torch::Tensor& out, const torch::Tensor& target, const torch::Tensor& mask);
  void broadcastState();
  bool syncGradients();  // returns false when a gradient is inf/nan (fp16 overflow) on any rank
  std::vector<WindowRef> epochWindows(const std::vector<WindowRef>& pool, int64_t epoch, bool shuffle,
                                      std::vector<bool>* padded);
  nlohmann::json validate();
  double lrAt(double progress) const;
  void saveCheckpoint(int epoch, const nlohmann::json& history);
  int loadCheckpoint(nlohmann::json& history);
  void saveModule(const std::string& path);
  torch::Tensor onComm(const torch::Tensor& t) const { return nccl_ ? t.to(runner_->device()) : t; }

  FinetuneOptions o_;
  WorldInfo world_;
  GridSpec spec_;
  PadMode pad_ = PadMode::kReflect;
  Loss loss_ = Loss::kCe;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<DistContext> dist_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<torch::Tensor> params_;
  ModelProbe probe_;
  std::vector<TrainImage> images_;
  std::vector<WindowRef> train_, val_;
  // Open readers of training images and labels, kept across steps: a PNG is decoded once, not per batch.
  // Bounded: cleared when it reaches kMaxOpenReaders.
  std::map<std::string, std::unique_ptr<ImageReader>> readers_;
  static constexpr size_t kMaxOpenReaders = 64;
  bool nccl_ = false;
  double loss_scale_ = 65536.0;  // fp16 dynamic loss scaling
  int64_t good_steps_ = 0;
  int64_t total_steps_ = 0, step_ = 0;
};

void Trainer::checkLabels(TrainImage& t) {
  const int64_t want_w = probe_.scale.apply(t.info.width), want_h = probe_.scale.apply(t.info.height);
  TILER_CHECK(t.label_info.width == want_w && t.label_info.height == want_h, IoError,
              "'" << t.label << "': label is " << t.label_info.width << "x" << t.label_info.height
                  << " but image '" << t.image << "' needs " << want_w << "x" << want_h
                  << " (model output scale " << probe_.scale.value() << ")");
  if (loss_ == Loss::kMse) {
    TILER_CHECK(t.label_info.channels == probe_.output_channels, IoError,
                "'" << t.label << "': " << t.label_info.channels << " target channel(s), the model outputs "
                    << probe_.output_channels);
    return;
  }
  TILER_CHECK(t.label_info.channels == 1 && t.label_info.type != SampleType::kF32, IoError,
              "'" << t.label << "': class maps must be single-channel integers (u8/u16)");
  // Largest class id, scanned in bands so a large label never sits in memory whole.
  auto reader = ImageReader::open(t.label);
  double max_id = 0;
  for (int64_t y = 0; y < t.label_info.height; y += 256) {
    cv::Mat band =
        reader->readRegion({0, y, t.label_info.width, std::min<int64_t>(256, t.label_info.height - y)});
    double lo = 0, hi = 0;
    cv::minMaxLoc(band.reshape(1), &lo, &hi);
    max_id = std::max(max_id, hi);
  }
  if (loss_ == Loss::kBce) return;  // any non-zero value is foreground
  TILER_CHECK(int64_t(max_id) < probe_.output_channels, IoError,
              "'" << t.label << "': class id " << int64_t(max_id) << " but the model has "
                  << probe_.output_channels << " output channels (classes 0.." << probe_.output_channels - 1
                  << ")");
}

void Trainer::loadData() {
  TILER_CHECK(fs::is_directory(o_.images_dir), ConfigError,
              "--images '" << o_.images_dir << "' is not a directory");
  TILER_CHECK(fs::is_directory(o_.labels_dir), ConfigError,
              "--labels '" << o_.labels_dir << "' is not a directory");
  std::map<std::string, std::string> labels;
  for (const auto& l : listImages({o_.labels_dir}, false)) labels[fs::path(l).stem().string()] = l;
  auto files = listImages({o_.images_dir}, false);
  TILER_CHECK(!files.empty(), ConfigError, "no images in '" << o_.images_dir << "'");
  int64_t total = 0;
  for (const auto& f : files) {
    TrainImage t;
    t.image = f;
    auto it = labels.find(fs::path(f).stem().string());
    TILER_CHECK(it != labels.end(), IoError,
                "'" << f << "': no label with the same stem in '" << o_.labels_dir << "'");
    t.label = it->second;
    t.info = ImageReader::open(f)->info();
    t.label_info = ImageReader::open(t.label)->info();
    t.adapt = channelAdaptation(t.info.channels, probe_.input_channels, f);
    t.scale = defaultScale(t.info.type);
    t.grid = WindowGrid(t.info.width, t.info.height, spec_, probe_.scale);
    checkLabels(t);
    t.first = total;
    total += t.grid.count();
    images_.push_back(std::move(t));
  }
  splitValidation();
}

void Trainer::splitValidation() {
  const int n = int(images_.size());
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(o_.seed);
  for (int i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(rng() % uint64_t(i + 1))]);
  auto windowsOf = [&](int img, std::vector<WindowRef>& into) {
    for (int64_t k = 0; k < images_[size_t(img)].grid.count(); ++k) into.push_back({img, k});
  };
  if (o_.val_fraction <= 0) {
    for (int i = 0; i < n; ++i) windowsOf(i, train_);
  } else if (n >= 2) {
    // Whole images are held out, at least one, never all.
    const int n_val = std::clamp(int(std::lround(o_.val_fraction * n)), 1, n - 1);
    std::vector<bool> is_val(static_cast<size_t>(n), false);
    for (int k = 0; k < n_val; ++k) is_val[size_t(order[size_t(k)])] = true;
    for (int i = 0; i < n; ++i) windowsOf(i, is_val[size_t(i)] ? val_ : train_);
  } else {
    std::vector<WindowRef> all;
    windowsOf(0, all);
    std::vector<size_t> idx(all.size());
    std::iota(idx.begin(), idx.end(), 0);
    for (size_t i = idx.size() - 1; i > 0; --i) std::swap(idx[i], idx[rng() % (i + 1)]);
    const size_t n_val = std::max<size_t>(1, size_t(std::lround(o_.val_fraction * double(all.size()))));
    std::vector<size_t> val_idx(idx.begin(), idx.begin() + long(std::min(n_val, all.size() - 1)));
    std::sort(val_idx.begin(), val_idx.end());
    for (size_t i = 0; i < all.size(); ++i)
      (std::binary_search(val_idx.begin(), val_idx.end(), i) ? val_ : train_).push_back(all[i]);
  }
  TILER_CHECK(!train_.empty(), ConfigError, "no training windows left after the validation split");
}

void Trainer::makeBatch(const std::vector<WindowRef>& refs, int64_t epoch, torch::Tensor& x,
                        torch::Tensor& target, torch::Tensor& mask) {
  const int64_t B = int64_t(refs.size()), H = spec_.window_h, W = spec_.window_w, C = probe_.input_channels;
  if (readers_.size() >= kMaxOpenReaders) readers_.clear();
  const int64_t oh = probe_.scale.apply(H), ow = probe_.scale.apply(W);
  const int64_t tc = loss_ == Loss::kMse ? probe_.output_channels : 1;
  auto pixels = torch::zeros({B, H, W, C}, torch::kFloat32);
  auto scales = torch::ones({B}, torch::kFloat32);
  auto tgt = torch::zeros({B, oh, ow, tc}, torch::kFloat32);
  auto valid = torch::zeros({B, oh, ow}, torch::kFloat32);
  auto reader = [this](const std::string& path) -> ImageReader& {
    auto& r = readers_[path];
    if (!r) r = ImageReader::open(path);
    return *r;
  };
  for (int64_t j = 0; j < B; ++j) {
    const TrainImage& img = images_[size_t(refs[size_t(j)].image)];
    const int64_t local = refs[size_t(j)].local;
    windowToModelInput(readWindow(reader(img.image), img.grid, local, pad_, 0.0), img.adapt,
                       pixels[j].data_ptr<float>());
    scales[j] = float(img.scale);
    // The label window at the output's scale, clipped to the label; outside it the mask is 0.
    Rect r = img.grid.imageWindow(local);
    Rect o{probe_.scale.apply(r.x), probe_.scale.apply(r.y), ow, oh};
    const int64_t x0 = std::max<int64_t>(o.x, 0), y0 = std::max<int64_t>(o.y, 0);
    const int64_t x1 = std::min(o.right(), img.label_info.width),
                  y1 = std::min(o.bottom(), img.label_info.height);
    cv::Mat lab = reader(img.label).readRegion({x0, y0, x1 - x0, y1 - y0});
    cv::Mat labf;
    lab.convertTo(labf, CV_32F);
    if (loss_ == Loss::kBce) cv::threshold(labf, labf, 0.0, 1.0, cv::THRESH_BINARY);
    cv::Mat dst(int(oh), int(ow), CV_MAKETYPE(CV_32F, int(tc)), tgt[j].data_ptr<float>());
    labf.copyTo(dst(cv::Rect(int(x0 - o.x), int(y0 - o.y), labf.cols, labf.rows)));
    valid[j].narrow(0, y0 - o.y, y1 - y0).narrow(1, x0 - o.x, x1 - x0).fill_(1.0f);
  }
  x = runner_->normalize(pixels, scales);
  target = tgt.permute({0, 3, 1, 2}).to(runner_->device());
  mask = valid.to(runner_->device());
  if (o_.augment && epoch >= 0) {
    // Flips and 90-degree turns, the same for image, target and mask; seeded by (seed, epoch, window).
    for (int64_t j = 0; j < B; ++j) {
      const auto& ref = refs[size_t(j)];
      std::mt19937_64 rng(o_.seed * 1000003u + uint64_t(epoch) * 7919u +
                          uint64_t(images_[size_t(ref.image)].first + ref.local));
      const int flip = int(rng() % 4), turns = H == W ? int(rng() % 4) : 0;
      auto apply = [&](torch::Tensor t, int64_t hdim) {
        if (flip & 1) t = t.flip({hdim + 1});
        if (flip & 2) t = t.flip({hdim});
        if (turns) t = t.rot90(turns, {hdim, hdim + 1});
        return t.contiguous();
      };
      x[j] = apply(x[j], 1);
      target[j] = apply(target[j], 1);
      mask[j] = apply(mask[j], 0);
    }
  }
}

torch::Tensor Trainer::lossOf(const torch::Tensor& out, const torch::Tensor& target,
                              const torch::Tensor& mask) {
  namespace F = torch::nn::functional;
  const auto denom = mask.sum().clamp_min(1.0);
  switch (loss_) {
    case Loss::kCe: {
      auto per_px = F::cross_entropy(out, target.squeeze(1).to(torch::kLong),
                                     F::CrossEntropyFuncOptions().reduction(torch::kNone));
      return (per_px * mask).sum() / denom;
    }
    case Loss::kBce: {
      auto logits = out.size(1) == 1 ? out.squeeze(1) : out.select(1, 1) - out.select(1, 0);
      auto per_px = F::binary_cross_entropy_with_logits(
          logits, target.squeeze(1), F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
      return (per_px * mask).sum() / denom;
    }
    case Loss::kMse: {
      auto per_px = (out - target).pow(2).mean(1);
      return (per_px * mask).sum() / denom;
    }
    case Loss::kDice: {
      auto probs = torch::softmax(out, 1) * mask.unsqueeze(1);
      auto onehot =
          F::one_hot(target.squeeze(1).to(torch::kLong), out.size(1)).permute({0, 3, 1, 2}).to(out.dtype()) *
          mask.unsqueeze(1);
      auto inter = (probs * onehot).sum({0, 2, 3});
      auto total = probs.sum({0, 2, 3}) + onehot.sum({0, 2, 3});
      return 1.0 - ((2.0 * inter + 1.0) / (total + 1.0)).mean();
    }
  }
  return {};
}

void Trainer::broadcastState() {
  torch::NoGradGuard ng;
  for (auto& t : params_) {
    auto c = onComm(t.detach().clone());
    dist_->broadcast(c, 0, "the initial parameters");
    t.detach().copy_(c);
  }
  for (const auto& b : runner_->module().buffers(true)) {
    if (!b.is_floating_point() && b.scalar_type() != torch::kLong) continue;
    auto c = onComm(b.detach().clone());
    dist_->broadcast(c, 0, "the initial buffers");
    b.detach().copy_(c);
  }
}

bool Trainer::syncGradients() {
  torch::NoGradGuard ng;
  const double world = double(world_.world_size);
  bool finite = true;
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
    auto bucket = onComm(torch::cat(flat));
    dist_->allreduceSum(bucket, "the gradient all-reduce");
    bucket = bucket.to(params_[start].device()) / world;
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

std::vector<WindowRef> Trainer::epochWindows(const std::vector<WindowRef>& pool, int64_t epoch, bool shuffle,
                                             std::vector<bool>* padded) {
  SamplerOptions so{world_.world_size, world_.rank, shuffle, o_.seed, shuffle && o_.drop_last};
  DistributedSampler sampler(int64_t(pool.size()), so);
  std::vector<WindowRef> out;
  for (const auto& s : sampler.slots(epoch)) {
    out.push_back(pool[size_t(s.index)]);
    if (padded) padded->push_back(s.padded);
  }
  return out;
}

double Trainer::lrAt(double progress) const {
  const double warm = o_.epochs > 0 ? double(o_.warmup_epochs) / double(o_.epochs) : 0.0;
  if (progress < warm) return o_.lr * (progress + 1e-9) / warm;
  if (o_.schedule == "cosine") {
    const double t = warm < 1.0 ? (progress - warm) / (1.0 - warm) : 1.0;
    return o_.lr * 0.5 * (1.0 + std::cos(M_PI * std::min(t, 1.0)));
  }
  return o_.lr;
}

nlohmann::json Trainer::validate() {
  nlohmann::json j = nlohmann::json::object();
  if (val_.empty()) return j;
  torch::NoGradGuard ng;
  runner_->module().eval();
  std::vector<bool> padded;
  auto mine = epochWindows(val_, 0, false, &padded);
  const int64_t classes = loss_ == Loss::kBce ? 2 : probe_.output_channels;
  // Sums over all ranks: loss*pixels, pixels, squared error, per-class intersection / prediction / target.
  auto stats = torch::zeros({3 + 3 * classes}, torch::kDouble);
  const int64_t B = o_.batch_size;
  for (size_t s = 0; s < mine.size(); s += size_t(B)) {
    std::vector<WindowRef> refs(mine.begin() + long(s),
                                mine.begin() + long(std::min(mine.size(), s + size_t(B))));
    torch::Tensor x, target, mask;
    makeBatch(refs, -1, x, target, mask);
    for (size_t k = 0; k < refs.size(); ++k)
      if (padded[s + k]) mask[int64_t(k)].zero_();  // a duplicate counts once
    auto out = runner_->apply(x);
    const double pixels = mask.sum().item<double>();
    stats[0] += lossOf(out, target, mask).item<double>() * pixels;
    stats[1] += pixels;
    if (loss_ == Loss::kMse) {
      stats[2] += ((out - target).pow(2).mean(1) * mask).sum().item<double>();
      continue;
    }
    torch::Tensor pred;
    if (loss_ == Loss::kBce) {
      auto logits = out.size(1) == 1 ? out.squeeze(1) : out.select(1, 1) - out.select(1, 0);
      pred = (logits > 0).to(torch::kLong);
    } else {
      pred = out.argmax(1);
    }
    auto truth = target.squeeze(1).to(torch::kLong);
    auto m = mask > 0;
    for (int64_t c = 0; c < classes; ++c) {
      auto p = (pred == c) & m, t = (truth == c) & m;
      stats[3 + 3 * c] += (p & t).sum().item<double>();
      stats[4 + 3 * c] += p.sum().item<double>();
      stats[5 + 3 * c] += t.sum().item<double>();
    }
  }
  auto comm = onComm(stats);
  dist_->allreduceSum(comm, "the validation metrics");
  stats = comm.cpu();
  auto a = stats.accessor<double, 1>();
  const double pixels = std::max(a[1], 1.0);
  j["val_loss"] = a[0] / pixels;
  if (loss_ == Loss::kMse) {
    j["val_psnr"] = 10.0 * std::log10(1.0 / std::max(a[2] / pixels, 1e-12));  // targets in [0,1]
  } else {
    double iou = 0, dice = 0;
    int present = 0;
    for (int64_t c = 0; c < classes; ++c) {
      const double inter = a[3 + 3 * c], pred = a[4 + 3 * c], truth = a[5 + 3 * c];
      if (pred + truth == 0) continue;  // a class absent from both counts for neither metric
      iou += inter / (pred + truth - inter);
      dice += 2 * inter / (pred + truth);
      ++present;
    }
    j["val_iou"] = present ? iou / present : 0.0;
    j["val_dice"] = present ? dice / present : 0.0;
  }
  runner_->module().train();
  return j;
}

void Trainer::saveModule(const std::string& path) {
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  runner_->module().eval();
  const std::string tmp = path + ".partial";
  try {
    runner_->module().save(tmp);
  } catch (const std::exception& e) {
    TILER_THROW(IoError, "'" << path << "': cannot save the model: " << e.what());
  }
  runner_->module().train();
  TILER_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, IoError,
              "'" << path << "': rename failed: " << std::strerror(errno));
}

void Trainer::saveCheckpoint(int epoch, const nlohmann::json& history) {
  if (o_.checkpoint_dir.empty() || world_.rank != 0) return;
  const fs::path dir(o_.checkpoint_dir);
  fs::create_directories(dir);
  // Model and optimizer first, the state file last: a checkpoint counts only once state.json names its epoch.
  saveModule((dir / "model.pt").string());
  const std::string opt = (dir / "optimizer.pt").string();
  torch::save(*optimizer_, opt + ".partial");
  TILER_CHECK(std::rename((opt + ".partial").c_str(), opt.c_str()) == 0, IoError,
              "'" << opt << "': rename failed");
  nlohmann::json state = {{"epoch", epoch}, {"loss_scale", loss_scale_}, {"good_steps", good_steps_},
                          {"step", step_},  {"seed", o_.seed},           {"history", history}};
  writeJsonAtomically((dir / "state.json").string(), state);
}

int Trainer::loadCheckpoint(nlohmann::json& history) {
  const fs::path dir(o_.checkpoint_dir);
  if (!o_.resume || o_.checkpoint_dir.empty() || !fs::exists(dir / "state.json")) {
    TILER_CHECK(!o_.resume || !o_.checkpoint_dir.empty(), ConfigError, "--resume needs --checkpoint_dir");
    if (o_.resume && world_.rank == 0)
      spdlog::info("no checkpoint in '{}': starting fresh", o_.checkpoint_dir);
    return 0;
  }
  std::ifstream in(dir / "state.json");
  auto state = nlohmann::json::parse(in);
  auto saved = loadTorchScript((dir / "model.pt").string(), runner_->device());
  {
    torch::NoGradGuard ng;
    auto src = saved.parameters();
    auto it = src.begin();
    for (auto& p : params_) p.detach().copy_((*it++).detach());
    auto dst_buffers = runner_->module().buffers(true);
    auto src_buffers = saved.buffers(true);
    auto sb = src_buffers.begin();
    for (const auto& b : dst_buffers) b.detach().copy_((*sb++).detach());
  }
  torch::load(*optimizer_, (dir / "optimizer.pt").string());
  loss_scale_ = state["loss_scale"].get<double>();
  good_steps_ = state["good_steps"].get<int64_t>();
  step_ = state["step"].get<int64_t>();
  history = state["history"];
  const int epoch = state["epoch"].get<int>();
  if (world_.rank == 0) spdlog::info("resuming after epoch {} from '{}'", epoch, o_.checkpoint_dir);
  return epoch;
}

int Trainer::run() {
  const auto start = Clock::now();
  world_ = joinWorld();
  std::tie(spec_.window_w, spec_.window_h) = parseWindowSize(o_.window);
  parseOverlap(o_.overlap, spec_);
  pad_ = parsePadMode(o_.pad);
  loss_ = parseLoss(o_.loss);
  TILER_CHECK(o_.epochs >= 1 && o_.batch_size >= 1 && o_.lr > 0, ConfigError,
              "--epochs, --batch_size and --lr must be positive");
  TILER_CHECK(o_.val_fraction >= 0 && o_.val_fraction < 1, ConfigError, "--val_fraction must be in [0,1)");
  TILER_CHECK(o_.schedule == "constant" || o_.schedule == "cosine", ConfigError,
              "--schedule: constant or cosine");
  if (o_.model.empty()) o_.model = bundledSamplesDir() + "/models/sample.pt";
  if (o_.report.empty()) o_.report = o_.output + ".report.json";

  ModelOptions mo;
  mo.path = o_.model;
  mo.device = o_.device;
  mo.precision = o_.precision;
  mo.threads = o_.threads;
  mo.local_rank = world_.local_rank;
  runner_ = std::make_unique<ModelRunner>(mo);
  probe_ = runner_->probe(spec_.window_w, spec_.window_h);
  runner_->module().train();
  for (const auto& p : runner_->module().parameters(true)) {
    p.set_requires_grad(true);
    params_.push_back(p);
  }
  TILER_CHECK(!params_.empty(), ModelError, "'" << o_.model << "': the model has no parameters to train");
  if (o_.optimizer == "adam") {
    optimizer_ = std::make_unique<torch::optim::Adam>(
        params_, torch::optim::AdamOptions(o_.lr).weight_decay(o_.weight_decay));
  } else if (o_.optimizer == "sgd") {
    optimizer_ = std::make_unique<torch::optim::SGD>(
        params_, torch::optim::SGDOptions(o_.lr).momentum(o_.momentum).weight_decay(o_.weight_decay));
  } else {
    TILER_THROW(ConfigError, "--optimizer must be adam or sgd; got '" << o_.optimizer << "'");
  }

  DistOptions dopts;
  dopts.backend = o_.backend;
  dopts.timeout = std::chrono::milliseconds(int64_t(o_.timeout * 1000));
  dist_ = std::make_unique<DistContext>(world_, dopts, runner_->device());
  nccl_ = dist_->backendName() == "nccl";
  loadData();
  nlohmann::json history = nlohmann::json::array();
  const int first_epoch = loadCheckpoint(history);
  broadcastState();

  const bool fp16 = runner_->precision() == Precision::kFp16;
  const int64_t B = o_.batch_size;
  const int64_t per_rank = int64_t(epochWindows(train_, 0, true, nullptr).size());
  const int64_t steps_per_epoch = o_.drop_last ? std::max<int64_t>(1, per_rank / B) : (per_rank + B - 1) / B;
  total_steps_ = steps_per_epoch * o_.epochs;
  if (world_.rank == 0)
    spdlog::info(
        "finetune: {} train / {} val windows of {}x{}, {} rank(s), {} step(s) per epoch, loss {}, {} {}",
        train_.size(), val_.size(), spec_.window_w, spec_.window_h, world_.world_size, steps_per_epoch,
        o_.loss, o_.optimizer, precisionName(runner_->precision()));

  double sync_seconds = 0, step_seconds = 0;
  Progress progress(total_steps_, "steps", !o_.no_progress && world_.rank == 0);
  for (int epoch = first_epoch + 1; epoch <= o_.epochs; ++epoch) {
    const auto t0 = Clock::now();
    auto mine = epochWindows(train_, epoch, true, nullptr);
    double loss_sum = 0;
    int64_t counted = 0;
    for (int64_t s = 0; s < steps_per_epoch; ++s) {
      const auto ts = Clock::now();
      const size_t lo = size_t(s * B), hi = std::min(mine.size(), size_t((s + 1) * B));
      std::vector<WindowRef> refs(mine.begin() + long(lo), mine.begin() + long(hi));
      for (auto& g : optimizer_->param_groups())
        static_cast<torch::optim::OptimizerOptions&>(g.options())
            .set_lr(lrAt(double(step_) / double(total_steps_)));
      torch::Tensor x, target, mask;
      makeBatch(refs, epoch, x, target, mask);
      optimizer_->zero_grad();
      torch::Tensor loss = lossOf(runner_->apply(x), target, mask);
      (fp16 ? loss * loss_scale_ : loss).backward();
      const auto tsync = Clock::now();
      const bool finite = syncGradients();
      sync_seconds += std::chrono::duration<double>(Clock::now() - tsync).count();
      if (fp16) {
        torch::NoGradGuard ng;
        if (!finite) {
          loss_scale_ /= 2;
          good_steps_ = 0;
          if (world_.rank == 0) spdlog::warn("fp16 overflow: step skipped, loss scale now {}", loss_scale_);
          ++step_;
          continue;
        }
        for (auto& p : params_) p.mutable_grad().div_(loss_scale_);
        if (++good_steps_ % 2000 == 0) loss_scale_ *= 2;
      }
      optimizer_->step();
      loss_sum += loss.item<double>();
      ++counted;
      ++step_;
      progress.update(step_);
      step_seconds += std::chrono::duration<double>(Clock::now() - ts).count();
    }
    auto train_loss = onComm(torch::tensor({loss_sum, double(counted)}, torch::kDouble));
    dist_->allreduceSum(train_loss, "the training loss");
    train_loss = train_loss.cpu();
    nlohmann::json e = {
        {"epoch", epoch},
        {"train_loss", train_loss[0].item<double>() / std::max(1.0, train_loss[1].item<double>())}};
    e.update(validate());
    e["seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
    history.push_back(e);
    if (world_.rank == 0) {
      std::string metrics;
      for (const char* k : {"val_loss", "val_iou", "val_dice", "val_psnr"})
        if (e.contains(k)) metrics += fmt::format(", {} {:.4f}", k, e[k].get<double>());
      if (!o_.no_progress)
        std::cout << fmt::format("epoch {}/{}: train_loss {:.4f}{} ({:.1f} s)", epoch, o_.epochs,
                                 e["train_loss"].get<double>(), metrics, e["seconds"].get<double>())
                  << std::endl;
    }
    saveCheckpoint(epoch, history);
  }
  // Data parallelism promises identical parameters on every rank: check it rather than trust it.
  double checksum = 0;
  for (const auto& p : params_) checksum += p.detach().to(torch::kDouble).abs().sum().item<double>();
  auto sums = dist_->allgather(onComm(torch::tensor({checksum}, torch::kDouble)), "the parameter checksum");
  for (size_t r = 0; r < sums.size(); ++r)
    TILER_CHECK(sums[r].cpu().item<double>() == checksum, DistError,
                "rank " << r << " holds different parameters after training (checksum "
                        << sums[r].cpu().item<double>() << " vs " << checksum << ")");
  if (world_.rank == 0) {
    saveModule(o_.output);
    nlohmann::json report = {{"world_size", world_.world_size},
                             {"epochs", history},
                             {"output", o_.output},
                             {"seconds", std::chrono::duration<double>(Clock::now() - start).count()},
                             {"step_seconds", step_seconds},
                             {"sync_seconds", sync_seconds},
                             {"steps", step_},
                             {"parameter_checksum", checksum}};
    writeJsonAtomically(o_.report, report);
    spdlog::info("finetune: wrote '{}' and '{}'", o_.output, o_.report);
  }
  dist_->barrier("the end of training");
  return kExitOk;
}

}  // namespace

int runFinetune(const FinetuneOptions& options) {
  return Trainer(options).run();
}

}  // namespace tiler
