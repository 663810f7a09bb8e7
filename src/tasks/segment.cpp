// tasks/segment: the task segment: a map a window (NCHW), blended into one map an image (blend,
// device_stitch) and written by its map writers (map_writers: labels, probs, polygons, zarr).
#include "tiler/model/model.hpp"
#include "tiler/tasks/task.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/stitch/device_stitch.hpp"
#include "tiler/stitch/output_statistics.hpp"
#include "tiler/writers/blend.hpp"
#include "tiler/writers/map_writers.hpp"

namespace fs = std::filesystem;

namespace tiler {

const Task& segmentTask();

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
class StitchedOutputs : public ImageConsumer {
 public:
  StitchedOutputs(CatalogImage& img, const TaskOutputs& outputs, const WriterOptions& wo)
      : img_(img),
        s_(settingsOf<SegmentSettings>(segmentTask(), outputs.flags)),
        classes_(int(outputs.probe.output_channels)),
        pool_(wo.pool.get()) {
    const OutputOptions& o = outputs.stage;
    makeParentDirectory(img.outputs.begin()->second);
    MapOutput map;
    map.width = o.scale.apply(img.info.width);
    map.height = o.scale.apply(img.info.height);
    map.classes = classes_;
    map.settings = s_.map;
    map.writer = wo;
    map.input_pixels_per_label_pixel = 1.0 / wo.metadata_scale;
    // A card's postprocessing over the output's statistics: the blended map is held on disk until they are
    // known (two passes); the host blends it, whose bands are floats.
    if (!outputs.flags.blended_steps.empty()) {
      passes_ = std::make_unique<StatisticsPasses>(outputs.flags.blended_steps,
                                                   img.input_statistics ? &*img.input_statistics : nullptr,
                                                   map.width, map.height, classes_, "'" + img.input + "'");
      band_rows_ = std::max<int64_t>(1, o.scale.apply(img.grid.windowHeight()));
    }
    // In the formats' order, so that a format is made after the one whose file it reads (its `after`).
    for (const OutputFormat& format : outputFormats()) {
      const std::string kind = format.naming.name;
      if (!img.outputs.count(kind)) continue;
      auto writer = makeMapWriter(kind, img.outputs.at(kind), map);
      TILER_CHECK(writer != nullptr, ConfigError, "--save " << kind << " is not an output of a stitched map");
      if (map.labels_raster.empty()) map.labels_raster = writer->labelsRaster();
      needs_labels_ = needs_labels_ || writer->needsLabels();
      needs_probs_ = needs_probs_ || writer->needsProbs();
      writers_.push_back(std::move(writer));
    }
    StitchOptions stitch = s_.stitch;
    stitch.pool = wo.pool.get();
    auto windows = img.masked ? std::optional<std::vector<int64_t>>(img.kept) : std::nullopt;
    if (o.stitch_device && !passes_) {
      try {
        if (o.before_device_stitcher) o.before_device_stitcher();
        DeviceBandOptions band{needs_labels_, needs_probs_, s_.map.probs_type, s_.label_threshold};
        device_stitcher_ = std::make_unique<DeviceStitcher>(
            img.grid, classes_, stitch, band, *o.stitch_device,
            [this](const DeviceStitcher::Band& b) { writeDeviceBand(b); }, windows);
      } catch (const std::exception& e) {
        if (!isOutOfMemory(e)) throw;
        spdlog::warn("'{}': stitched on the host: {} is out of memory for its accumulator ({})", img.input,
                     o.stitch_device->str(), firstLine(e.what()));
      }
    }
    if (!device_stitcher_)
      stitcher_ = std::make_unique<Stitcher>(
          img.grid, classes_, stitch,
          [this](const cv::Mat& band, int64_t) { passes_ ? passes_->add(band) : writeBand(band); }, windows);
  }

  // A step's windows of one grid row are accumulated together; windows on OutputOptions::stitch_device are
  // blended there, or copied to the host for an image whose accumulator did not fit there.
  void aggregate(const std::vector<WindowResult>& windows) override {
    std::vector<torch::Tensor> host;
    std::vector<std::pair<int64_t, const float*>> values;
    std::vector<std::pair<int64_t, torch::Tensor>> tensors;
    for (const WindowResult& w : windows) {
      if (!w.on_device.defined()) {
        values.emplace_back(w.window, w.values);
      } else if (device_stitcher_) {
        tensors.emplace_back(w.window, w.on_device);
      } else {
        host.push_back(w.on_device.to(torch::kCPU).contiguous());
        values.emplace_back(w.window, host.back().data_ptr<float>());
      }
    }
    if (!tensors.empty()) device_stitcher_->addMany(tensors);
    if (!values.empty()) stitcher_->addMany(values);
  }
  bool done() const override { return device_stitcher_ ? device_stitcher_->done() : stitcher_->done(); }
  bool injectTileFault() override {
    for (auto& writer : writers_) writer->injectFault();
    if (passes_) passes_->failAsFullDisk();
    return true;
  }

  std::vector<std::string> finalize() override {
    // An image a mask left without a window: all zeros, band by band.
    if (img_.plannedWindows() == 0 && device_stitcher_) device_stitcher_->finishEmpty();
    if (img_.plannedWindows() == 0 && stitcher_) stitcher_->finishEmpty();
    if (passes_) {
      // The second pass: the whole map's statistics known, every band through the rest of the chain.
      passes_->replay(band_rows_, [this](const cv::Mat& band) { writeBand(band); });
      img_.output_statistics = passes_->statistics();
      img_.output_affine = passes_->affine();
      passes_.reset();  // its temporary file goes now, not with the image's writers
    }
    addNonFinite(img_, 0);
    if (img_.f16_overflow_values > 0)
      spdlog::warn(
          "'{}': {} value(s) are beyond float16's range (65504) and are stored as infinite "
          "(--probs_dtype f16); --probs_dtype f32 keeps them",
          img_.input, img_.f16_overflow_values);
    // Phase one: every output closed under its partial name. Phase two: all renamed, or none.
    std::vector<OutputWriter*> writers;
    for (auto& writer : writers_) writers.push_back(writer.get());
    return commitWriters(writers);
  }

 private:
  // Each output value once, while the band is at hand, in pieces of rows on the pool: non-finite predictions
  // (they stay so through blending), the stored probabilities, the labels.
  void writeBand(const cv::Mat& band) {
    const SampleType probs_type = s_.map.probs_type;
    cv::Mat stored = needs_probs_ ? storedProbabilitiesBuffer(band, probs_type) : cv::Mat();
    cv::Mat label_rows;
    if (needs_labels_) label_rows.create(band.rows, band.cols, cvDepthOf(labelSampleType(band.channels())));
    std::atomic<int64_t> non_finite{0}, overflow{0};
    const bool half = needs_probs_ && probs_type == SampleType::kF16;
    const float threshold = s_.label_threshold;
    parallelRows(pool_, band.rows, kMinRowsPerPiece, [&](int64_t a, int64_t b) {
      const cv::Mat rows = band.rowRange(int(a), int(b));
      int64_t bad = 0;
      bool large = false;
      for (int y = 0; y < rows.rows; ++y)
        bad += countNonFinite(rows.ptr<float>(y), int64_t(rows.cols) * rows.channels(), large);
      non_finite += bad;
      if (half)
        for (int y = 0; y < rows.rows; ++y)
          overflow += countBeyondHalf(rows.ptr<float>(y), int64_t(rows.cols) * rows.channels());
      if (needs_probs_ && stored.data != band.data)
        storeProbabilities(rows, probs_type, stored.rowRange(int(a), int(b)), large);
      if (needs_labels_) labelsInto(rows, threshold, label_rows.rowRange(int(a), int(b)));
    });
    img_.non_finite_values += non_finite.load();
    img_.f16_overflow_values += overflow.load();
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

  CatalogImage& img_;         // the catalog's, which outlives the stage
  const SegmentSettings& s_;  // the task's, which the stage's consumer factory holds
  int classes_;               // the model's output channels
  WorkPool* pool_;            // the stage's: compressions and the bands' pieces of rows
  std::vector<std::unique_ptr<MapWriter>> writers_;  // one per --save kind, in output_kinds' order (owned)
  bool needs_labels_ = false, needs_probs_ = false;  // what some writer takes of each band
  std::unique_ptr<Stitcher> stitcher_;               // on the host, or
  std::unique_ptr<DeviceStitcher> device_stitcher_;  // on OutputOptions::stitch_device
  std::unique_ptr<StatisticsPasses> passes_;         // a card's steps over the output's statistics, or null
  int64_t band_rows_ = 0;                            // rows a band of its second pass holds
};

}  // namespace

namespace {

// --probs_dtype: f32 | f16 | u8.
SampleType parseProbsType(const std::string& name) {
  if (name == "f32") return SampleType::kF32;
  if (name == "f16") return SampleType::kF16;
  if (name == "u8") return SampleType::kU8;
  TILER_THROW(ConfigError, "--probs_dtype must be f32, f16 or u8; got '" << name << "'");
}

class SegmentTask : public Task {
 public:
  const char* name() const override { return "segment"; }
  std::vector<Consumes> produces() const override { return {Consumes::kMapValues, Consumes::kMapLabels}; }
  std::vector<std::string> defaultKinds() const override { return {"labels"}; }
  std::string refuses(const std::vector<int64_t>& sizes) const override {
    if (sizes.size() == 4) return "";
    if (sizes.size() != 2) return dimensionsRefusal(sizes);
    return "--task segment needs NCHW maps, but the output " + c10::str(torch::IntArrayRef(sizes)) +
           " is one vector per window";
  }
  bool claims(const std::vector<int64_t>& sizes, bool, bool) const override { return sizes.size() == 4; }
  std::string shapeWords() const override { return "NCHW maps (--task segment)"; }
  bool stitches() const override { return true; }
  std::unique_ptr<ImageConsumer> makeConsumer(CatalogImage& image, const TaskOutputs& outputs,
                                              const WriterOptions& writer) const override {
    return std::make_unique<StitchedOutputs>(image, outputs, writer);
  }
  // --blend and --probs_dtype shape the map (a task that finds objects refuses them); a head may store its
  // probabilities its own way.
  std::vector<TaskFlag> flags() const override {
    using Check = TaskFlag::Check;
    return {
        {"blend", "constant | gaussian | crop", "gaussian", /*show_default=*/true, Check::kNone,
         /*head=*/false, /*map=*/true},
        {"sigma_scale", "gaussian sigma per window size", "0.125", /*show_default=*/true, Check::kPositive},
        {"simplify", "polygon simplification tolerance, pixels (0: exact)", "0", /*show_default=*/false,
         Check::kNonNegative},
        {"probs_dtype", "f32 | f16 | u8: how probabilities are stored (u8: round(p x 255))", "f32",
         /*show_default=*/true, Check::kNone, /*head=*/true, /*map=*/true}};
  }
  std::shared_ptr<const TaskSettings> parseSettings(const FlagValues& values,
                                                    const TaskFlags& job) const override {
    auto s = std::make_shared<SegmentSettings>();
    s->stitch.mode = parseBlendMode(flagValue(values, "blend"));
    s->stitch.sigma_scale = numberFlag("--sigma_scale", flagValue(values, "sigma_scale"));
    s->stitch.halo = job.halo;
    if (s->stitch.mode == BlendMode::kGaussian)
      gaussianImportance(4, 4, s->stitch.sigma_scale);  // validates sigma
    s->map.simplify = numberFlag("--simplify", flagValue(values, "simplify"));
    TILER_CHECK(s->map.simplify >= 0, ConfigError, "--simplify must be >= 0");
    s->map.probs_type = parseProbsType(flagValue(values, "probs_dtype"));
    s->map.classes_named = job.classes;
    s->map.format = job.format;
    s->label_threshold = labelThreshold(job.activation);
    return s;
  }

 protected:
  void checkFlags(const ModelProbe& probe, const TaskFlags& flags, GridSpec&) const override {
    TILER_CHECK(flags.edge != "lattice", ConfigError,
                "--edge lattice is for per-window tasks (classify, embed); a segmentation's stitched map "
                "keeps MONAI's grid (--edge shift)");
    const int label_classes = labelClassCount(probe.output_channels);
    TILER_CHECK(flags.classes.empty() || int(flags.classes.size()) == label_classes, ConfigError,
                "--classes names " << flags.classes.size() << " class(es), the model's labels have "
                                   << label_classes);
  }
};

}  // namespace

const Task& segmentTask() {
  static const SegmentTask task;
  return task;
}

}  // namespace tiler
