// finetune/label_images: the label source of --labels (label_source.hpp): a label image a training image,
// paired by file stem, of the output's size (the image's times the model's output scale): class ids (u8/u16),
// each below the model's output channels, or for --loss mse float targets of its channel count.
#include <filesystem>
#include <map>
#include <opencv2/imgproc.hpp>

#include "tiler/core/error.hpp"
#include "tiler/finetune/label_source.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

class LabelImages final : public LabelSource {
 public:
  using LabelSource::LabelSource;

  void openSet(const ImageSet& set) override {
    TILER_CHECK(fs::is_directory(set.labels), ConfigError,
                set.labelsFlag() << " '" << set.labels << "' is not a directory");
    by_stem_.clear();
    for (const auto& l : listImages({set.labels}, false)) by_stem_[fs::path(l).stem().string()] = l;
  }

  std::string labelOf(const ImageSet& set, const std::string& image) const override {
    const auto it = by_stem_.find(fs::path(image).stem().string());
    TILER_CHECK(it != by_stem_.end(), IoError,
                "'" << image << "': no label with the same stem in '" << set.labels << "'");
    return it->second;
  }

  void add(CatalogImage& image, int /*image_id*/) override {
    image.label_info = ImageReader::open(image.label)->info();
    checkLabel(image);
  }

  void read(const CatalogImage& image, int /*image_id*/, int64_t local, ReaderCache& readers, float* target,
            float* valid) const override {
    const auto [oh, ow, tc] = shape();
    const MapWindow w = mapWindow(image, local, image.label_info.width, image.label_info.height);
    cv::Mat dst(int(oh), int(ow), CV_MAKETYPE(CV_32F, int(tc)), target);
    cv::Mat counted(int(oh), int(ow), CV_32F, valid);
    cv::Mat label = readers.get(image.label).readRegion(w.inside);
    cv::Mat labelf;
    label.convertTo(labelf, CV_32F);
    if (binary()) cv::threshold(labelf, labelf, 0.0, 1.0, cv::THRESH_BINARY);
    labelf.copyTo(dst(w.at));
    counted(w.at).setTo(1.0f);
  }

 private:
  void checkLabel(const CatalogImage& t) const {
    const ModelProbe& probe = context_.probe;
    const int64_t want_w = probe.scale.apply(t.info.width), want_h = probe.scale.apply(t.info.height);
    TILER_CHECK(t.label_info.width == want_w && t.label_info.height == want_h, IoError,
                "'" << t.label << "': label is " << t.label_info.width << "x" << t.label_info.height
                    << " but image '" << t.input << "' needs " << want_w << "x" << want_h
                    << " (model output scale " << probe.scale.value() << ")");
    if (context_.plan.loss == LossKind::kMse) {
      TILER_CHECK(t.label_info.channels == probe.output_channels, IoError,
                  "'" << t.label << "': " << t.label_info.channels << " target channel(s), the model outputs "
                      << probe.output_channels);
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
    if (binary()) return;  // any non-zero value is foreground
    TILER_CHECK(int64_t(max_id) < probe.output_channels, IoError,
                "'" << t.label << "': class id " << int64_t(max_id) << " but the model has "
                    << probe.output_channels << " output channels (classes 0.." << probe.output_channels - 1
                    << ")");
  }

  std::map<std::string, std::string> by_stem_;  // the open set's labels
};

void settleLabelImages(const FinetuneOptions& o, const FinetunePlan& /*plan*/) {
  checkHeldOutMapFlags(o, false);
}

}  // namespace

const LabelSourceRow& labelImagesSource() {
  static const LabelSourceRow row{"--labels",           "label images",    &FinetuneOptions::labels_dir,
                                  /*per_window=*/false, settleLabelImages, &makeLabelSource<LabelImages>};
  return row;
}

}  // namespace tiler
