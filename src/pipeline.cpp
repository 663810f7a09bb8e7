#include "tiler/pipeline.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>
#include <optional>
#include <set>
#include <thread>

#include "tiler/blend.hpp"
#include "tiler/dist.hpp"
#include "tiler/error.hpp"
#include "tiler/model.hpp"
#include "tiler/sampler.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace tiler {

// ---- shared pieces -------------------------------------------------------------------------------------

std::string bundledSamplesDir() {
  return TILER_SOURCE_DIR "/samples";
}

std::vector<std::string> listImages(const std::vector<std::string>& inputs, bool recursive) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      auto add = [&](const fs::directory_entry& e) {
        if (e.is_regular_file(ec) && hasImageExtension(e.path().string())) files.push_back(e.path().string());
      };
      if (recursive) {
        for (const auto& e : fs::recursive_directory_iterator(in, ec)) add(e);
      } else {
        for (const auto& e : fs::directory_iterator(in, ec)) add(e);
      }
      TILER_CHECK(!ec, IoError, "'" << in << "': cannot list directory: " << ec.message());
    } else {
      // A named file is taken as it is; if it is missing, its error goes to the report.
      files.push_back(in);
    }
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

void parseOverlap(const std::string& text, GridSpec& spec) {
  auto parse = [&](const std::string& s) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TILER_CHECK(used == s.size() && v >= 0.0 && v < 1.0, ConfigError,
                "--overlap must be F or FX,FY with values in [0,1); got '" << text << "'");
    return v;
  };
  auto comma = text.find(',');
  if (comma == std::string::npos) {
    spec.overlap_x = spec.overlap_y = parse(text);
  } else {
    spec.overlap_x = parse(text.substr(0, comma));
    spec.overlap_y = parse(text.substr(comma + 1));
  }
}

PadMode parsePadMode(const std::string& name) {
  if (name == "constant") return PadMode::kConstant;
  if (name == "reflect") return PadMode::kReflect;
  if (name == "replicate") return PadMode::kReplicate;
  TILER_THROW(ConfigError, "--pad must be constant, reflect or replicate; got '" << name << "'");
}

cv::Mat readWindow(ImageReader& reader, const WindowGrid& grid, int64_t local_index, PadMode pad,
                   double cval) {
  const Rect r = grid.imageWindow(local_index);
  const ImageInfo& info = reader.info();
  const int64_t x0 = std::max<int64_t>(r.x, 0), y0 = std::max<int64_t>(r.y, 0);
  const int64_t x1 = std::min(r.right(), info.width), y1 = std::min(r.bottom(), info.height);
  cv::Mat inside = reader.readRegion(Rect{x0, y0, x1 - x0, y1 - y0});
  if (x0 == r.x && y0 == r.y && x1 == r.right() && y1 == r.bottom()) return inside;
  const int mode = pad == PadMode::kConstant  ? cv::BORDER_CONSTANT
                   : pad == PadMode::kReflect ? cv::BORDER_REFLECT_101
                                              : cv::BORDER_REPLICATE;
  cv::Mat out;
  cv::copyMakeBorder(inside, out, int(y0 - r.y), int(r.bottom() - y1), int(x0 - r.x), int(r.right() - x1),
                     mode, cv::Scalar::all(cval));
  return out;
}

double peakRssMegabytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // Linux reports kilobytes
}

double defaultScale(SampleType type) {
  switch (type) {
    case SampleType::kU8:
      return 1.0 / 255.0;
    case SampleType::kU16:
      return 1.0 / 65535.0;
    case SampleType::kI16:
      return 1.0 / 32767.0;
    case SampleType::kU32:
      return 1.0 / 4294967295.0;
    case SampleType::kF32:
      return 1.0;
  }
  return 1.0;
}

int runInfo(const std::vector<std::string>& paths, const std::string& window, const std::string& overlap) {
  int status = kExitOk;
  for (const auto& path : listImages(paths, false)) {
    try {
      auto reader = ImageReader::open(path);
      const ImageInfo& i = reader->info();
      std::cout << path << ": " << i.width << "x" << i.height << ", " << i.channels << " channel(s), "
                << sampleTypeName(i.type) << ", " << i.format;
      if (i.format == "tiff") {
        std::cout << (i.tiled
                          ? ", tiled " + std::to_string(i.tile_width) + "x" + std::to_string(i.tile_height)
                          : ", striped (" + std::to_string(i.rows_per_strip) + " rows/strip)")
                  << ", " << i.compression << (i.planar_separate ? ", planar separate" : "")
                  << (i.bigtiff ? ", BigTIFF" : "") << ", " << i.pages << " page(s)";
      }
      std::cout << "\n";
      if (!window.empty()) {
        GridSpec spec;
        std::tie(spec.window_w, spec.window_h) = parseWindowSize(window);
        parseOverlap(overlap, spec);
        WindowGrid grid(i.width, i.height, spec);
        std::cout << "  grid: " << grid.count() << " windows (" << grid.startsX().size() << " x "
                  << grid.startsY().size() << ") of " << spec.window_w << "x" << spec.window_h << ", overlap "
                  << spec.overlap_x << "," << spec.overlap_y;
        if (grid.paddedWidth() != i.width || grid.paddedHeight() != i.height)
          std::cout << ", padded to " << grid.paddedWidth() << "x" << grid.paddedHeight();
        std::cout << "\n  x starts:";
        for (auto s : grid.startsX()) std::cout << " " << s;
        std::cout << "\n  y starts:";
        for (auto s : grid.startsY()) std::cout << " " << s;
        std::cout << "\n";
      }
    } catch (const Error& e) {
      std::cerr << "tiler info: " << e.message() << "\n";
      status = kExitSomeFailed;
    }
  }
  return status;
}

namespace {

// The image read band by band and shrunk by `factor` as it goes, so no full-size copy is ever held.
cv::Mat shrunk(ImageReader& reader, double factor, int interpolation) {
  const ImageInfo& info = reader.info();
  const int out_w = std::max(1, int(std::lround(double(info.width) * factor)));
  std::vector<cv::Mat> bands;
  const int64_t band = 512;
  for (int64_t y = 0; y < info.height; y += band) {
    const int64_t h = std::min(band, info.height - y);
    cv::Mat part = reader.readRegion({0, y, info.width, h}), small;
    cv::resize(part, small, cv::Size(out_w, std::max(1, int(std::lround(double(h) * factor)))), 0, 0,
               interpolation);
    bands.push_back(small);
  }
  cv::Mat out;
  cv::vconcat(bands, out);
  return out;
}

}  // namespace

void writeOverlay(const std::string& image_path, const std::string& labels_path, const std::string& out_path,
                  int max_side, const GridSpec* grid) {
  auto image = ImageReader::open(image_path);
  auto labels = ImageReader::open(labels_path);
  const ImageInfo& info = image->info();
  const double factor = std::min(1.0, double(max_side) / double(std::max(info.width, info.height)));
  cv::Mat rgb = shrunk(*image, factor, cv::INTER_AREA);
  if (rgb.depth() != CV_8U) cv::normalize(rgb, rgb, 0, 255, cv::NORM_MINMAX, CV_8U);
  if (rgb.channels() == 1) cv::cvtColor(rgb, rgb, cv::COLOR_GRAY2RGB);
  if (rgb.channels() == 4) cv::cvtColor(rgb, rgb, cv::COLOR_RGBA2RGB);
  cv::Mat lab =
      shrunk(*labels, factor * double(info.width) / double(labels->info().width), cv::INTER_NEAREST);
  cv::resize(lab, lab, rgb.size(), 0, 0, cv::INTER_NEAREST);
  // Class k > 0 gets a colour from a fixed palette, blended at 50%; class boundaries are drawn solid.
  static const cv::Vec3b kPalette[] = {
      {255, 40, 40}, {40, 220, 40}, {60, 120, 255}, {255, 200, 0}, {220, 0, 220}};
  cv::Mat out = rgb.clone();
  auto label = [&lab](int y, int x) {
    return lab.depth() == CV_16U ? lab.at<uint16_t>(y, x) : lab.at<uint8_t>(y, x);
  };
  for (int y = 0; y < out.rows; ++y) {
    for (int x = 0; x < out.cols; ++x) {
      const int k = label(y, x);
      if (k == 0) continue;
      const cv::Vec3b c = kPalette[(k - 1) % 5];
      const bool edge = (x > 0 && label(y, x - 1) != k) || (y > 0 && label(y - 1, x) != k);
      cv::Vec3b& p = out.at<cv::Vec3b>(y, x);
      for (int i = 0; i < 3; ++i) p[i] = edge ? c[i] : uchar((p[i] + c[i]) / 2);
    }
  }
  if (grid != nullptr) {
    // The window outlines, to show how the image was cut.
    WindowGrid g(info.width, info.height, *grid);
    for (int64_t i = 0; i < g.count(); ++i) {
      Rect r = g.imageWindow(i);
      cv::rectangle(out, cv::Point(int(double(r.x) * factor), int(double(r.y) * factor)),
                    cv::Point(int(double(r.right()) * factor) - 1, int(double(r.bottom()) * factor) - 1),
                    cv::Scalar(255, 230, 0), 1);
    }
  }
  WriterOptions o;
  o.format = "png";
  ImageWriter writer(out_path, out.cols, out.rows, 3, SampleType::kU8, o);
  writer.writeRows(out);
  writer.close();
}

Progress::Progress(int64_t total, std::string unit, bool enabled)
    : total_(total),
      unit_(std::move(unit)),
      enabled_(enabled),
      tty_(isatty(STDOUT_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void Progress::update(int64_t done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = done >= total_;
  // A bar redrawn 5 times a second on a terminal; a plain line every 5 seconds in a log.
  if (!last && now - last_ < (tty_ ? std::chrono::milliseconds(200) : std::chrono::seconds(5))) return;
  last_ = now;
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double rate = secs > 0 ? double(done) / secs : 0.0;
  const double eta = rate > 0 ? double(total_ - done) / rate : 0.0;
  char line[256];
  if (tty_) {
    const int width = 30;
    const int filled = total_ > 0 ? int(width * std::min(done, total_) / total_) : width;
    std::string bar(size_t(filled), '#');
    bar.resize(size_t(width), '.');
    std::snprintf(line, sizeof line, "\r[%s] %lld/%lld %s  %.1f/s  ETA %.0fs ", bar.c_str(), (long long)done,
                  (long long)total_, unit_.c_str(), rate, eta);
    std::cout << line << (last ? "\n" : "") << std::flush;
  } else {
    std::snprintf(line, sizeof line, "progress: %lld/%lld %s, %.1f/s, ETA %.0fs", (long long)done,
                  (long long)total_, unit_.c_str(), rate, eta);
    std::cout << line << std::endl;
  }
}

// ---- the job -------------------------------------------------------------------------------------------

namespace {

// Bounded FIFO between the pipeline's threads; close() wakes everyone and ends the stream.
template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}
  void push(T item) {
    std::unique_lock<std::mutex> lock(mutex_);
    not_full_.wait(lock, [&] { return items_.size() < capacity_ || closed_; });
    if (closed_) return;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
  }
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    not_empty_.wait(lock, [&] { return !items_.empty() || closed_; });
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.erase(items_.begin());
    not_full_.notify_one();
    return item;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    not_empty_.notify_all();
    not_full_.notify_all();
  }

 private:
  size_t capacity_;
  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::vector<T> items_;
  bool closed_ = false;
};

enum SlotStatus : int64_t { kSlotOk = 0, kSlotPadded = 1, kSlotFailed = 2, kSlotSkipped = 3 };

struct PlannedImage {
  std::string input;
  ImageInfo info;
  WindowGrid grid;
  ChannelAdapt adapt = ChannelAdapt::kNone;
  double scale = 1.0;
  int64_t first_window = 0;   // global index of its window 0 (planned images only)
  std::string status = "ok";  // ok | skipped | error
  std::string error;
  std::map<std::string, std::string> outputs;  // kind -> final path
};

struct Plan {
  std::vector<PlannedImage> images;
  std::vector<int> planned;            // ids of images with windows, in order
  std::vector<int64_t> planned_first;  // their first global window
  int64_t total_windows = 0;

  // (image id, local window index) of a global window index.
  std::pair<int, int64_t> locate(int64_t global) const {
    auto it = std::upper_bound(planned_first.begin(), planned_first.end(), global);
    size_t k = size_t(it - planned_first.begin()) - 1;
    return {planned[k], global - planned_first[k]};
  }
};

// A step's batch as this rank built it. pixels/scales/meta are owned CPU tensors.
struct Batch {
  torch::Tensor pixels;                                 // float32 [B,H,W,C] raw sample values
  torch::Tensor scales;                                 // float32 [B]
  torch::Tensor meta;                                   // int64 [B,2]: global index, SlotStatus
  std::vector<std::pair<int, std::string>> new_errors;  // (image id, message) found while reading
  double read_seconds = 0;
  int64_t valid = 0;
};

// What rank 0's stitcher thread gets per step: every rank's slots.
struct StepResult {
  torch::Tensor preds;                  // float32 [world*B, C, h, w] CPU
  torch::Tensor meta;                   // int64 [world*B, 2]
  std::map<int, std::string> failures;  // image id -> message (first report wins)
};

struct Fault {
  int rank = -1;
  int64_t after_windows = 0;
  std::string kind;
};

// TILER_FAULT=rank:R,after_windows:K,kind:crash|hang|exit — a testing hook, read only from the environment.
std::optional<Fault> faultFromEnvironment() {
  const char* spec = std::getenv("TILER_FAULT");
  if (spec == nullptr || *spec == '\0') return std::nullopt;
  Fault f;
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    auto colon = part.find(':');
    TILER_CHECK(colon != std::string::npos, ConfigError, "TILER_FAULT: bad item '" << part << "'");
    std::string key = part.substr(0, colon), value = part.substr(colon + 1);
    if (key == "rank")
      f.rank = std::stoi(value);
    else if (key == "after_windows")
      f.after_windows = std::stoll(value);
    else if (key == "kind")
      f.kind = value;
    else
      TILER_THROW(ConfigError, "TILER_FAULT: unknown key '" << key << "'");
  }
  TILER_CHECK(f.kind == "crash" || f.kind == "hang" || f.kind == "exit", ConfigError,
              "TILER_FAULT: kind must be crash, hang or exit");
  return f;
}

}  // namespace

void writeJsonAtomically(const std::string& path, const nlohmann::json& j) {
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    out.flush();
    TILER_CHECK(out.good(), IoError, "'" << tmp << "': cannot write the report");
  }
  TILER_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, IoError,
              "'" << path << "': cannot rename the report into place: " << std::strerror(errno));
}

namespace {

// One image being stitched on rank 0: its stitcher and writers. Destroying it unfinished removes partials.
struct ImageJob {
  std::unique_ptr<ImageWriter> labels, probs;
  std::unique_ptr<Stitcher> stitcher;
};

class InferJob {
 public:
  explicit InferJob(InferOptions o) : o_(std::move(o)) {}

  int run();

 private:
  void validateOptions();
  void buildPlan();
  void prefetchLoop(const std::vector<SampleSlot>& slots, int64_t steps);
  void stitchLoop();
  void stitchStep(StepResult& step);
  ImageJob& jobFor(int image_id);
  void finishImage(int image_id, const std::string& error);
  nlohmann::json report(double seconds, const std::vector<torch::Tensor>& per_rank);
  void maybeFault(int64_t windows_done);
  void rethrowStitchError() {
    std::lock_guard<std::mutex> lock(results_mutex_);
    if (stitch_error_) std::rethrow_exception(stitch_error_);
  }

  InferOptions o_;
  WorldInfo world_;
  GridSpec spec_;
  PadMode pad_ = PadMode::kConstant;
  StitchOptions stitch_;
  Activation activation_ = Activation::kNone;
  bool save_labels_ = true, save_probs_ = false;
  std::unique_ptr<ModelRunner> model_;
  std::unique_ptr<DistContext> dist_;
  ModelProbe probe_;
  Plan plan_;
  std::optional<Fault> fault_;

  // Failed images as this rank knows them (reading: prefetch thread; writing: main thread).
  std::mutex failed_mutex_;
  std::set<int> failed_;
  std::set<int> announced_failures_;  // main thread: failures already passed to the stitcher

  BoundedQueue<Batch> batches_{size_t(o_.prefetch)};  // --prefetch batches read ahead (o_ is set first)
  BoundedQueue<StepResult> steps_{2};
  std::exception_ptr prefetch_error_;  // set before batches_ closes; read after pop() ends the stream
  std::exception_ptr stitch_error_;    // guarded by results_mutex_ (the stitcher thread sets it)

  // Rank 0's stitcher thread state.
  std::map<int, ImageJob> jobs_;
  std::mutex results_mutex_;  // guards plan_.images[*].status/error after the plan is built

  Clock::time_point start_;
  double read_seconds_ = 0, forward_seconds_ = 0, gather_seconds_ = 0;
  int64_t my_windows_ = 0;
};

void InferJob::validateOptions() {
  std::tie(spec_.window_w, spec_.window_h) = parseWindowSize(o_.window);
  parseOverlap(o_.overlap, spec_);
  pad_ = parsePadMode(o_.pad);
  stitch_.mode = parseBlendMode(o_.blend);
  stitch_.sigma_scale = o_.sigma_scale;
  if (stitch_.mode == BlendMode::kGaussian) gaussianImportance(4, 4, o_.sigma_scale);  // validates sigma
  activation_ = parseActivation(o_.activation);
  TILER_CHECK(o_.batch_size >= 1, ConfigError, "--batch_size must be >= 1");
  TILER_CHECK(o_.prefetch >= 1, ConfigError, "--prefetch must be >= 1");
  TILER_CHECK(o_.timeout > 0, ConfigError, "--timeout must be > 0");
  TILER_CHECK(o_.on_error == "skip" || o_.on_error == "abort", ConfigError,
              "--on_error must be skip or abort");
  TILER_CHECK(o_.format == "tif" || o_.format == "png", ConfigError, "--format must be tif or png");
  TILER_CHECK(!(o_.resume && o_.overwrite), ConfigError, "--resume and --overwrite exclude each other");
  parseCompression(o_.compression);
  save_labels_ = save_probs_ = false;
  std::stringstream ss(o_.save);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part == "labels")
      save_labels_ = true;
    else if (part == "probs")
      save_probs_ = true;
    else
      TILER_THROW(ConfigError, "--save takes labels, probs or labels,probs; got '" << o_.save << "'");
  }
  if (o_.inputs.empty()) o_.inputs = {bundledSamplesDir() + "/images"};
  if (o_.model.empty()) o_.model = bundledSamplesDir() + "/models/sample.pt";
  if (o_.report.empty()) o_.report = (fs::path(o_.output_dir) / "report.json").string();
  if (world_.rank == 0) {
    // An unwritable output directory is a setup error: say so before any work, not once per image.
    std::error_code ec;
    fs::create_directories(o_.output_dir, ec);
    const std::string probe = (fs::path(o_.output_dir) / ".tiler-write-test").string();
    std::ofstream test(probe);
    TILER_CHECK(!ec && test.good(), ConfigError,
                "cannot write to the output directory '"
                    << o_.output_dir << "': " << (ec ? ec.message() : std::strerror(errno)));
    test.close();
    fs::remove(probe, ec);
  }
}

void InferJob::buildPlan() {
  std::vector<std::string> files = listImages(o_.inputs, o_.recursive);
  TILER_CHECK(!files.empty(), ConfigError, "no input images found in the given --input paths");
  std::map<std::string, std::string> stems;  // output stem -> input, to catch collisions
  std::vector<std::string> existing;
  for (const auto& path : files) {
    PlannedImage img;
    img.input = path;
    const std::string stem = fs::path(path).stem().string();
    if (save_labels_)
      img.outputs["labels"] = (fs::path(o_.output_dir) / (stem + "_labels." + o_.format)).string();
    if (save_probs_) img.outputs["probs"] = (fs::path(o_.output_dir) / (stem + "_probs.tif")).string();
    try {
      auto [it, fresh] = stems.emplace(stem, path);
      TILER_CHECK(
          fresh, ConfigError,
          "'" << path << "': its outputs would overwrite those of '" << it->second << "' (same file stem)");
      auto reader = ImageReader::open(path);
      img.info = reader->info();
      img.adapt = channelAdaptation(img.info.channels, probe_.input_channels, path);
      img.scale = o_.scale > 0 ? o_.scale : defaultScale(img.info.type);
      img.grid = WindowGrid(img.info.width, img.info.height, spec_, probe_.scale);
      const int64_t out_w = probe_.scale.apply(img.info.width), out_h = probe_.scale.apply(img.info.height);
      TILER_CHECK(out_w >= 1 && out_h >= 1, IoError,
                  "'" << path << "': " << img.info.width << "x" << img.info.height
                      << " is smaller than one output "
                      << "pixel at the model's scale 1/" << probe_.scale.den);
      if (o_.format == "png" && save_labels_) {
        TILER_CHECK(out_w * out_h <= ImageWriter::kMaxInMemoryPixels, IoError,
                    "'" << path << "': output " << out_w << "x" << out_h
                        << " is too large for PNG; use --format tif");
      }
      if (img.adapt == ChannelAdapt::kRepeatGray && world_.rank == 0)
        spdlog::info("'{}': grayscale repeated to 3 channels for the model", path);
      if (img.adapt == ChannelAdapt::kDropAlpha && world_.rank == 0)
        spdlog::info("'{}': alpha channel dropped for the model", path);
    } catch (const Error& e) {
      img.status = "error";
      img.error = e.message();
    }
    if (img.status == "ok" && world_.rank == 0) {
      // A .partial left by a killed run is garbage: this run writes the image again or skips it.
      std::error_code ec;
      for (auto& [kind, out] : img.outputs) fs::remove(out + ".partial", ec);
    }
    if (img.status == "ok") {
      size_t present = 0;
      for (auto& [kind, out] : img.outputs) present += fs::exists(out) ? 1 : 0;
      if (present == img.outputs.size() && o_.resume) {
        img.status = "skipped";
      } else if (present > 0 && !o_.resume && !o_.overwrite) {
        for (auto& [kind, out] : img.outputs)
          if (fs::exists(out)) existing.push_back(out);
      }
    }
    if (img.status == "ok") {
      img.first_window = plan_.total_windows;
      plan_.planned.push_back(int(plan_.images.size()));
      plan_.planned_first.push_back(plan_.total_windows);
      plan_.total_windows += img.grid.count();
    }
    plan_.images.push_back(std::move(img));
  }
  if (o_.on_error == "abort") {
    for (const auto& img : plan_.images)
      TILER_CHECK(img.status != "error", IoError, img.error << " (--on_error abort)");
  }
  if (!existing.empty()) {
    std::string list;
    for (size_t i = 0; i < existing.size() && i < 5; ++i) list += (i ? ", " : "") + existing[i];
    if (existing.size() > 5) list += ", ... (" + std::to_string(existing.size()) + " in all)";
    TILER_THROW(ConfigError, "outputs exist already: " << list
                                                       << "; pass --resume to skip finished images or "
                                                       << "--overwrite to redo them");
  }
}

void InferJob::maybeFault(int64_t windows_done) {
  if (!fault_ || fault_->rank != world_.rank || windows_done < fault_->after_windows) return;
  // Only the first attempt faults, so that a restarted group (ctrun --max_restarts) can finish.
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (restart != nullptr && std::string(restart) != "0") return;
  spdlog::warn("TILER_FAULT: injecting '{}' after {} windows", fault_->kind, windows_done);
  if (fault_->kind == "crash") raise(SIGSEGV);
  if (fault_->kind == "exit") std::_Exit(3);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void InferJob::prefetchLoop(const std::vector<SampleSlot>& slots, int64_t steps) {
  const int64_t B = o_.batch_size;
  const int64_t H = spec_.window_h, W = spec_.window_w, C = probe_.input_channels;
  const bool pinned = model_->device().is_cuda();
  std::map<int, std::unique_ptr<ImageReader>> readers;  // the few images this rank is inside
  try {
    for (int64_t step = 0; step < steps; ++step) {
      Batch batch;
      auto t0 = Clock::now();
      // Pinned host memory lets the copy to a GPU run asynchronously (forward() copies non_blocking).
      batch.pixels = torch::zeros({B, H, W, C}, torch::TensorOptions(torch::kFloat32).pinned_memory(pinned));
      batch.scales = torch::ones({B}, torch::kFloat32);
      batch.meta = torch::full({B, 2}, int64_t(-1), torch::kInt64);
      auto meta = batch.meta.accessor<int64_t, 2>();
      for (int64_t j = 0; j < B; ++j) {
        const int64_t pos = step * B + j;
        meta[j][1] = kSlotPadded;
        if (pos >= int64_t(slots.size()) || slots[size_t(pos)].padded) continue;
        const int64_t global = slots[size_t(pos)].index;
        meta[j][0] = global;
        auto [image_id, local] = plan_.locate(global);
        {
          std::lock_guard<std::mutex> lock(failed_mutex_);
          if (failed_.count(image_id)) {
            meta[j][1] = kSlotSkipped;
            continue;
          }
        }
        PlannedImage& img = plan_.images[size_t(image_id)];
        try {
          auto& reader = readers[image_id];
          if (!reader) {
            // Ranks walk the global order, so images before this one are finished for this rank.
            for (auto it = readers.begin(); it != readers.end();)
              it = it->first < image_id ? readers.erase(it) : ++it;
            reader = ImageReader::open(img.input);
          }
          windowToModelInput(readWindow(*reader, img.grid, local, pad_, o_.cval), img.adapt,
                             batch.pixels[j].data_ptr<float>());
          batch.scales[j] = float(img.scale);
          meta[j][1] = kSlotOk;
          ++batch.valid;
        } catch (const Error& e) {
          meta[j][1] = kSlotFailed;
          batch.new_errors.emplace_back(image_id, errorRankPrefix() + e.message());
          std::lock_guard<std::mutex> lock(failed_mutex_);
          failed_.insert(image_id);
          readers.erase(image_id);
        }
      }
      batch.read_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      batches_.push(std::move(batch));
    }
  } catch (...) {
    prefetch_error_ = std::current_exception();
  }
  batches_.close();
}

ImageJob& InferJob::jobFor(int image_id) {
  auto it = jobs_.find(image_id);
  if (it != jobs_.end()) return it->second;
  PlannedImage& img = plan_.images[size_t(image_id)];
  ImageJob job;
  fs::create_directories(o_.output_dir);
  const int64_t out_w = probe_.scale.apply(img.info.width), out_h = probe_.scale.apply(img.info.height);
  const int classes = probe_.output_channels;
  WriterOptions wo;
  wo.compression = parseCompression(o_.compression);
  wo.metadata_from = img.info.format == "tiff" ? img.input : "";
  wo.metadata_scale = probe_.scale.value();
  if (save_labels_) {
    WriterOptions lo = wo;
    lo.format = o_.format;
    const int label_classes = classes == 1 ? 2 : classes;
    job.labels = std::make_unique<ImageWriter>(img.outputs["labels"], out_w, out_h, 1,
                                               label_classes > 256 ? SampleType::kU16 : SampleType::kU8, lo);
  }
  if (save_probs_) {
    job.probs =
        std::make_unique<ImageWriter>(img.outputs["probs"], out_w, out_h, classes, SampleType::kF32, wo);
  }
  const float threshold = activation_ == Activation::kSigmoid ? 0.5f : 0.0f;
  ImageWriter* labels = job.labels.get();
  ImageWriter* probs = job.probs.get();
  job.stitcher = std::make_unique<Stitcher>(img.grid, classes, stitch_,
                                            [labels, probs, threshold](const cv::Mat& band, int64_t) {
                                              if (probs) probs->writeRows(band);
                                              if (labels)
                                                labels->writeRows(labelsFromProbabilities(band, threshold));
                                            });
  return jobs_.emplace(image_id, std::move(job)).first->second;
}

void InferJob::finishImage(int image_id, const std::string& error) {
  auto it = jobs_.find(image_id);
  PlannedImage& img = plan_.images[size_t(image_id)];
  std::string err = error;
  if (it != jobs_.end() && err.empty()) {
    try {
      if (it->second.labels) it->second.labels->close();
      if (it->second.probs) it->second.probs->close();
    } catch (const Error& e) {
      err = e.message();
    }
  }
  if (it != jobs_.end()) jobs_.erase(it);  // an unfinished writer removes its partial file
  std::lock_guard<std::mutex> lock(results_mutex_);
  if (!err.empty()) {
    if (img.status != "error") {
      img.status = "error";
      img.error = err;
      spdlog::error("{}", err);
    }
  } else if (img.status == "ok") {
    img.status = "done";
  }
}

void InferJob::stitchStep(StepResult& step) {
  for (auto& [image_id, message] : step.failures) {
    {
      std::lock_guard<std::mutex> lock(failed_mutex_);
      failed_.insert(image_id);
    }
    finishImage(image_id, message);
  }
  auto meta = step.meta.accessor<int64_t, 2>();
  std::vector<int64_t> order;
  for (int64_t k = 0; k < step.meta.size(0); ++k) {
    if (meta[k][1] == kSlotOk) order.push_back(k);
  }
  // Accumulate in global window order whatever rank produced each slot.
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return meta[a][0] < meta[b][0]; });
  const int64_t per_window = step.preds[0].numel();
  const float* base = step.preds.data_ptr<float>();
  for (int64_t k : order) {
    auto [image_id, local] = plan_.locate(meta[k][0]);
    {
      std::lock_guard<std::mutex> lock(results_mutex_);
      if (plan_.images[size_t(image_id)].status != "ok") continue;
    }
    try {
      ImageJob& job = jobFor(image_id);
      job.stitcher->add(local, base + k * per_window);
      if (job.stitcher->done()) finishImage(image_id, "");
    } catch (const Error& e) {
      finishImage(image_id, e.message());
    }
  }
}

void InferJob::stitchLoop() {
  try {
    while (auto step = steps_.pop()) {
      stitchStep(*step);
      if (o_.on_error == "abort") {
        // The stitcher thread throws; the main thread rethrows it at its next step.
        std::lock_guard<std::mutex> lock(results_mutex_);
        for (const auto& img : plan_.images)
          TILER_CHECK(img.status != "error", IoError, img.error << " (--on_error abort)");
      }
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(results_mutex_);
    stitch_error_ = std::current_exception();
  }
  // Anything still open never got all its windows (a failure elsewhere): its partial files go.
  jobs_.clear();
}

nlohmann::json InferJob::report(double seconds, const std::vector<torch::Tensor>& per_rank) {
  nlohmann::json j;
  j["world_size"] = world_.world_size;
  j["backend"] = dist_->backendName();
  j["device"] = model_->device().str();
  j["precision"] = precisionName(model_->precision());
  j["seconds"] = seconds;
  j["windows_total"] = plan_.total_windows;
  j["windows_per_second"] = seconds > 0 ? double(plan_.total_windows) / seconds : 0.0;
  j["model"] = o_.model;
  j["window"] = {spec_.window_w, spec_.window_h};
  j["output_scale"] = probe_.scale.value();
  j["per_rank"] = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    auto v = per_rank[r].accessor<double, 1>();
    j["per_rank"].push_back({{"rank", int(r)},
                             {"windows", int64_t(v[0])},
                             {"read_seconds", v[1]},
                             {"forward_seconds", v[2]},
                             {"gather_seconds", v[3]},
                             {"peak_rss_mb", v[4]}});
  }
  j["images"] = nlohmann::json::array();
  std::lock_guard<std::mutex> lock(results_mutex_);
  for (const auto& img : plan_.images) {
    nlohmann::json e;
    e["input"] = img.input;
    const std::string status = img.status == "done" ? "ok" : img.status == "ok" ? "error" : img.status;
    e["status"] = status;
    if (status == "error") e["error"] = img.error.empty() ? "not all windows were stitched" : img.error;
    if (img.info.width > 0) {
      e["width"] = img.info.width;
      e["height"] = img.info.height;
      e["windows"] = img.grid.count();
    }
    if (status == "ok" || status == "skipped") e["outputs"] = img.outputs;
    j["images"].push_back(e);
  }
  return j;
}

int InferJob::run() {
  start_ = Clock::now();
  world_ = joinWorld();
  validateOptions();
  fault_ = faultFromEnvironment();

  ModelOptions mo;
  mo.path = o_.model;
  mo.device = o_.device;
  mo.precision = o_.precision;
  mo.threads = o_.threads;
  mo.output_key = o_.output_key;
  mo.mean = o_.mean;
  mo.std = o_.std;
  mo.activation = activation_;
  mo.jit_optimize = o_.jit_optimize;
  mo.local_rank = world_.local_rank;
  model_ = std::make_unique<ModelRunner>(mo);
  probe_ = model_->probe(spec_.window_w, spec_.window_h);

  DistOptions dopts;
  dopts.backend = o_.backend;
  dopts.timeout = std::chrono::milliseconds(int64_t(o_.timeout * 1000));
  dist_ = std::make_unique<DistContext>(world_, dopts, model_->device());

  buildPlan();
  // Every rank must hold the same plan, or the shards would not fit together.
  auto agree = torch::tensor({plan_.total_windows, int64_t(plan_.planned.size())}, torch::kInt64);
  auto device = model_->device();
  const bool on_device = dist_->backendName() == "nccl";
  auto plans = dist_->allgather(on_device ? agree.to(device) : agree, "the plan check");
  for (size_t r = 0; r < plans.size(); ++r) {
    TILER_CHECK(torch::equal(plans[r].cpu(), agree), DistError,
                "rank " << r << " planned " << plans[r][0].item<int64_t>() << " windows, rank " << world_.rank
                        << " planned " << plan_.total_windows << ": the ranks see different inputs");
  }

  SamplerOptions so;
  so.world_size = world_.world_size;
  so.rank = world_.rank;
  DistributedSampler sampler(plan_.total_windows, so);
  const auto slots = sampler.slots();
  const int64_t B = o_.batch_size;
  const int64_t steps = (sampler.perRank() + B - 1) / B;
  const int64_t oh = probe_.scale.apply(spec_.window_h), ow = probe_.scale.apply(spec_.window_w);
  if (world_.rank == 0) {
    spdlog::info("{} image(s), {} windows of {}x{} on {} rank(s), {} step(s) of batch {}, {} {} on {}",
                 plan_.images.size(), plan_.total_windows, spec_.window_w, spec_.window_h, world_.world_size,
                 steps, B, dist_->backendName(), precisionName(model_->precision()), device.str());
  }

  Progress progress(plan_.total_windows, "windows", !o_.no_progress && world_.rank == 0);
  std::thread prefetch([&] { prefetchLoop(slots, steps); });
  std::thread stitcher;
  if (world_.rank == 0) stitcher = std::thread([&] { stitchLoop(); });
  auto stop_threads = [&] {
    batches_.close();
    steps_.close();
    if (prefetch.joinable()) prefetch.join();
    if (stitcher.joinable()) stitcher.join();
  };

  // Which rank held the world up: every rank notes its step in the store, read back on a timeout.
  auto laggards = [&](int64_t step) {
    std::string behind;
    for (int r = 0; r < world_.world_size; ++r) {
      const std::string at = dist_->getString("tiler/step/" + std::to_string(r), "-1");
      if (std::stoll(at) < step) behind += " rank " + std::to_string(r) + " (last seen at step " + at + ")";
    }
    return behind.empty() ? std::string() : "; behind:" + behind + ": hung or dead";
  };
  int64_t current_step = 0;
  try {
    for (int64_t step = 0; step < steps; ++step) {
      current_step = step;
      if (world_.world_size > 1)
        dist_->setString("tiler/step/" + std::to_string(world_.rank), std::to_string(step));
      auto batch = batches_.pop();
      if (!batch) std::rethrow_exception(prefetch_error_);
      read_seconds_ += batch->read_seconds;
      // Errors go through the store before the collective that tells everyone about them.
      for (auto& [image_id, message] : batch->new_errors)
        dist_->setString("tiler/error/" + std::to_string(image_id), message);

      auto t0 = Clock::now();
      torch::Tensor preds;
      if (batch->valid > 0) {
        preds = model_->forward(batch->pixels, batch->scales);
      } else {
        preds = torch::zeros({B, probe_.output_channels, oh, ow}, torch::TensorOptions().device(device));
      }
      if (device.is_cuda() && !on_device) preds = preds.cpu();
      auto t1 = Clock::now();
      forward_seconds_ += std::chrono::duration<double>(t1 - t0).count();
      my_windows_ += batch->valid;

      const std::string what = "step " + std::to_string(step) + " of " + std::to_string(steps);
      auto metas =
          dist_->allgather(on_device ? batch->meta.to(device) : batch->meta, "the window list of " + what);
      StepResult result;
      for (auto& m : metas) {
        m = m.cpu();
        auto a = m.accessor<int64_t, 2>();
        for (int64_t k = 0; k < m.size(0); ++k) {
          if (a[k][1] != kSlotFailed) continue;
          const int image_id = plan_.locate(a[k][0]).first;
          {
            std::lock_guard<std::mutex> lock(failed_mutex_);
            failed_.insert(image_id);
          }
          if (announced_failures_.insert(image_id).second) result.failures.emplace(image_id, "");
        }
      }
      auto gathered = dist_->gather(preds, "the predictions of " + what);
      gather_seconds_ += std::chrono::duration<double>(Clock::now() - t1).count();
      if (world_.rank == 0) {
        for (auto& [image_id, message] : result.failures)
          message =
              dist_->getString("tiler/error/" + std::to_string(image_id),
                               "'" + plan_.images[size_t(image_id)].input + "': failed on another rank");
        result.preds = torch::cat(gathered).to(torch::kCPU).contiguous();
        result.meta = torch::cat(metas).contiguous();
        steps_.push(std::move(result));
        rethrowStitchError();
      }
      if (o_.on_error == "abort") {
        std::lock_guard<std::mutex> lock(failed_mutex_);
        TILER_CHECK(failed_.empty(), IoError,
                    "'" << plan_.images[size_t(*failed_.begin())].input << "' failed (--on_error abort)");
      }
      progress.update(std::min(plan_.total_windows, (step + 1) * B * world_.world_size));
      maybeFault(my_windows_);
    }
  } catch (const TimeoutError& e) {
    stop_threads();
    throw TimeoutError(e.message() + laggards(current_step), __FILE__, __LINE__);
  } catch (...) {
    stop_threads();
    throw;
  }
  steps_.close();
  stop_threads();
  rethrowStitchError();

  auto stats = torch::tensor(
      {double(my_windows_), read_seconds_, forward_seconds_, gather_seconds_, peakRssMegabytes()},
      torch::kDouble);
  auto per_rank = dist_->allgather(on_device ? stats.to(device) : stats, "the final statistics");
  for (auto& t : per_rank) t = t.cpu();
  int exit_code = kExitOk;
  if (world_.rank == 0) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    nlohmann::json j = report(seconds, per_rank);
    writeJsonAtomically(o_.report, j);
    int failed = 0, ok = 0, skipped = 0;
    for (const auto& e : j["images"]) {
      failed += e["status"] == "error";
      ok += e["status"] == "ok";
      skipped += e["status"] == "skipped";
    }
    if (failed > 0) exit_code = kExitSomeFailed;
    spdlog::info("{} image(s) done, {} skipped, {} failed in {:.1f} s ({:.1f} windows/s); report: {}", ok,
                 skipped, failed, seconds, j["windows_per_second"].get<double>(), o_.report);
    if (failed > 0) {
      for (const auto& e : j["images"])
        if (e["status"] == "error") spdlog::error("{}", e["error"].get<std::string>());
    }
  }
  // The exit code is rank 0's verdict; tell everyone so ctrun sees the same code from every rank.
  auto code = torch::tensor({int64_t(exit_code)}, torch::kInt64);
  if (on_device) code = code.to(device);
  dist_->broadcast(code, 0, "the exit code");
  return int(code.cpu().item<int64_t>());
}

}  // namespace

int runInfer(InferOptions options) {
  return InferJob(std::move(options)).run();
}

}  // namespace tiler
