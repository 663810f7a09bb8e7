#include "tiler/writers/map_writers.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "tiler/core/error.hpp"
#include "tiler/writers/formats.hpp"

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
  return format->open.map(path, output);
}

}  // namespace tiler
