#include "tiler/finetune/finetune.hpp"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <torch/nn/functional.h>
#include <torch/optim.h>
#include <torch/script.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>

#include "tiler/core/error.hpp"
#include "tiler/core/fault.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/core/sampler.hpp"
#include "tiler/dist/dist.hpp"
#include "tiler/dist/exchange.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/dist/report.hpp"
#include "tiler/dist/session.hpp"
#include "tiler/finetune/train_metrics.hpp"
#include "tiler/io/annotations.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/io/polygons.hpp"
#include "tiler/model/model.hpp"
#include "tiler/model/model_runtime.hpp"
#include "tiler/model/torch_compat.hpp"
#include "tiler/tasks/registry.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace tiler {
namespace {

constexpr size_t kBucketBytes = 25u << 20;  // gradient all-reduce bucket, as DDP's default

enum class Loss { kCe, kBce, kMse, kDice };
constexpr int64_t kIgnore = -100;  // cross-entropy's ignore index (PyTorch's default) for uncounted pixels

Loss parseLoss(const std::string& name) {
  if (name == "ce") return Loss::kCe;
  if (name == "bce") return Loss::kBce;
  if (name == "mse") return Loss::kMse;
  if (name == "dice") return Loss::kDice;
  TILER_THROW(ConfigError, "--loss must be ce, bce, mse or dice; got '" << name << "'");
}

// One batch as the window loader reads it: CPU tensors, not yet normalised.
struct TrainBatch {
  torch::Tensor pixels;  // [B,C,H,W] raw values: uint8 (every image of 8-bit samples) or float32
  torch::Tensor scales;  // float32 [B]
  torch::Tensor target;  // float32 [B,h,w,tc]
  torch::Tensor valid;   // float32 [B,h,w]: 1 where the label covers the output
};

// A window of the pooled list: image, grid window index and its index in the catalog's global list.
struct WindowRef {
  int image = 0;
  int64_t local = 0;
  int64_t global = 0;
};

class Trainer {
 public:
  explicit Trainer(FinetuneOptions o) : o_(std::move(o)) {}
  int run();

 private:
  // The phases of run(), in order.
  void validateOptions();
  void validateLabelOptions();  // labels, classes, weights
  void validateWindowLabelOptions();
  void parseClassWeights();  // --class_weights w1,w2,... (auto: computeClassWeights)
  void loadModel();          // the model in training mode, its parameters and the optimiser
  void connect();            // the process group, the checkpoint directory's lock and the data, on every rank
  int resumeEpoch(nlohmann::json& history);  // the last epoch done (0: none), its state loaded everywhere
  void planSteps();
  void trainEpoch(int epoch, nlohmann::json& history, Progress& progress);
  // One optimiser step: `micros` micro-batches' gradients summed, synchronised and applied (or skipped on
  // an fp16 overflow). Adds the micro-batches' losses to `loss_sum`, their count to `counted`.
  void trainStep(int epoch, int64_t s, const std::vector<WindowRef>& mine, WindowLoader& loader,
                 double& loss_sum, int64_t& counted);
  int finishRun(const nlohmann::json& history);
  // Micro-batch `micro` of this rank's windows of an epoch.
  std::vector<WindowRef> microBatch(const std::vector<WindowRef>& mine, int64_t micro) const;
  int rank() const { return session_->rank(); }
  StepExchange& exchange() { return session_->exchange(); }

  void loadData();
  // --window_labels: the class of every row's window of image `image_id` (rows naming it by file name or
  // stem), into window_classes_; a row that is no window to train on is an IoError naming its line.
  void assignWindowLabels(int image_id);
  bool perWindow() const { return !o_.window_labels.empty(); }
  // A window's target as the loader holds it: [h,w,c] at the output's scale; 1x1x1 for a window label.
  struct LabelShape {
    int64_t h, w, c;
  };
  LabelShape labelShape() const;
  // The images of `images_dir` with their labels (label images or annotations), held out when `held_out`.
  void addImages(const std::string& images_dir, const std::string& labels_dir, const std::string& annotations,
                 bool held_out);
  // The labels of one window at the output's scale into target [h,w,tc] and valid [h,w] (1: counted).
  void readLabels(const CatalogImage& img, int image_id, int64_t local, ReaderCache& readers, float* target,
                  float* valid);
  // --class_weights auto: inverse frequency over the training windows' labelled pixels (every rank's share).
  void computeClassWeights();
  // Rank 0, after each epoch: the CSV and the plot of the epochs, and --save_best's model.
  void writeEpochOutputs(int epoch, const nlohmann::json& history);
  std::string csvPath() const { return o_.output + ".epochs.csv"; }
  std::string plotPath() const { return o_.output + ".curves.png"; }
  std::string bestPath() const { return o_.output + ".best.pt"; }
  // Rank 0's outputs (-o, --report, the checkpoints and their lock) are none of the files training reads
  // (the model, images, labels) nor each other: a ConfigError naming the clash.
  void checkWrittenPaths() const;
  void checkLabels(const CatalogImage& t);
  void splitValidation();
  // The window loader inference reads with (the same readers, read-ahead and byte batches), over `windows`
  // in batches of --batch_size, reading each window's labels beside its pixels (readers of `labels`);
  // `count_for_fault`: the reads count towards TILER_FAULT's window count (training's).
  std::unique_ptr<WindowLoader> loaderFor(const std::vector<WindowRef>& windows, ReaderCache& labels,
                                          bool count_for_fault);
  // The loader's next batch, its first `n` slots; a window that failed to read throws its error as thrown.
  TrainBatch nextBatch(WindowLoader& loader, int64_t n);
  // The batch on the device: normalised input, target, valid mask; augmented when epoch >= 0.
  void toDevice(const TrainBatch& batch, const std::vector<WindowRef>& refs, int64_t epoch, torch::Tensor& x,
                torch::Tensor& target, torch::Tensor& mask);
  torch::Tensor lossOf(const torch::Tensor& out, const torch::Tensor& target, const torch::Tensor& mask);
  void broadcastState();
  bool syncGradients();  // returns false when a gradient is inf/nan (fp16 overflow) on any rank
  std::vector<WindowRef> epochWindows(const std::vector<WindowRef>& pool, int64_t epoch, bool shuffle,
                                      std::vector<bool>* padded);
  nlohmann::json validate();
  double lrAt(double progress) const;
  void saveCheckpoint(int epoch, const nlohmann::json& history);
  // The last complete checkpoint's epoch in checkpoint_dir (0: none), as this rank sees it.
  int latestCheckpoint() const;
  void loadCheckpoint(int epoch, nlohmann::json& history);
  void saveModule(torch::jit::Module& module, const std::string& path);
  std::string epochDir(int epoch) const;

  FinetuneOptions o_;
  std::unique_ptr<RankSession> session_;  // from run() on
  GridSpec spec_;
  PadMode pad_ = PadMode::kReflect;
  Loss loss_ = Loss::kCe;
  FaultHooks faults_;  // TILER_FAULT, this rank's
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<torch::Tensor> params_;
  ModelProbe probe_;
  WindowCatalog catalog_;
  std::vector<WindowRef> train_, val_;
  std::vector<bool> held_out_;  // by image id: a --val_images image
  // By image id: its annotations (null: a label image), read once, then only read by any thread.
  std::vector<std::shared_ptr<const AnnotationLabels>> annotations_;
  std::vector<std::string> class_names_;  // --classes, else class_0.. (the metrics' keys)
  // --window_labels: its rows, whether an image took each, and by image id each labelled grid window's class.
  std::vector<WindowLabel> window_rows_;
  std::vector<bool> row_used_;
  std::vector<std::map<int64_t, int>> window_classes_;
  torch::Tensor class_weights_;  // float32 [K] on the device; undefined: none
  // Open readers of images and labels, kept across steps (a PNG is decoded once, not per batch): one cache
  // for the read-ahead thread, one for validation on the main thread.
  ReaderCache train_readers_, val_readers_;
  LossScaler scaler_;     // dynamic loss scaling (fp16, or --loss_scale)
  bool scaling_ = false;  // whether losses are scaled
  int64_t total_steps_ = 0, step_ = 0;
  int64_t micro_per_epoch_ = 0, steps_per_epoch_ = 0;  // this rank's micro-batches, the optimiser's steps
  double sync_seconds_ = 0, step_seconds_ = 0;         // for the report
};

void Trainer::checkLabels(const CatalogImage& t) {
  const int64_t want_w = probe_.scale.apply(t.info.width), want_h = probe_.scale.apply(t.info.height);
  TILER_CHECK(t.label_info.width == want_w && t.label_info.height == want_h, IoError,
              "'" << t.label << "': label is " << t.label_info.width << "x" << t.label_info.height
                  << " but image '" << t.input << "' needs " << want_w << "x" << want_h
                  << " (model output scale " << probe_.scale.value() << ")");
  if (loss_ == Loss::kMse) {
    TILER_CHECK(t.label_info.channels == probe_.output_channels, IoError,
                "'" << t.label << "': " << t.label_info.channels << " target channel(s), the model outputs "
                    << probe_.output_channels);
    return;
  }
  TILER_CHECK(t.label_info.channels == 1 && t.label_info.type != SampleType::kF32 &&
                  t.label_info.type != SampleType::kF16,
              IoError, "'" << t.label << "': class maps must be single-channel integers (u8/u16)");
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
  if (perWindow()) {
    window_rows_ = readWindowLabels(o_.window_labels, class_names_);
    row_used_.assign(window_rows_.size(), false);
  }
  addImages(o_.images_dir, o_.labels_dir, o_.annotations, false);
  if (!o_.val_images.empty()) addImages(o_.val_images, o_.val_labels, o_.val_annotations, true);
  for (size_t i = 0; i < window_rows_.size(); ++i)
    TILER_CHECK(row_used_[i], IoError,
                "window labels '" << o_.window_labels << "' line " << window_rows_[i].line << ": image '"
                                  << window_rows_[i].image << "' is none of --images"
                                  << (o_.val_images.empty() ? "" : " or --val_images")
                                  << " (a file name or stem)");
  splitValidation();
}

void Trainer::assignWindowLabels(int image_id) {
  const CatalogImage& img = catalog_.image(image_id);
  const std::string name = fs::path(img.input).filename().string(),
                    stem = fs::path(img.input).stem().string();
  std::map<std::pair<int64_t, int64_t>, int64_t> corners;  // the windows to train on, by top-left corner
  for (int64_t k = 0; k < img.plannedWindows(); ++k) {
    const Rect r = img.grid.imageWindow(img.gridWindow(k));
    corners[{r.x, r.y}] = img.gridWindow(k);
  }
  auto& classes = window_classes_[size_t(image_id)];
  for (size_t i = 0; i < window_rows_.size(); ++i) {
    const WindowLabel& row = window_rows_[i];
    if (row.image != name && row.image != stem) continue;
    const auto where = "window labels '" + o_.window_labels + "' line " + std::to_string(row.line) + ": ";
    // Level-0 corners at the processing resolution, to the nearest pixel.
    const double d = img.resolution.downsample;
    const auto it = corners.find({std::llround(row.x / d), std::llround(row.y / d)});
    TILER_CHECK(it != corners.end(), IoError,
                where << "(" << row.x << ", " << row.y << ") of '" << img.input
                      << "' is not the level-0 top-left corner of a window of --window " << o_.window
                      << " --overlap " << o_.overlap << " at the processing resolution"
                      << (img.masked ? " inside the mask or --roi" : ""));
    TILER_CHECK(row.label < probe_.output_channels, IoError,
                where << "class " << row.label << " but the model has " << probe_.output_channels
                      << " classes (0.." << probe_.output_channels - 1 << ")");
    classes[it->second] = row.label;
    row_used_[i] = true;
  }
}

Trainer::LabelShape Trainer::labelShape() const {
  if (perWindow()) return {1, 1, 1};
  return {probe_.scale.apply(spec_.window_h), probe_.scale.apply(spec_.window_w),
          loss_ == Loss::kMse ? probe_.output_channels : 1};
}

void Trainer::addImages(const std::string& images_dir, const std::string& labels_dir,
                        const std::string& annotations, bool held_out) {
  const char* images_flag = held_out ? "--val_images" : "--images";
  TILER_CHECK(fs::is_directory(images_dir), ConfigError,
              images_flag << " '" << images_dir << "' is not a directory");
  std::map<std::string, std::string> labels;
  const bool label_images = annotations.empty() && !perWindow();
  if (label_images) {
    TILER_CHECK(fs::is_directory(labels_dir), ConfigError,
                (held_out ? "--val_labels" : "--labels") << " '" << labels_dir << "' is not a directory");
    for (const auto& l : listImages({labels_dir}, false)) labels[fs::path(l).stem().string()] = l;
  }
  auto files = listImages({images_dir}, false);
  TILER_CHECK(!files.empty(), ConfigError, "no images in '" << images_dir << "'");
  TILER_CHECK(annotations.empty() || files.size() == 1 || fs::is_directory(annotations), ConfigError,
              "'" << annotations << "': one annotation file is for one image; " << images_flag << " has "
                  << files.size() << " (give a directory of <stem>.geojson)");
  // Annotations are also the region windows are drawn from (as --roi is for infer).
  const CatalogSpec spec{spec_,
                         probe_.input_channels,
                         probe_.scale,
                         o_.scale,
                         parseMaskSpec(o_.mask, o_.mask_fraction, annotations.empty() ? o_.roi : annotations),
                         ResolutionSpec{o_.level, o_.mpp, o_.magnification, o_.input_mpp},
                         true,
                         parseChannelList(o_.channels)};
  for (const auto& f : files) {
    std::shared_ptr<const AnnotationLabels> vector_labels;
    std::string label = o_.window_labels;
    if (label_images) {
      auto it = labels.find(fs::path(f).stem().string());
      TILER_CHECK(it != labels.end(), IoError,
                  "'" << f << "': no label with the same stem in '" << labels_dir << "'");
      label = it->second;
    } else if (!perWindow()) {
      label = roiFileFor(annotations, f);
      TILER_CHECK(fs::is_regular_file(label), IoError, "'" << f << "': no annotations '" << label << "'");
    }
    CatalogImage t = WindowCatalog::describe(f, spec);
    // Training needs every pair: a bad one stops the run (on every rank) rather than train on less.
    TILER_CHECK(t.status == "ok", IoError, t.error);
    t.label = label;
    if (label_images) {
      t.label_info = ImageReader::open(t.label)->info();
      checkLabels(t);
    } else if (!perWindow()) {
      vector_labels = std::make_shared<AnnotationLabels>(AnnotationLabels::read(label, t.info, class_names_));
    }
    catalog_.add(std::move(t), true);
    annotations_.push_back(std::move(vector_labels));
    held_out_.push_back(held_out);
    window_classes_.emplace_back();
    if (perWindow()) assignWindowLabels(int(catalog_.images().size()) - 1);
  }
}

void Trainer::splitValidation() {
  const int n = int(catalog_.images().size());
  auto windowsOf = [&](int img, std::vector<WindowRef>& into) {
    const CatalogImage& image = catalog_.image(img);
    const auto& labelled = window_classes_[size_t(img)];
    for (int64_t k = 0; k < image.plannedWindows(); ++k)
      // Window labels: only labelled windows, unless the others are class 0 (--unlabeled background).
      if (!perWindow() || o_.unlabeled == "background" || labelled.count(image.gridWindow(k)))
        into.push_back({img, image.gridWindow(k), image.first_window + k});
  };
  if (!o_.val_images.empty()) {
    for (int i = 0; i < n; ++i) windowsOf(i, held_out_[size_t(i)] ? val_ : train_);
    TILER_CHECK(!train_.empty(), ConfigError, "no training windows (no annotated window of the images?)");
    return;
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(o_.seed);
  for (int i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(rng() % uint64_t(i + 1))]);
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
    TILER_CHECK(!all.empty(), ConfigError, "no training windows (no annotated window of the image?)");
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

std::unique_ptr<WindowLoader> Trainer::loaderFor(const std::vector<WindowRef>& windows, ReaderCache& labels,
                                                 bool count_for_fault) {
  LoaderOptions lo;
  lo.batch_size = o_.batch_size;
  lo.input_channels = probe_.input_channels;
  lo.pad = pad_;
  lo.depth = size_t(o_.prefetch);
  lo.read_threads = 1;  // `labels` is one thread's reader cache
  lo.pinned = runner_->device().is_cuda();
  lo.bytes = inputAsBytes(catalog_);
  lo.device = runner_->device();
  lo.in_order = false;  // shuffled: readers stay open across images
  const auto [oh, ow, tc] = labelShape();
  lo.make_labels = [oh = oh, ow = ow, tc = tc](int64_t B) {
    return std::vector<torch::Tensor>{torch::zeros({B, oh, ow, tc}, torch::kFloat32),
                                      torch::zeros({B, oh, ow}, torch::kFloat32)};
  };
  lo.read_labels = [this, &labels, count_for_fault](std::vector<torch::Tensor>& out, int64_t j, int image_id,
                                                    int64_t local) {
    const CatalogImage& img = catalog_.image(image_id);
    if (count_for_fault && faults_.before_read) faults_.before_read(img.label);
    readLabels(img, image_id, local, labels, out[0][j].data_ptr<float>(), out[1][j].data_ptr<float>());
  };
  // Every window of an epoch is trained on, a sampler's repeat too (as PyTorch's DistributedSampler's).
  std::vector<SampleSlot> slots;
  for (const auto& w : windows) slots.push_back({w.global, false});
  const int64_t steps = (int64_t(windows.size()) + o_.batch_size - 1) / o_.batch_size;
  return std::make_unique<WindowLoader>(catalog_, spec_, std::move(lo), std::move(slots), steps);
}

TrainBatch Trainer::nextBatch(WindowLoader& loader, int64_t n) {
  auto batch = loader.next();
  TILER_CHECK(batch.has_value(), DistError, "the read-ahead stopped early");
  if (batch->first_error) std::rethrow_exception(batch->first_error);
  TILER_CHECK(batch->failures.empty(), IoError, batch->failures.front().second);
  return {batch->pixels.narrow(0, 0, n), batch->scales.narrow(0, 0, n), batch->labels[0].narrow(0, 0, n),
          batch->labels[1].narrow(0, 0, n)};
}

void Trainer::readLabels(const CatalogImage& img, int image_id, int64_t local, ReaderCache& readers,
                         float* target, float* valid) {
  if (perWindow()) {
    const auto& classes = window_classes_[size_t(image_id)];
    const auto it = classes.find(local);
    target[0] = it == classes.end() ? 0.0f : float(it->second);
    valid[0] = it != classes.end() || o_.unlabeled == "background" ? 1.0f : 0.0f;
    return;
  }
  const auto [oh, ow, tc] = labelShape();
  // The label window at the output's scale, clipped to the image; outside it the mask is 0.
  Rect r = img.grid.imageWindow(local);
  Rect o{probe_.scale.apply(r.x), probe_.scale.apply(r.y), ow, oh};
  const AnnotationLabels* vector_labels = annotations_[size_t(image_id)].get();
  const int64_t label_w = vector_labels ? probe_.scale.apply(img.info.width) : img.label_info.width,
                label_h = vector_labels ? probe_.scale.apply(img.info.height) : img.label_info.height;
  const int64_t x0 = std::max<int64_t>(o.x, 0), y0 = std::max<int64_t>(o.y, 0);
  const int64_t x1 = std::min(o.right(), label_w), y1 = std::min(o.bottom(), label_h);
  cv::Mat dst(int(oh), int(ow), CV_MAKETYPE(CV_32F, int(tc)), target);
  cv::Mat counted(int(oh), int(ow), CV_32F, valid);
  const cv::Rect inside(int(x0 - o.x), int(y0 - o.y), int(x1 - x0), int(y1 - y0));
  if (vector_labels) {
    // Drawn at the output's resolution: output pixels per level-0 pixel.
    cv::Mat classes, covered;
    vector_labels->rasterize(o, probe_.scale.value() / img.resolution.downsample, classes, covered);
    if (loss_ == Loss::kBce) cv::threshold(classes, classes, 0.0, 1.0, cv::THRESH_BINARY);
    classes(inside).copyTo(dst(inside));
    if (o_.unlabeled == "background")
      counted(inside).setTo(1.0f);  // unannotated pixels are class 0
    else
      covered(inside).copyTo(counted(inside));
    return;
  }
  cv::Mat lab = readers.get(img.label).readRegion({x0, y0, x1 - x0, y1 - y0});
  cv::Mat labf;
  lab.convertTo(labf, CV_32F);
  if (loss_ == Loss::kBce) cv::threshold(labf, labf, 0.0, 1.0, cv::THRESH_BINARY);
  labf.copyTo(dst(inside));
  counted(inside).setTo(1.0f);
}

void Trainer::toDevice(const TrainBatch& b, const std::vector<WindowRef>& refs, int64_t epoch,
                       torch::Tensor& x, torch::Tensor& target, torch::Tensor& mask) {
  const int64_t B = int64_t(refs.size()), H = spec_.window_h, W = spec_.window_w;
  x = runner_->normalize(b.pixels, b.scales);
  target = b.target.permute({0, 3, 1, 2}).to(runner_->device());
  mask = b.valid.to(runner_->device());
  if (o_.augment && epoch >= 0) {
    // Flips and 90-degree turns, the same for image, target and mask; seeded by (seed, epoch, window).
    for (int64_t j = 0; j < B; ++j) {
      const auto& ref = refs[size_t(j)];
      std::mt19937_64 rng(o_.seed * 1000003u + uint64_t(epoch) * 7919u +
                          uint64_t(catalog_.image(ref.image).first_window + ref.local));
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
      // A map's pixels, or a [B,K] model's windows (its target and mask [B,1,1,1] and [B,1,1]).
      const bool windows = out.dim() == 2;
      const auto m = windows ? mask.reshape({-1}) : mask;
      // Uncounted pixels take the ignore index: one fused loss kernel, no per-pixel tensor to weigh and mask.
      const auto truth =
          (windows ? target.reshape({-1}) : target.squeeze(1)).to(torch::kLong).masked_fill(m == 0, kIgnore);
      auto options = F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnore);
      // Each counted pixel's loss times its class's weight (a sum: PyTorch divides by the weights only for
      // a mean), over the counted pixels: not PyTorch's division by the batch's weight sum, which differs
      // between ranks' batches, so that K ranks' batches still average to the step of one batch of them all.
      if (class_weights_.defined()) options.weight(class_weights_);
      return F::cross_entropy(out, truth, options) / denom;
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
      auto dice = (2.0 * inter + 1.0) / (total + 1.0);
      if (!class_weights_.defined()) return 1.0 - dice.mean();
      return 1.0 - (dice * class_weights_).sum() / class_weights_.sum().clamp_min(1e-12);
    }
  }
  return {};
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

std::vector<WindowRef> Trainer::epochWindows(const std::vector<WindowRef>& pool, int64_t epoch, bool shuffle,
                                             std::vector<bool>* padded) {
  SamplerOptions so{session_->world().world_size, rank(), shuffle, o_.seed, shuffle && o_.drop_last};
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
  auto failure = captureFailure([&] {
    auto loader = loaderFor(mine, val_readers_, false);
    for (size_t s = 0; s < mine.size(); s += size_t(B)) {
      std::vector<WindowRef> refs(mine.begin() + long(s),
                                  mine.begin() + long(std::min(mine.size(), s + size_t(B))));
      torch::Tensor x, target, mask;
      toDevice(nextBatch(*loader, int64_t(refs.size())), refs, -1, x, target, mask);
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
      auto truth = (perWindow() ? target.reshape({-1}) : target.squeeze(1)).to(torch::kLong);
      auto m = (perWindow() ? mask.reshape({-1}) : mask) > 0;
      for (int64_t c = 0; c < classes; ++c) {
        auto p = (pred == c) & m, t = (truth == c) & m;
        stats[3 + 3 * c] += (p & t).sum().item<double>();
        stats[4 + 3 * c] += p.sum().item<double>();
        stats[5 + 3 * c] += t.sum().item<double>();
      }
    }
  });
  exchange().check(failure, "the validation status");
  exchange().allreduceSum(stats, "the validation metrics");
  auto a = stats.accessor<double, 1>();
  const double pixels = std::max(a[1], 1.0);
  j["val_loss"] = a[0] / pixels;
  if (loss_ == Loss::kMse) {
    j["val_psnr"] = 10.0 * std::log10(1.0 / std::max(a[2] / pixels, 1e-12));  // targets in [0,1]
  } else {
    std::vector<ClassCounts> counts;
    for (int64_t c = 0; c < classes; ++c) counts.push_back({a[3 + 3 * c], a[4 + 3 * c], a[5 + 3 * c]});
    std::vector<std::string> names = class_names_;
    for (int64_t c = int64_t(names.size()); c < classes; ++c) names.push_back("class_" + std::to_string(c));
    j.update(segmentationMetrics(counts, names));
    if (perWindow()) {
      // A window is right when its class is: the classes' intersections summed, over the windows counted.
      double right = 0;
      for (const auto& c : counts) right += c.intersection;
      j["val_accuracy"] = right / pixels;
    }
  }
  runner_->module().train();
  return j;
}

void Trainer::saveModule(torch::jit::Module& module, const std::string& path) {
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  module.eval();
  std::string error;
  try {
    // What infer needs to run it as it was trained (readTrainedSettings).
    nlohmann::json settings = {
        {"window", std::to_string(spec_.window_w) + "," + std::to_string(spec_.window_h)},
        {"mpp", o_.mpp},
        {"magnification", o_.magnification},
        {"classes", o_.classes}};
    const torch::jit::ExtraFilesMap extra{{"tiler.json", settings.dump()}};
    error = writeFileAtomically(path, [&](std::ostream& out) { module.save(out, extra); });
  } catch (...) {
    error = describeException(std::current_exception());
  }
  module.train();
  TILER_CHECK(error.empty(), IoError, "'" << path << "': cannot save the model: " << error);
}

std::string Trainer::epochDir(int epoch) const {
  char name[32];
  std::snprintf(name, sizeof name, "epoch-%06d", epoch);
  return (fs::path(o_.checkpoint_dir) / name).string();
}

void Trainer::saveCheckpoint(int epoch, const nlohmann::json& history) {
  if (o_.checkpoint_dir.empty() || rank() != 0) return;
  // Everything goes into a fresh directory that one rename makes current: a crash at any point leaves the
  // previous checkpoint whole, never new weights beside old state.
  const std::string final_dir = epochDir(epoch), dir = final_dir + ".partial";
  std::error_code ec;
  removeTree(dir);
  fs::create_directories(dir);
  saveModule(runner_->module(), dir + "/model.pt");
  if (faults_.before_checkpoint) faults_.before_checkpoint(dir);
  const std::string optimizer_error =
      writeFileAtomically(dir + "/optimizer.pt", [&](std::ostream& out) { torch::save(*optimizer_, out); });
  TILER_CHECK(optimizer_error.empty(), IoError, "cannot save the optimizer state: " << optimizer_error);
  // The scheduler is a function of the step, the sampler of (seed, epoch): both resume from these.
  nlohmann::json state = {{"epoch", epoch},
                          {"loss_scale", scaler_.scale},
                          {"good_steps", scaler_.good_steps},
                          {"skipped_steps", scaler_.skipped_steps},
                          {"step", step_},
                          {"total_steps", total_steps_},
                          {"seed", o_.seed},
                          {"history", history}};
  writeJsonAtomically(dir + "/state.json", state);
  removeTree(final_dir);
  TILER_CHECK(std::rename(dir.c_str(), final_dir.c_str()) == 0, IoError,
              "'" << final_dir << "': cannot make the checkpoint current: " << std::strerror(errno));
  // Older checkpoints and leftovers of killed writes go once the new one is current.
  for (const auto& e : fs::directory_iterator(o_.checkpoint_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("epoch-", 0) == 0 && e.path().string() != final_dir) removeTree(e.path().string());
  }
}

int Trainer::latestCheckpoint() const {
  int latest = 0;
  std::error_code ec;
  if (o_.checkpoint_dir.empty() || !fs::is_directory(o_.checkpoint_dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(o_.checkpoint_dir, ec)) {
    const std::string name = e.path().filename().string();
    int epoch = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "epoch-%d%c", &epoch, &tail) == 1 && fs::exists(e.path() / "state.json"))
      latest = std::max(latest, epoch);
  }
  return latest;
}

namespace {

// A count of a checkpoint's state.json (epoch, step): a whole number from 0 to `most`, else an IoError naming
// the file and the field (1e300 converted to an int was -2147483648: "names epoch -2147483648").
int64_t checkpointCount(const nlohmann::json& state, const char* key, int64_t most, const std::string& file) {
  const auto it = state.find(key);
  const bool fits = it != state.end() && it->is_number_integer() &&
                    (it->is_number_unsigned() ? it->get<uint64_t>() <= uint64_t(most)
                                              : it->get<int64_t>() >= 0 && it->get<int64_t>() <= most);
  TILER_CHECK(fits, IoError,
              "'" << file << "': " << key << " is "
                  << (it == state.end() ? std::string("missing") : it->dump())
                  << ", not a whole number from 0 to " << most);
  return it->get<int64_t>();
}

}  // namespace

void Trainer::loadCheckpoint(int epoch, nlohmann::json& history) {
  const fs::path dir(epochDir(epoch));
  TILER_CHECK(fs::exists(dir / "state.json"), IoError,
              "'" << dir.string() << "': rank 0 resumes from this checkpoint, but this rank cannot see it");
  std::ifstream in(dir / "state.json");
  auto state = nlohmann::json::parse(in);
  const std::string state_file = (dir / "state.json").string();
  TILER_CHECK(checkpointCount(state, "epoch", std::numeric_limits<int>::max(), state_file) == epoch, IoError,
              "'" << state_file << "': names epoch " << state["epoch"].dump() << ", not " << epoch);
  auto saved = loadTorchScript((dir / "model.pt").string(), runner_->device());
  std::vector<torch::Tensor> from;
  for (const auto& p : saved.parameters()) from.push_back(p);
  TILER_CHECK(from.size() == params_.size(), ModelError,
              "'" << (dir / "model.pt").string() << "': " << from.size()
                  << " parameter tensors, the model has " << params_.size());
  for (size_t i = 0; i < from.size(); ++i)
    TILER_CHECK(from[i].sizes() == params_[i].sizes(), ModelError,
                "'" << (dir / "model.pt").string() << "': parameter " << i << " has shape " << from[i].sizes()
                    << ", the model's is " << params_[i].sizes());
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < from.size(); ++i) params_[i].detach().copy_(from[i].detach());
    auto dst_buffers = runner_->module().buffers(true);
    auto src_buffers = saved.buffers(true);
    auto sb = src_buffers.begin();
    for (const auto& b : dst_buffers) {
      TILER_CHECK(sb != src_buffers.end() && (*sb).sizes() == b.sizes(), ModelError,
                  "'" << (dir / "model.pt").string() << "': buffers do not match the model's");
      b.detach().copy_((*sb++).detach());
    }
  }
  {
    // Onto this rank's device: torch::load would put every rank's state where it was saved (cuda:0).
    torch::serialize::InputArchive archive;
    archive.load_from((dir / "optimizer.pt").string(), runner_->device());
    optimizer_->load(archive);
  }
  TILER_CHECK(state.contains("loss_scale") && state["loss_scale"].is_number() &&
                  std::isfinite(state["loss_scale"].get<double>()) && state["loss_scale"].get<double>() > 0,
              IoError, "'" << state_file << "': loss_scale is not a number > 0");
  scaler_.scale = state["loss_scale"].get<double>();
  scaler_.good_steps = checkpointCount(state, "good_steps", std::numeric_limits<int64_t>::max(), state_file);
  if (state.contains("skipped_steps"))
    scaler_.skipped_steps =
        checkpointCount(state, "skipped_steps", std::numeric_limits<int64_t>::max(), state_file);
  // Another seed would shuffle and augment the remaining epochs otherwise than the run being continued.
  TILER_CHECK(!state.contains("seed") || state["seed"] == o_.seed, ConfigError,
              "'" << state_file << "': the run used --seed " << state["seed"].dump() << ", this one "
                  << o_.seed << "; resume with the same seed");
  step_ = checkpointCount(state, "step", std::numeric_limits<int64_t>::max(), state_file);
  history = state["history"];
  if (rank() == 0) spdlog::info("resuming after epoch {} from '{}'", epoch, dir.string());
}

int Trainer::run() {
  session_ = std::make_unique<RankSession>(joinWorld());
  validateOptions();
  faults_ = faultHooks(Fault::fromEnvironment(), rank());
  loadModel();
  connect();
  nlohmann::json history = nlohmann::json::array();
  const int first_epoch = resumeEpoch(history);
  broadcastState();
  if (o_.class_weights == "auto") computeClassWeights();
  planSteps();
  Progress progress(total_steps_, "steps", !o_.no_progress && rank() == 0);
  for (int epoch = first_epoch + 1; epoch <= o_.epochs; ++epoch) trainEpoch(epoch, history, progress);
  return finishRun(history);
}

void Trainer::validateOptions() {
  // The flags infer shares (--channels too: refused here, in one line, before anything is read).
  const JobPlan job = planJob(o_);
  spec_ = job.spec;
  pad_ = job.pad;
  loss_ = parseLoss(o_.loss);
  // --batch_size is planJob's; these words are the ones this check has always said.
  TILER_CHECK(o_.epochs >= 1 && o_.lr > 0, ConfigError, "--epochs, --batch_size and --lr must be positive");
  TILER_CHECK(o_.grad_accum_steps >= 1, ConfigError, "--grad_accum_steps must be >= 1");
  TILER_CHECK(o_.val_fraction >= 0 && o_.val_fraction < 1, ConfigError, "--val_fraction must be in [0,1)");
  TILER_CHECK(o_.schedule == "constant" || o_.schedule == "cosine", ConfigError,
              "--schedule: constant or cosine");
  TILER_CHECK(o_.optimizer == "adam" || o_.optimizer == "sgd", ConfigError,
              "--optimizer must be adam or sgd; got '" << o_.optimizer << "'");
  TILER_CHECK(!o_.resume || !o_.checkpoint_dir.empty(), ConfigError, "--resume needs --checkpoint_dir");
  if (o_.report.empty()) o_.report = o_.output + ".report.json";
  validateLabelOptions();
  TILER_CHECK(o_.loss_scale >= 0 && std::isfinite(o_.loss_scale) && o_.loss_scale_growth_steps >= 1,
              ConfigError, "--loss_scale must be a finite number >= 0 and its growth steps >= 1");
}

void Trainer::validateLabelOptions() {
  for (const auto& c : parseClasses(o_.classes)) class_names_.push_back(c.name);
  const bool vector_labels = !o_.annotations.empty();
  TILER_CHECK(int(vector_labels) + int(!o_.labels_dir.empty()) + int(perWindow()) == 1, ConfigError,
              "give --labels (label images), --annotations (GeoJSON) or --window_labels (CSV), one of them");
  TILER_CHECK(o_.unlabeled == "ignore" || o_.unlabeled == "background", ConfigError,
              "--unlabeled must be ignore or background; got '" << o_.unlabeled << "'");
  if (perWindow()) {
    validateWindowLabelOptions();
    return;
  }
  TILER_CHECK(o_.val_images.empty() || (vector_labels ? !o_.val_annotations.empty() : !o_.val_labels.empty()),
              ConfigError,
              "--val_images needs " << (vector_labels ? "--val_annotations" : "--val_labels")
                                    << " as training has " << (vector_labels ? "--annotations" : "--labels"));
  TILER_CHECK(o_.val_images.empty() == (o_.val_labels.empty() && o_.val_annotations.empty()), ConfigError,
              "--val_labels and --val_annotations go with --val_images");
  for (const auto* path : {&o_.annotations, &o_.val_annotations})
    TILER_CHECK(path->empty() || fs::exists(*path), ConfigError,
                "--annotations '" << *path << "': no such GeoJSON file or directory");
  TILER_CHECK(!vector_labels || !class_names_.empty(), ConfigError,
              "--annotations needs --classes: the class names its annotations use, class 0 first");
  TILER_CHECK(!vector_labels || loss_ != Loss::kMse, ConfigError,
              "--annotations label classes: not --loss mse");
  TILER_CHECK(!vector_labels || o_.roi.empty(), ConfigError,
              "--roi with --annotations: the annotations are the region windows are drawn from");
  parseClassWeights();
}

void Trainer::validateWindowLabelOptions() {
  const std::string not_a_file = notARegularFile(o_.window_labels);
  TILER_CHECK(not_a_file.empty(), ConfigError,
              "--window_labels '" << o_.window_labels << "': " << not_a_file << "; it takes a CSV file");
  TILER_CHECK(o_.val_labels.empty() && o_.val_annotations.empty(), ConfigError,
              "--window_labels labels --val_images' windows too: not --val_labels or --val_annotations");
  TILER_CHECK(loss_ == Loss::kCe, ConfigError,
              "--window_labels trains a model's [B,K] class scores by cross-entropy: --loss ce, not '"
                  << o_.loss << "'");
  parseClassWeights();
}

void Trainer::parseClassWeights() {
  if (o_.class_weights.empty()) return;
  TILER_CHECK(loss_ == Loss::kCe || loss_ == Loss::kDice, ConfigError,
              "--class_weights weigh the classes of --loss ce or dice");
  if (o_.class_weights == "auto") return;
  std::vector<float> weights;
  std::stringstream list(o_.class_weights);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const double w = std::strtod(item.c_str(), &end);
    TILER_CHECK(!item.empty() && *end == 0 && std::isfinite(w) && w >= 0, ConfigError,
                "--class_weights: '" << item << "' is not a number >= 0 (auto | w1,w2,...)");
    weights.push_back(float(w));
  }
  class_weights_ = torch::tensor(weights, torch::kFloat32);
}

void Trainer::loadModel() {
  ModelOptions model = modelOptionsFor(o_, session_->world().local_rank);
  // Label maps train a map (the probe refuses any other output); window labels [B,K] class scores.
  if (perWindow()) model.task = findTask("classify");
  requireTrainableModel(model.path);
  runner_ = std::make_unique<ModelRunner>(model);
  probe_ = runner_->probe(spec_.window_w, spec_.window_h);
  runner_->module().train();
  for (const auto& p : runner_->module().parameters(true)) {
    p.set_requires_grad(true);
    params_.push_back(p);
  }
  TILER_CHECK(!params_.empty(), ModelError, "'" << o_.model << "': the model has no parameters to train");
  const int64_t classes = loss_ == Loss::kBce ? 2 : probe_.output_channels;
  TILER_CHECK(class_names_.empty() || loss_ == Loss::kMse || int64_t(class_names_.size()) == classes,
              ConfigError, "--classes names " << class_names_.size() << " classes, the model's " << classes);
  TILER_CHECK(!class_weights_.defined() || class_weights_.numel() == probe_.output_channels, ConfigError,
              "--class_weights has " << class_weights_.numel() << " weights, the model "
                                     << probe_.output_channels << " classes");
  if (class_weights_.defined()) class_weights_ = class_weights_.to(runner_->device());
  scaling_ = runner_->precision() == Precision::kFp16 || o_.loss_scale > 0;
  if (o_.loss_scale > 0) scaler_.scale = o_.loss_scale;
  scaler_.growth_steps = o_.loss_scale_growth_steps;
  if (o_.optimizer == "adam")
    optimizer_ = std::make_unique<torch::optim::Adam>(
        params_, torch::optim::AdamOptions(o_.lr).weight_decay(o_.weight_decay));
  else
    optimizer_ = std::make_unique<torch::optim::SGD>(
        params_, torch::optim::SGDOptions(o_.lr).momentum(o_.momentum).weight_decay(o_.weight_decay));
}

void Trainer::connect() {
  session_->connect(distOptionsFor(o_), runner_->device());
  session_->setup("the data check", [&] {
    // Two runs into one checkpoint directory would remove each other's epochs.
    if (rank() == 0 && !o_.checkpoint_dir.empty())
      session_->lockDirectory(o_.checkpoint_dir, "--checkpoint_dir");
    loadData();
    if (rank() == 0) checkWrittenPaths();
  });
}

void Trainer::checkWrittenPaths() const {
  PathRoles roles;
  roles.reads(o_.model, "the model");
  for (const CatalogImage& t : catalog_.images()) {
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

int Trainer::resumeEpoch(nlohmann::json& history) {
  // Rank 0 decides where training resumes; every rank loads that checkpoint (or fails, on every rank).
  auto resume = torch::tensor({int64_t(o_.resume && rank() == 0 ? latestCheckpoint() : 0)}, torch::kInt64);
  exchange().broadcast(resume, 0, "the resume epoch");
  const int first_epoch = int(resume.item<int64_t>());
  if (o_.resume && first_epoch == 0 && rank() == 0)
    spdlog::info("no checkpoint in '{}': starting fresh", o_.checkpoint_dir);
  if (first_epoch > 0) session_->setup("the checkpoint load", [&] { loadCheckpoint(first_epoch, history); });
  return first_epoch;
}

void Trainer::planSteps() {
  const int64_t B = o_.batch_size, K = o_.grad_accum_steps;
  const int64_t per_rank = int64_t(epochWindows(train_, 0, true, nullptr).size());
  micro_per_epoch_ = o_.drop_last ? std::max<int64_t>(1, per_rank / B) : (per_rank + B - 1) / B;
  steps_per_epoch_ = (micro_per_epoch_ + K - 1) / K;
  total_steps_ = steps_per_epoch_ * o_.epochs;
  if (rank() == 0)
    spdlog::info(
        "finetune: {} train / {} val windows of {}x{}, {} rank(s), {} step(s) of {} micro-batch(es) per "
        "epoch, loss {}, {} {}",
        train_.size(), val_.size(), spec_.window_w, spec_.window_h, session_->world().world_size,
        steps_per_epoch_, K, o_.loss, o_.optimizer, precisionName(runner_->precision()));
}

std::vector<WindowRef> Trainer::microBatch(const std::vector<WindowRef>& mine, int64_t micro) const {
  const size_t lo = size_t(micro * o_.batch_size),
               hi = std::min(mine.size(), size_t((micro + 1) * o_.batch_size));
  return std::vector<WindowRef>(mine.begin() + long(lo), mine.begin() + long(hi));
}

void Trainer::trainEpoch(int epoch, nlohmann::json& history, Progress& progress) {
  const auto t0 = Clock::now();
  const auto mine = epochWindows(train_, epoch, true, nullptr);
  // Windows past the epoch's micro-batches (--drop_last's tail) are never read.
  const std::vector<WindowRef> read(
      mine.begin(), mine.begin() + long(std::min(mine.size(), size_t(micro_per_epoch_ * o_.batch_size))));
  auto loader = loaderFor(read, train_readers_, true);
  double loss_sum = 0;
  int64_t counted = 0;
  for (int64_t s = 0; s < steps_per_epoch_; ++s) {
    trainStep(epoch, s, mine, *loader, loss_sum, counted);
    progress.update(step_);
  }
  auto train_loss = torch::tensor({loss_sum, double(counted)}, torch::kDouble);
  exchange().allreduceSum(train_loss, "the training loss");
  nlohmann::json e = {
      {"epoch", epoch},
      {"train_loss", train_loss[0].item<double>() / std::max(1.0, train_loss[1].item<double>())}};
  e.update(validate());
  e["lr"] = lrAt(double(step_) / double(total_steps_));
  if (scaling_) e["loss_scale"] = scaler_.scale;
  e["seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
  history.push_back(e);
  if (rank() == 0 && !o_.no_progress) {
    std::string metrics;
    for (const char* k : {"val_loss", "val_accuracy", "val_iou", "val_dice", "val_psnr"})
      if (e.contains(k)) metrics += fmt::format(", {} {:.4f}", k, e[k].get<double>());
    std::cout << fmt::format("epoch {}/{}: train_loss {:.4f}{} ({:.1f} s)", epoch, o_.epochs,
                             e["train_loss"].get<double>(), metrics, e["seconds"].get<double>())
              << std::endl;
  }
  session_->setup("the checkpoint of epoch " + std::to_string(epoch), [&] {
    saveCheckpoint(epoch, history);
    writeEpochOutputs(epoch, history);
  });
}

namespace {

// The epoch of `history` with the highest validation mean Dice (the first of equals); 0: none validated.
int bestEpoch(const nlohmann::json& history) {
  int best = 0;
  double best_dice = -1;
  for (const auto& e : history)
    if (e.contains("val_dice") && e["val_dice"].get<double>() > best_dice) {
      best_dice = e["val_dice"].get<double>();
      best = e["epoch"].get<int>();
    }
  return best;
}

}  // namespace

void Trainer::writeEpochOutputs(int epoch, const nlohmann::json& history) {
  if (rank() != 0) return;
  // Beside -o, whose directory the model's first save would make: made here, before the first epoch's files.
  if (fs::path(o_.output).has_parent_path()) fs::create_directories(fs::path(o_.output).parent_path());
  std::vector<std::string> names;  // the classes the metrics name, in class order
  if (!history.empty() && history.back().contains("val_class_dice"))
    for (size_t c = 0; c < history.back()["val_class_dice"].size(); ++c)
      names.push_back(c < class_names_.size() ? class_names_[c] : "class_" + std::to_string(c));
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
  if (o_.save_best && bestEpoch(history) == epoch) saveModule(runner_->module(), bestPath());
}

void Trainer::computeClassWeights() {
  const int64_t K = probe_.output_channels;
  auto counts = torch::zeros({K}, torch::kDouble);
  std::vector<bool> padded;
  const auto mine = epochWindows(train_, 0, false, &padded);
  const auto [oh, ow, tc] = labelShape();
  auto failure = captureFailure([&] {
    auto target = torch::zeros({oh, ow}, torch::kFloat32), valid = torch::zeros({oh, ow}, torch::kFloat32);
    for (size_t k = 0; k < mine.size(); ++k) {
      if (padded[k]) continue;  // a duplicate counts once
      target.zero_();
      valid.zero_();
      readLabels(catalog_.image(mine[k].image), mine[k].image, mine[k].local, train_readers_,
                 target.data_ptr<float>(), valid.data_ptr<float>());
      const auto labelled = target.masked_select(valid > 0).to(torch::kLong).clamp(0, K - 1);
      counts += torch::bincount(labelled, {}, K).to(torch::kDouble);
    }
  });
  exchange().check(failure, "the class weights");
  exchange().allreduceSum(counts, "the class counts");
  // Inverse frequency, normalised so that balanced classes weigh 1 each; a class never labelled weighs 0.
  const double total = counts.sum().item<double>();
  TILER_CHECK(total > 0, ConfigError, "--class_weights auto: the training windows hold no labelled pixel");
  auto weights = torch::where(counts > 0, total / (double(K) * counts), torch::zeros_like(counts));
  class_weights_ = weights.to(torch::kFloat32).to(runner_->device());
  if (rank() == 0) {
    std::string shown;
    for (int64_t c = 0; c < K; ++c) shown += fmt::format("{}{:.4g}", c ? "," : "", weights[c].item<double>());
    spdlog::info("class weights (inverse frequency of {} labelled pixels): {}", int64_t(total), shown);
  }
}

void Trainer::trainStep(int epoch, int64_t s, const std::vector<WindowRef>& mine, WindowLoader& loader,
                        double& loss_sum, int64_t& counted) {
  const auto ts = Clock::now();
  const int64_t K = o_.grad_accum_steps;
  const int64_t first = s * K, micros = std::min(K, micro_per_epoch_ - first);
  for (auto& g : optimizer_->param_groups())
    static_cast<torch::optim::OptimizerOptions&>(g.options())
        .set_lr(lrAt(double(step_) / double(total_steps_)));
  optimizer_->zero_grad();
  // Gradients of `micros` micro-batches summed, each loss weighted 1/micros: the same step as one batch
  // of them all (and as `micros` ranks each taking one).
  auto failure = captureFailure([&] {
    for (int64_t m = 0; m < micros; ++m) {
      const auto refs = microBatch(mine, first + m);
      torch::Tensor x, target, mask;
      toDevice(nextBatch(loader, int64_t(refs.size())), refs, epoch, x, target, mask);
      torch::Tensor loss = lossOf(runner_->apply(x), target, mask);
      ((scaling_ ? loss * scaler_.scale : loss) / double(micros)).backward();
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
    const double used = scaler_.scale;
    if (!scaler_.update(finite)) {
      if (rank() == 0) spdlog::warn("loss scale {} overflowed: step skipped, now {}", used, scaler_.scale);
      ++step_;
      return;
    }
    for (auto& p : params_) p.mutable_grad().div_(used);
  }
  optimizer_->step();
  ++step_;
  step_seconds_ += std::chrono::duration<double>(Clock::now() - ts).count();
}

int Trainer::finishRun(const nlohmann::json& history) {
  // Data parallelism promises identical parameters on every rank: check it rather than trust it.
  double checksum = 0;
  for (const auto& p : params_) checksum += p.detach().to(torch::kDouble).abs().sum().item<double>();
  auto sums = exchange().allgather(torch::tensor({checksum}, torch::kDouble), "the parameter checksum");
  // NaN is never equal to itself: parameters that are not numbers mean the training diverged, on every rank.
  for (size_t r = 0; r < sums.size(); ++r)
    TILER_CHECK(std::isfinite(sums[r].item<double>()), ModelError,
                "training diverged: rank " << r << "'s parameters are no longer finite (NaN or Inf) after "
                                           << step_ << " steps; lower --lr, or check the labels");
  for (size_t r = 0; r < sums.size(); ++r)
    TILER_CHECK(sums[r].item<double>() == checksum, DistError,
                "rank " << r << " holds different parameters after training (checksum "
                        << sums[r].item<double>() << " vs " << checksum << ")");
  return session_->finish([&] {
    saveModule(runner_->module(), o_.output);
    nlohmann::json report = {{"world_size", session_->world().world_size},
                             {"epochs", history},
                             {"output", o_.output},
                             {"seconds", session_->seconds()},
                             {"step_seconds", step_seconds_},
                             {"sync_seconds", sync_seconds_},
                             {"steps", step_},
                             {"grad_accum_steps", o_.grad_accum_steps},
                             {"parameter_checksum", checksum},
                             {"classes", class_names_},
                             {"epochs_csv", csvPath()},
                             {"curves_png", plotPath()}};
    if (class_weights_.defined()) {
      auto w = class_weights_.to(torch::kCPU).to(torch::kDouble);
      report["class_weights"] = std::vector<double>(w.data_ptr<double>(), w.data_ptr<double>() + w.numel());
    }
    if (scaling_) report["loss_scale"] = {{"scale", scaler_.scale}, {"skipped_steps", scaler_.skipped_steps}};
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

int runFinetune(const FinetuneOptions& options) {
  installLargeBlockCache();  // before the process group's and the stages' threads exist
  // A step allocates and frees the same tensors under 1 MiB (the large block cache's floor) every step;
  // glibc's default thresholds give them back to the system (mmap, heap trim) and take page faults on each
  // new step: 4 ms of a 40 ms step of the bench's loss and input alone. Kept on the heap, as PyTorch's loop
  // is run (scripts/python_finetune.py), unless the environment sets glibc's malloc.
  if (!std::getenv("GLIBC_TUNABLES") && !std::getenv("MALLOC_MMAP_THRESHOLD_") &&
      !std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  }
  return Trainer(options).run();
}

bool LossScaler::update(bool finite_gradients) {
  if (!finite_gradients) {
    scale /= 2;
    good_steps = 0;
    ++skipped_steps;
    return false;
  }
  if (++good_steps >= growth_steps) {
    scale *= 2;
    good_steps = 0;
  }
  return true;
}

std::optional<TrainedSettings> readTrainedSettings(const std::string& model_path) {
  const auto text = findZipEntry(
      model_path, [](const std::string& name) { return nameEndsWith(name, "/extra/tiler.json"); }, 1 << 20);
  if (!text || text->empty()) return std::nullopt;
  const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  TrainedSettings s;
  try {
    s.window = j.value("window", std::string());
    s.classes = j.value("classes", std::string());
    s.mpp = j.value("mpp", 0.0);
    s.magnification = j.value("magnification", 0.0);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // not what finetune writes: a file of someone else's
  }
  return s;
}

}  // namespace tiler
