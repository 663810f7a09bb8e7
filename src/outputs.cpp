#include "tiler/outputs.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tiler/device_stitch.hpp"
#include "tiler/error.hpp"
#include "tiler/fault.hpp"
#include "tiler/map_writers.hpp"
#include "tiler/model.hpp"
#include "tiler/output_kinds.hpp"
#include "tiler/platform.hpp"

namespace fs = std::filesystem;

namespace tiler {

SampleType parseProbsType(const std::string& name) {
  if (name == "f32") return SampleType::kF32;
  if (name == "f16") return SampleType::kF16;
  if (name == "u8") return SampleType::kU8;
  TILER_THROW(ConfigError, "--probs_dtype must be f32, f16 or u8; got '" << name << "'");
}

namespace {

// Where a band of probabilities goes as stored: the band itself for f32, else a matrix of the stored type.
cv::Mat storedProbabilitiesBuffer(const cv::Mat& band, SampleType type) {
  if (type == SampleType::kF32) return band;
  return cv::Mat(
      band.rows, band.cols,
      type == SampleType::kU8 ? CV_MAKETYPE(CV_8U, band.channels()) : CV_MAKETYPE(CV_16F, band.channels()));
}

// Rows of probabilities as stored, into `out` (its rows, of the stored type): u8 probabilitiesToBytes
// (`large`: some value may be 2^23 or more); f16 as converted.
void storeProbabilities(const cv::Mat& rows, SampleType type, cv::Mat out, bool large) {
  if (type != SampleType::kU8) return rows.convertTo(out, out.type());
  for (int y = 0; y < rows.rows; ++y)
    probabilitiesToBytes(rows.ptr<float>(y), int64_t(rows.cols) * rows.channels(), out.ptr<uint8_t>(y),
                         large);
}

// segment: an image's stitched maps (blend), each finished band handed to the image's writers (map_writers:
// one per --save kind) as the labels and stored probabilities they ask for.
class StitchedOutputs : public WindowConsumer {
 public:
  StitchedOutputs(CatalogImage& img, const OutputOptions& o, const WriterOptions& wo)
      : img_(img), o_(o), pool_(wo.pool.get()) {
    fs::create_directories(fs::path(img.outputs.begin()->second).parent_path());
    MapOutput map;
    map.width = o.scale.apply(img.info.width);
    map.height = o.scale.apply(img.info.height);
    map.classes = o.classes;
    map.probs_type = o.probs_type;
    map.classes_named = o.classes_named;
    map.format = o.format;
    map.writer = wo;
    map.simplify = o.simplify;
    map.input_pixels_per_label_pixel = 1.0 / wo.metadata_scale;
    // In the table's order, so that the labels come before the polygons traced from them.
    for (const OutputKind& kind : outputKinds()) {
      if (!img.outputs.count(kind.name)) continue;
      auto writer = makeMapWriter(kind.name, img.outputs.at(kind.name), map);
      TILER_CHECK(writer != nullptr, ConfigError,
                  "--save " << kind.name << " is not an output of a stitched map");
      if (map.labels_raster.empty()) map.labels_raster = writer->labelsRaster();
      needs_labels_ = needs_labels_ || writer->needsLabels();
      needs_probs_ = needs_probs_ || writer->needsProbs();
      writers_.push_back(std::move(writer));
    }
    StitchOptions stitch = o.stitch;
    stitch.pool = wo.pool.get();
    auto windows = img.masked ? std::optional<std::vector<int64_t>>(img.kept) : std::nullopt;
    if (o.stitch_device) {
      try {
        if (o.before_device_stitcher) o.before_device_stitcher();
        DeviceBandOptions band{needs_labels_, needs_probs_, o.probs_type, o.label_threshold};
        device_stitcher_ = std::make_unique<DeviceStitcher>(
            img.grid, o.classes, stitch, band, *o.stitch_device,
            [this](const DeviceStitcher::Band& b) { writeDeviceBand(b); }, windows);
      } catch (const std::exception& e) {
        if (!isOutOfMemory(e)) throw;
        spdlog::warn("'{}': stitched on the host: {} is out of memory for its accumulator ({})", img.input,
                     o.stitch_device->str(), firstLine(e.what()));
      }
    }
    if (!device_stitcher_)
      stitcher_ = std::make_unique<Stitcher>(
          img.grid, o.classes, stitch, [this](const cv::Mat& band, int64_t) { writeBand(band); }, windows);
  }

  void add(int64_t window, const float* values) override { stitcher_->addMany({{window, values}}); }
  // A step's windows of one grid row are accumulated together.
  void addMany(const std::vector<std::pair<int64_t, const float*>>& windows) override {
    stitcher_->addMany(windows);
  }
  // Windows on OutputOptions::stitch_device: blended there, or copied to the host for an image whose
  // accumulator did not fit there.
  void addTensors(const std::vector<std::pair<int64_t, torch::Tensor>>& windows) {
    if (device_stitcher_) return device_stitcher_->addMany(windows);
    std::vector<torch::Tensor> host;
    std::vector<std::pair<int64_t, const float*>> values;
    for (const auto& [window, chw] : windows) {
      host.push_back(chw.to(torch::kCPU).contiguous());
      values.emplace_back(window, host.back().data_ptr<float>());
    }
    stitcher_->addMany(values);
  }
  bool done() const override { return device_stitcher_ ? device_stitcher_->done() : stitcher_->done(); }
  bool injectTileFault() override {
    for (auto& writer : writers_) writer->injectFault();
    return true;
  }

  std::vector<std::string> commit() override {
    // An image a mask left without a window: all zeros, band by band.
    if (img_.plannedWindows() == 0 && device_stitcher_) device_stitcher_->finishEmpty();
    if (img_.plannedWindows() == 0 && stitcher_) stitcher_->finishEmpty();
    // Phase one: every output closed under its partial name. Phase two: all renamed, or none.
    for (auto& writer : writers_) writer->finish();
    return commitAllOrNothing([&](std::vector<std::string>& renamed) {
      for (auto& writer : writers_) writer->commit(renamed);
    });
  }

 private:
  // Each output value once, while the band is at hand, in pieces of rows on the pool: non-finite predictions
  // (they stay so through blending), the stored probabilities, the labels.
  void writeBand(const cv::Mat& band) {
    cv::Mat stored = needs_probs_ ? storedProbabilitiesBuffer(band, o_.probs_type) : cv::Mat();
    cv::Mat label_rows;
    if (needs_labels_) label_rows.create(band.rows, band.cols, cvDepthOf(labelSampleType(band.channels())));
    std::atomic<int64_t> non_finite{0};
    const float threshold = o_.label_threshold;
    parallelRows(pool_, band.rows, kMinRowsPerPiece, [&](int64_t a, int64_t b) {
      const cv::Mat rows = band.rowRange(int(a), int(b));
      int64_t bad = 0;
      bool large = false;
      for (int y = 0; y < rows.rows; ++y)
        bad += countNonFinite(rows.ptr<float>(y), int64_t(rows.cols) * rows.channels(), large);
      non_finite += bad;
      if (needs_probs_ && stored.data != band.data)
        storeProbabilities(rows, o_.probs_type, stored.rowRange(int(a), int(b)), large);
      if (needs_labels_) labelsInto(rows, threshold, label_rows.rowRange(int(a), int(b)));
    });
    img_.non_finite_values += non_finite.load();
    writeToAll({needs_labels_ ? &label_rows : nullptr, needs_probs_ ? &stored : nullptr});
  }

  // A band the device converted, or one it gave back as floats (a value is not finite).
  void writeDeviceBand(const DeviceStitcher::Band& band) {
    if (!band.floats.empty()) return writeBand(band.floats);
    writeToAll({needs_labels_ ? &band.labels : nullptr, needs_probs_ ? &band.probs : nullptr});
  }

  void writeToAll(const MapBand& band) {
    for (auto& writer : writers_) writer->write(band);
  }

  CatalogImage& img_;       // the catalog's, which outlives the stage
  const OutputOptions& o_;  // the stage's
  WorkPool* pool_;          // the stage's: compressions and the bands' pieces of rows
  std::vector<std::unique_ptr<MapWriter>> writers_;  // one per --save kind, in output_kinds' order (owned)
  bool needs_labels_ = false, needs_probs_ = false;  // what some writer takes of each band
  std::unique_ptr<Stitcher> stitcher_;               // on the host, or
  std::unique_ptr<DeviceStitcher> device_stitcher_;  // on OutputOptions::stitch_device
};

}  // namespace

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

std::string OutputStage::ownedResults() const {
  nlohmann::json results = nlohmann::json::array();
  for (int id = 0; id < int(catalog_.images().size()); ++id) {
    const CatalogImage& img = catalog_.image(id);
    if (owns(id))
      results.push_back({{"id", id},
                         {"status", img.status},
                         {"error", utf8Safe(img.error)},
                         {"non_finite", img.non_finite_values},
                         {"objects", img.objects},
                         {"objects_at_window_edge", img.objects_at_window_edge}});
  }
  return results.dump();
}

void OutputStage::applyResults(WindowCatalog& catalog, const std::string& results) {
  for (const auto& r : nlohmann::json::parse(results)) {
    CatalogImage& img = catalog.image(r["id"].get<int>());
    img.status = r["status"].get<std::string>();
    img.error = r["error"].get<std::string>();
    img.non_finite_values = r["non_finite"].get<int64_t>();
    img.objects = r["objects"].get<int64_t>();
    img.objects_at_window_edge = r["objects_at_window_edge"].get<int64_t>();
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

WindowConsumer& OutputStage::outputsFor(int image_id) {
  auto it = open_.find(image_id);
  if (it != open_.end()) return *it->second;
  CatalogImage& img = catalog_.image(image_id);
  std::unique_ptr<WindowConsumer> out;
  if (options_.per_window) {
    out = std::make_unique<WindowOutputs>(img, *options_.per_window);
  } else {
    WriterOptions wo;
    wo.compression = options_.compression;
    wo.software = kTilerSoftware;  // a later run over this directory knows these for outputs
    wo.metadata_from = img.info.format == "tiff" ? img.input : "";
    // Output pixels per level-0 input pixel: the model's scale over the processing downsample.
    wo.metadata_scale = options_.scale.value() / img.resolution.downsample;
    if (img.resolution.mpp) wo.mpp = *img.resolution.mpp / options_.scale.value();
    wo.pyramid = options_.pyramid;
    wo.background = true;  // compression off the stage's thread
    wo.pool = pool_;
    if (options_.instances) {
      InstanceOptions io = *options_.instances;
      io.tiff = wo;
      out = std::make_unique<InstanceOutputs>(img, std::move(io));
    } else {
      out = std::make_unique<StitchedOutputs>(img, options_, wo);
    }
  }
  return *open_.emplace(image_id, std::move(out)).first->second;
}

void OutputStage::commit(CatalogImage& img, WindowConsumer& out) {
  for (const auto& path : out.commit()) stats_.bytes_written += bytesOnDisk(path);
  const auto objects = out.objects();
  if (!objects) return;
  img.objects = (*objects)[0];
  img.objects_at_window_edge = (*objects)[1];
  if (img.objects_at_window_edge > 0 && options_.instances)
    spdlog::warn(
        "'{}': {} object(s) were cut by a window edge inside the image where their window kept them and "
        "were left out (a larger --overlap than the largest object's diameter keeps them); {} written",
        img.input, img.objects_at_window_edge, img.objects);
  else if (img.objects_at_window_edge > 0)
    spdlog::warn(
        "'{}': {} of {} object(s) touch a window edge inside the image: a window saw them cut, and "
        "another may have seen more of them (a larger --overlap than the largest object)",
        img.input, img.objects_at_window_edge, img.objects);
}

void OutputStage::finishImage(int image_id, const std::string& error) {
  CatalogImage& img = catalog_.image(image_id);
  std::string err = error;
  auto it = open_.find(image_id);
  if (it != open_.end() && err.empty()) {
    img.non_finite_values += it->second->nonFiniteValues();
    if (img.non_finite_values > 0)
      spdlog::warn(
          "'{}': {} value(s) of the predictions are not finite (the model gave NaN or Inf); those values "
          "mean nothing (a label, a class or a feature made of them neither)",
          img.input, img.non_finite_values);
    try {
      commit(img, *it->second);
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

void OutputStage::stitchImageWindows(const StepResult& step, const std::vector<LocatedSlot>& located,
                                     size_t first, size_t last, const float* base, int64_t per_window) {
  const int image_id = located[first].image;
  try {
    WindowConsumer& out = outputsFor(image_id);
    CatalogImage& img = catalog_.image(image_id);
    std::vector<std::pair<int64_t, const float*>> windows;
    std::vector<std::pair<int64_t, torch::Tensor>> tensors;  // on the stitch device
    // Only a stitching consumer (segment) is given a stitch device.
    const bool on_device = options_.stitch_device && step.preds.defined() && step.records.empty() &&
                           !options_.per_window && !options_.instances;
    for (size_t i = first; i < last; ++i) {
      // A consumer that compresses tiles fails as they are written; the others fail here.
      const bool fault = options_.stitched_window && options_.stitched_window();
      TILER_CHECK(!fault || out.injectTileFault(), IoError,
                  "'" << img.input << "': " << injectedFailure("write failure"));
      if (!step.records.empty()) {
        out.addRecord(located[i].window, step.records[size_t(located[i].slot)]);
        continue;
      }
      if (on_device) {
        tensors.emplace_back(located[i].window, step.preds[located[i].slot]);
        continue;
      }
      const float* values = base + located[i].slot * per_window;
      // A stitcher counts the values it blends as each band is finished, an instance consumer the values of
      // each map; vectors are counted here.
      if (options_.per_window) img.non_finite_values += countNonFinite(values, per_window);
      windows.emplace_back(located[i].window, values);
    }
    if (!windows.empty()) out.addMany(windows);
    if (!tensors.empty()) static_cast<StitchedOutputs&>(out).addTensors(tensors);
    if (out.done()) finishImage(image_id, "");
  } catch (...) {
    finishImage(image_id, describeImageException(std::current_exception(), catalog_.image(image_id).input));
  }
}

}  // namespace tiler
