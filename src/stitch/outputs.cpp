#include "tiler/stitch/outputs.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/core/fault.hpp"
#include "tiler/core/output_kinds.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/readers/readers.hpp"
#include "tiler/model/probe.hpp"
#include "tiler/stitch/device_stitch.hpp"
#include "tiler/writers/map_writers.hpp"

namespace fs = std::filesystem;

namespace tiler {

OutputStage::OutputStage(WindowCatalog& catalog, OutputOptions options)
    : catalog_(catalog),
      options_(std::move(options)),
      pool_(std::make_shared<WorkPool>(options_.write_threads)),
      steps_(options_.depth) {
  thread_ = std::thread([this] { loop(); });
}

OutputStage::~OutputStage() {
  steps_.close();
  if (thread_.joinable()) thread_.join();
}

bool OutputStage::submit(StepResult step) {
  return steps_.push(std::move(step));
}

std::optional<std::string> OutputStage::error() {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return error_;
}

void OutputStage::finish() {
  steps_.close();
  if (thread_.joinable()) thread_.join();
}

namespace {

// An image's output statistics as the owner sends them to rank 0: [count, mean, std, [[q, value], ...]] of
// each channel, then of all channels.
nlohmann::json statisticsRows(const ImageStatistics& s) {
  nlohmann::json rows = nlohmann::json::array();
  auto row = [](const ValueStatistics& v) {
    nlohmann::json qs = nlohmann::json::array();
    for (const auto& [q, value] : v.percentiles) qs.push_back({q, value});
    return nlohmann::json{v.count, v.mean, v.std, qs};
  };
  for (const ValueStatistics& c : s.channels) rows.push_back(row(c));
  rows.push_back(row(s.all));
  return rows;
}

ImageStatistics statisticsOfRows(const nlohmann::json& rows) {
  ImageStatistics s;
  for (size_t k = 0; k < rows.size(); ++k) {
    ValueStatistics v;
    v.count = rows[k][0].get<double>(), v.mean = rows[k][1].get<double>(), v.std = rows[k][2].get<double>();
    for (const auto& q : rows[k][3]) v.percentiles[q[0].get<double>()] = q[1].get<double>();
    (k + 1 < rows.size() ? s.channels.emplace_back(v) : s.all) = v;
  }
  return s;
}

}  // namespace

std::string OutputStage::ownedResults() const {
  nlohmann::json results = nlohmann::json::array();
  for (int id = 0; id < int(catalog_.images().size()); ++id) {
    const CatalogImage& img = catalog_.image(id);
    if (!owns(id)) continue;
    nlohmann::json r = {{"id", id},
                        {"status", img.status},
                        {"error", utf8Safe(img.error)},
                        {"non_finite", img.non_finite_values},
                        {"f16_overflow", img.f16_overflow_values},
                        {"objects", img.objects},
                        {"objects_at_window_edge", img.objects_at_window_edge}};
    if (img.output_statistics) {
      r["output_statistics"] = statisticsRows(*img.output_statistics);
      r["output_affine"] = {img.output_affine.gain, img.output_affine.offset};
    }
    results.push_back(r);
  }
  return results.dump();
}

void OutputStage::applyResults(WindowCatalog& catalog, const std::string& results) {
  for (const auto& r : nlohmann::json::parse(results)) {
    CatalogImage& img = catalog.image(r["id"].get<int>());
    img.status = r["status"].get<std::string>();
    img.error = r["error"].get<std::string>();
    img.non_finite_values = r["non_finite"].get<int64_t>();
    img.f16_overflow_values = r["f16_overflow"].get<int64_t>();
    img.objects = r["objects"].get<int64_t>();
    img.objects_at_window_edge = r["objects_at_window_edge"].get<int64_t>();
    if (r.contains("output_statistics")) {
      img.output_statistics = statisticsOfRows(r["output_statistics"]);
      img.output_affine.gain = r["output_affine"][0].get<std::vector<double>>();
      img.output_affine.offset = r["output_affine"][1].get<std::vector<double>>();
    }
  }
}

void OutputStage::loop() {
  for (int id = 0; id < int(catalog_.images().size()); ++id) stats_.images_owned += owns(id);
  // Images a mask left without a window: all zeros, written now (band by band) since no step brings them.
  for (int id = 0; id < int(catalog_.images().size()); ++id) {
    const CatalogImage& img = catalog_.image(id);
    if (!owns(id) || img.status != "ok" || img.first_window < 0 || img.plannedWindows() > 0) continue;
    try {
      outputsFor(id);
      finishImage(id, "");
    } catch (...) {
      finishImage(id, describeImageException(std::current_exception(), img.input));
    }
  }
  try {
    while (auto step = steps_.pop()) {
      const auto t0 = std::chrono::steady_clock::now();
      stitchStep(*step);
      stats_.write_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!options_.abort_on_error) continue;
      for (const auto& img : catalog_.images()) {
        if (img.status != "error") continue;
        std::lock_guard<std::mutex> lock(error_mutex_);
        error_ = img.error + " (--on_error abort)";
        break;
      }
      if (error()) break;
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error_ = "the output stage failed: " + describeException(std::current_exception());
  }
  // Whoever pushes next learns at once that nobody is listening.
  steps_.close();
  // Anything still open never got all its windows: its partial files go.
  for (auto& [image_id, out] : open_) {
    CatalogImage& img = catalog_.image(image_id);
    if (img.status == "ok") {
      img.status = "error";
      img.error = "'" + img.input + "': not all windows were stitched (the run stopped)";
    }
  }
  open_.clear();
}

std::vector<std::unique_ptr<ImageConsumer>>& OutputStage::outputsFor(int image_id) {
  auto it = open_.find(image_id);
  if (it != open_.end()) return it->second;
  CatalogImage& img = catalog_.image(image_id);
  WriterOptions wo;
  wo.compression = options_.compression;
  wo.software = kTilerSoftware;  // a later run over this directory knows these for outputs
  wo.metadata_from = readerHas(img.info, kTiffTags) ? img.input : "";
  // Output pixels per level-0 input pixel: the model's scale over the processing downsample.
  wo.metadata_scale = options_.scale.value() / img.resolution.downsample;
  if (img.resolution.mpp) wo.mpp = *img.resolution.mpp / options_.scale.value();
  wo.pyramid = options_.pyramid;
  wo.background = true;  // compression off the stage's thread
  wo.pool = pool_;
  TILER_CHECK(!options_.parts.empty(), ConfigError, "the output stage was given no task's consumer");
  std::vector<std::unique_ptr<ImageConsumer>> consumers;
  for (const OutputPart& part : options_.parts) consumers.push_back(part.consumer(img, wo));
  return open_.emplace(image_id, std::move(consumers)).first->second;
}

void OutputStage::finishImage(int image_id, const std::string& error) {
  CatalogImage& img = catalog_.image(image_id);
  std::string err = error;
  auto it = open_.find(image_id);
  if (it != open_.end() && err.empty()) {
    try {
      for (auto& consumer : it->second)
        for (const auto& path : consumer->finalize()) stats_.bytes_written += bytesOnDisk(path);
    } catch (...) {
      err = describeImageException(std::current_exception(), img.input);
    }
  }
  if (it != open_.end()) open_.erase(it);  // unfinished writers remove their partial files
  if (owns(image_id)) unmarkReading(img);  // every rank's reads of it are over: its windows all came
  if (!err.empty()) {
    if (img.status != "error") {
      img.status = "error";
      img.error = err;
      if (owns(image_id)) spdlog::error("{}", err);  // once, by the image's owner
    }
  } else if (img.status == "ok") {
    img.status = "done";
  }
}

void OutputStage::stitchStep(StepResult& step) {
  for (auto& [image_id, message] : step.failures) finishImage(image_id, message);
  // None of this step's windows are this rank's to write.
  if (!step.preds.defined() && step.records.empty()) return;
  std::vector<LocatedSlot> located;
  for (size_t k = 0; k < step.slots.size(); ++k) {
    if (!step.slots[k].ok()) continue;
    const int64_t global = step.slots[k].window;
    const auto [image, window] = catalog_.locate(global);
    located.push_back({int64_t(k), global, image, window});
  }
  // Accumulate in global window order whatever rank produced each slot.
  std::sort(located.begin(), located.end(),
            [](const LocatedSlot& a, const LocatedSlot& b) { return a.global < b.global; });
  const int64_t per_window =
      step.preds.defined() ? step.preds.numel() / std::max<int64_t>(step.preds.size(0), 1) : 0;
  const float* base = step.preds.defined() ? step.preds.data_ptr<float>() : nullptr;
  // Global order keeps an image's windows together: each image's run goes to its stitcher at once, which
  // accumulates the windows of one grid row together.
  for (size_t first = 0; first < located.size();) {
    const int image_id = located[first].image;
    size_t last = first + 1;
    while (last < located.size() && located[last].image == image_id) ++last;
    if (catalog_.image(image_id).status == "ok")
      stitchImageWindows(step, located, first, last, base, per_window);
    first = last;
  }
}

namespace {

// Part `part`'s share of slot `slot` of a step's predictions (`per_window` values a slot from `base`).
WindowResult partOfSlot(const StepResult& step, const OutputPart& part, int64_t slot, const float* base,
                        int64_t per_window, bool on_device) {
  WindowResult result;
  if (!step.records.empty()) {
    result.record = &step.records[size_t(slot)];
  } else if (!on_device) {
    result.values = base + slot * per_window + part.offset;
  } else if (part.window_sizes.empty()) {
    result.on_device = step.preds[slot];
  } else {
    int64_t count = 1;
    for (int64_t size : part.window_sizes) count *= size;
    result.on_device = step.preds[slot].narrow(0, part.offset, count).view(part.window_sizes);
  }
  return result;
}

}  // namespace

void OutputStage::aggregateAll(std::vector<std::unique_ptr<ImageConsumer>>& consumers,
                               const std::vector<std::vector<WindowResult>>& windows) {
  // Each head's consumer has its own accumulator and files: the heads take their shares at once, so a
  // multi-head job stitches in the time of its largest head rather than their sum. Every one has returned
  // before the first failure is rethrown (the image's consumers are then closed).
  std::vector<std::future<void>> others;
  for (size_t p = 1; p < consumers.size(); ++p)
    others.push_back(std::async(std::launch::async, [&, p] { consumers[p]->aggregate(windows[p]); }));
  runBesideOthers(others, [&] { consumers[0]->aggregate(windows[0]); });
}

void OutputStage::stitchImageWindows(const StepResult& step, const std::vector<LocatedSlot>& located,
                                     size_t first, size_t last, const float* base, int64_t per_window) {
  const int image_id = located[first].image;
  try {
    auto& consumers = outputsFor(image_id);
    const CatalogImage& img = catalog_.image(image_id);
    // Predictions stay where they are: on the stitch device when the job gave one.
    const bool on_device = step.records.empty() && step.preds.defined() && options_.stitch_device;
    std::vector<std::vector<WindowResult>> windows(consumers.size());
    for (size_t i = first; i < last; ++i) {
      // A consumer that compresses tiles fails as they are written; the others fail here.
      if (options_.stitched_window && options_.stitched_window()) {
        bool in_tiles = false;
        for (auto& consumer : consumers) in_tiles = consumer->injectTileFault() || in_tiles;
        TILER_CHECK(in_tiles, IoError, "'" << img.input << "': " << injectedFailure("write failure"));
      }
      for (size_t p = 0; p < consumers.size(); ++p) {
        windows[p].push_back(
            partOfSlot(step, options_.parts[p], located[i].slot, base, per_window, on_device));
        windows[p].back().window = located[i].window;
      }
    }
    aggregateAll(consumers, windows);
    bool done = true;
    for (const auto& consumer : consumers) done = done && consumer->done();
    if (done) finishImage(image_id, "");
  } catch (...) {
    finishImage(image_id, describeImageException(std::current_exception(), catalog_.image(image_id).input));
  }
}

}  // namespace tiler
