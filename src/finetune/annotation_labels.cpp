// finetune/annotation_labels: the label source of --annotations (label_source.hpp): vector annotations
// (annotations.hpp: a GeoJSON file for one image, or a directory of <stem>.geojson) drawn per window at the
// output's resolution, later shapes over earlier ones; their classes are --classes'. The annotations are also
// the region windows are drawn from, as --roi is for infer; unannotated pixels are not counted, or are class
// 0 under --unlabeled background.
#include <filesystem>
#include <map>
#include <opencv2/imgproc.hpp>

#include "tiler/core/error.hpp"
#include "tiler/finetune/label_source.hpp"
#include "tiler/io/annotations.hpp"
#include "tiler/io/mask.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

class AnnotationSource final : public LabelSource {
 public:
  using LabelSource::LabelSource;

  void checkSetSize(const ImageSet& set, size_t count) const override {
    TILER_CHECK(count == 1 || fs::is_directory(set.annotations), ConfigError,
                "'" << set.annotations << "': one annotation file is for one image; " << set.imagesFlag()
                    << " has " << count << " (give a directory of <stem>.geojson)");
  }

  std::string regionOf(const ImageSet& set) const override { return set.annotations; }

  std::string labelOf(const ImageSet& set, const std::string& image) const override {
    const std::string label = roiFileFor(set.annotations, image);
    TILER_CHECK(fs::is_regular_file(label), IoError, "'" << image << "': no annotations '" << label << "'");
    return label;
  }

  void add(CatalogImage& image, int image_id) override {
    by_image_.emplace(image_id, AnnotationLabels::read(image.label, image.info, context_.plan.class_names));
  }

  void read(const CatalogImage& image, int image_id, int64_t local, ReaderCache& /*readers*/, float* target,
            float* valid) const override {
    const auto [oh, ow, tc] = shape();
    const Scale& scale = context_.probe.scale;
    const MapWindow w =
        mapWindow(image, local, scale.apply(image.info.width), scale.apply(image.info.height));
    cv::Mat dst(int(oh), int(ow), CV_MAKETYPE(CV_32F, int(tc)), target);
    cv::Mat counted(int(oh), int(ow), CV_32F, valid);
    // Drawn at the output's resolution: output pixels per level-0 pixel.
    cv::Mat classes, covered;
    by_image_.at(image_id).rasterize(w.window, scale.value() / image.resolution.downsample, classes, covered);
    if (binary()) cv::threshold(classes, classes, 0.0, 1.0, cv::THRESH_BINARY);
    classes(w.at).copyTo(dst(w.at));
    if (context_.plan.unlabeled_background)
      counted(w.at).setTo(1.0f);  // unannotated pixels are class 0
    else
      covered(w.at).copyTo(counted(w.at));
  }

 private:
  std::map<int, AnnotationLabels> by_image_;  // read once as images join, then only read by any thread
};

void settleAnnotations(const FinetuneOptions& o, const FinetunePlan& plan) {
  checkHeldOutMapFlags(o, true);
  TILER_CHECK(!plan.class_names.empty(), ConfigError,
              "--annotations needs --classes: the class names its annotations use, class 0 first");
  TILER_CHECK(plan.loss != LossKind::kMse, ConfigError, "--annotations label classes: not --loss mse");
  TILER_CHECK(o.roi.empty(), ConfigError,
              "--roi with --annotations: the annotations are the region windows are drawn from");
}

}  // namespace

const LabelSourceRow& annotationLabelsSource() {
  static const LabelSourceRow row{
      "--annotations",      "GeoJSON",         &FinetuneOptions::annotations,
      /*per_window=*/false, settleAnnotations, &makeLabelSource<AnnotationSource>};
  return row;
}

}  // namespace tiler
