#include "tiler/writers/map_writers.hpp"

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tiler/core/error.hpp"
#include "tiler/core/fault.hpp"
#include "tiler/core/output_kinds.hpp"
#include "tiler/writers/formats.hpp"
#include "tiler/writers/memory_output.hpp"

namespace tiler {

namespace {

// The class names as JSON (the labels' and probabilities' ImageDescription), or "" without --classes.
nlohmann::json classNamesJson(const std::vector<ClassInfo>& named) {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& c : named) names.push_back(c.name);
  return names;
}

// An output that is one ImageWriter (a TIFF, or a PNG assembled in memory).
class ImageMapWriter : public MapWriter {
 public:
  void finish() override { writer_->finish(); }
  void commit(std::vector<std::string>& renamed) override {
    writer_->commit();
    renamed.push_back(writer_->path());
  }
  void injectFault() override { writer_->injectTileFault(); }

 protected:
  std::unique_ptr<ImageWriter> writer_;
};

// <stem>_labels.<format>: argmax (or the threshold) as labelSampleType, with the class palette in a TIFF.
class LabelsWriter : public ImageMapWriter {
 public:
  LabelsWriter(const std::string& path, const MapOutput& m, std::string format) {
    const int label_classes = labelClassCount(m.classes);
    WriterOptions lo = m.writer;
    lo.format = std::move(format);
    lo.nearest = true;
    if (lo.format == "tif") lo.colormap = labelPalette(label_classes, m.settings.classes_named);
    if (!m.settings.classes_named.empty())
      lo.description = nlohmann::json{{"classes", classNamesJson(m.settings.classes_named)}}.dump();
    writer_ = std::make_unique<ImageWriter>(path, m.width, m.height, 1, labelSampleType(label_classes), lo);
  }
  bool needsLabels() const override { return true; }
  bool needsProbs() const override { return false; }
  void write(const MapBand& band) override { writer_->writeRows(*band.labels); }
  std::string labelsRaster() const override { return writer_->partialPath(); }
};

// <stem>_probs.tif: C channels as stored (f32 as the model gave them; f16; u8 with GDAL's scale 1/255).
class ProbsWriter : public ImageMapWriter {
 public:
  ProbsWriter(const std::string& path, const MapOutput& m) {
    WriterOptions po = m.writer;
    po.values = RasterValues::kMeasurements;
    // f32 files stay as they always were: values are probabilities as the model gave them.
    if (m.settings.probs_type != SampleType::kF32)
      po.description = probabilitiesDescription(m.settings.probs_type, m.settings.classes_named);
    if (m.settings.probs_type == SampleType::kU8) po.value_scale = 1.0 / 255.0;
    writer_ = std::make_unique<ImageWriter>(path, m.width, m.height, m.classes, m.settings.probs_type, po);
  }
  bool needsLabels() const override { return false; }
  bool needsProbs() const override { return true; }
  void write(const MapBand& band) override { writer_->writeRows(*band.probs); }
};

// <stem>_polygons.geojson, traced from a labels file when the image is finished: the labels output's own,
// else a scratch TIFF of this writer's (<path>.labels.tif.partial, removed after).
class PolygonsWriter : public MapWriter {
 public:
  PolygonsWriter(const std::string& path, const MapOutput& m) : path_(path), labels_raster_(m.labels_raster) {
    options_.palette = labelPalette(labelClassCount(m.classes), m.settings.classes_named);
    options_.named = m.settings.classes_named;
    options_.input_pixels_per_label_pixel = m.input_pixels_per_label_pixel;
    options_.simplify = m.settings.simplify;
    if (labels_raster_.empty()) {
      scratch_ = std::make_unique<LabelsWriter>(path + ".labels.tif", m, "tif");
      labels_raster_ = scratch_->labelsRaster();
    }
  }
  ~PolygonsWriter() override {
    if (!committed_) std::remove(partial().c_str());
  }
  bool needsLabels() const override { return scratch_ != nullptr; }
  bool needsProbs() const override { return false; }
  void write(const MapBand& band) override {
    if (scratch_) scratch_->write(band);
  }
  // After the labels TIFF it reads was finished (writers finish in table order).
  void finish() override {
    if (scratch_) scratch_->finish();
    writePolygons(labels_raster_, partial(), options_);
    scratch_.reset();  // its partial file goes: it only fed the polygons
  }
  void commit(std::vector<std::string>& renamed) override {
    renameFromPartial(path_);
    committed_ = true;
    renamed.push_back(path_);
  }
  void injectFault() override {
    if (scratch_) scratch_->injectFault();
  }

 private:
  std::string partial() const { return path_ + ".partial"; }
  std::string path_, labels_raster_;
  PolygonOptions options_;
  std::unique_ptr<LabelsWriter> scratch_;
  bool committed_ = false;
};

// A map's labels (H x W) or its probabilities as stored (C x H x W: each band's interleaved pixels spread
// over the planes), filled band by band in the array it keeps at commit.
class MemoryMapWriter : public MapWriter {
 public:
  MemoryMapWriter(std::string path, const MapOutput& m, bool labels)
      : path_(std::move(path)), labels_(labels) {
    array_.type = labels ? labelSampleType(labelClassCount(m.classes)) : m.settings.probs_type;
    channels_ = labels ? 1 : m.classes;
    width_ = m.width, height_ = m.height;
    array_.shape =
        labels ? std::vector<int64_t>{height_, width_} : std::vector<int64_t>{channels_, height_, width_};
    const size_t bytes = size_t(channels_ * height_ * width_) * bytesPerSample(array_.type);
    array_.data.reset(new uint8_t[bytes]);
  }
  bool needsLabels() const override { return labels_; }
  bool needsProbs() const override { return !labels_; }
  void write(const MapBand& band) override {
    TILER_CHECK(!fault_, IoError, "'" << path_ << "': " << injectedFailure("write failure"));
    const cv::Mat& rows = labels_ ? *band.labels : *band.probs;
    TILER_CHECK(rows_done_ + rows.rows <= height_ && rows.cols == width_ && rows.channels() == channels_ &&
                    rows.elemSize1() == bytesPerSample(array_.type),
                IoError,
                "'" << path_ << "': a band of " << rows.rows << " x " << rows.cols << " x " << rows.channels()
                    << " after " << rows_done_ << " of " << height_ << " rows does not fit the map");
    const size_t sample = bytesPerSample(array_.type);
    for (int y = 0; y < rows.rows; ++y) {
      const size_t at = size_t(rows_done_ + y) * size_t(width_);
      if (channels_ == 1)
        std::memcpy(array_.data.get() + at * sample, rows.ptr<uint8_t>(y), size_t(width_) * sample);
      else if (sample == 4)
        spread(rows.ptr<uint32_t>(y), reinterpret_cast<uint32_t*>(array_.data.get()) + at);
      else if (sample == 2)
        spread(rows.ptr<uint16_t>(y), reinterpret_cast<uint16_t*>(array_.data.get()) + at);
      else
        spread(rows.ptr<uint8_t>(y), array_.data.get() + at);
    }
    rows_done_ += rows.rows;
  }
  void injectFault() override { fault_ = true; }
  void finish() override {
    TILER_CHECK(rows_done_ == height_, IoError,
                "'" << path_ << "': " << rows_done_ << " of " << height_ << " rows were written");
  }
  void commit(std::vector<std::string>& renamed) override {
    keepMemoryArray(path_, std::move(array_));
    renamed.push_back(path_);
  }

 private:
  // A row of interleaved samples (`channels_` a pixel) into the planes, `row` its start in the first.
  template <typename Sample>
  void spread(const Sample* pixels, Sample* row) const {
    const size_t plane = size_t(height_ * width_);
    for (int64_t c = 0; c < channels_; ++c, row += plane)
      for (int64_t x = 0; x < width_; ++x) row[x] = pixels[x * channels_ + c];
  }
  std::string path_;
  bool labels_;
  int64_t channels_ = 1, width_ = 0, height_ = 0, rows_done_ = 0;
  MemoryArray array_;
  bool fault_ = false;
};

}  // namespace

std::string probabilitiesDescription(SampleType type, const std::vector<ClassInfo>& named) {
  nlohmann::json j;
  j["probabilities"] = {{"dtype", sampleTypeName(type)},
                        {"scale", type == SampleType::kU8 ? 1.0 / 255.0 : 1.0},
                        {"meaning", type == SampleType::kU8 ? "p = stored / 255" : "p = stored"}};
  if (!named.empty()) j["classes"] = classNamesJson(named);
  return j.dump();
}

std::unique_ptr<MapWriter> openLabelsWriter(const std::string& path, const MapOutput& output) {
  return std::make_unique<LabelsWriter>(path, output, output.settings.format);
}

std::unique_ptr<MapWriter> openProbsWriter(const std::string& path, const MapOutput& output) {
  return std::make_unique<ProbsWriter>(path, output);
}

std::unique_ptr<MapWriter> openPolygonsWriter(const std::string& path, const MapOutput& output) {
  return std::make_unique<PolygonsWriter>(path, output);
}

std::unique_ptr<MapWriter> makeMapWriter(const std::string& kind, const std::string& path,
                                         const MapOutput& output) {
  const OutputFormat* format = findOutputFormat(kind);
  if (format == nullptr || format->open.map == nullptr) return nullptr;
  if (isMemoryOutput(path)) {
    // In memory: the labels and probabilities as arrays, no other map output (memoryKindRefusal).
    const std::string bare = bareKind(kind);
    TILER_CHECK(bare == "labels" || bare == "probs", ConfigError, memoryKindRefusal(kind));
    return std::make_unique<MemoryMapWriter>(path, output, bare == "labels");
  }
  return format->open.map(path, output);
}

}  // namespace tiler
