#include "tiler/finetune/label_source.hpp"

#include <algorithm>
#include <filesystem>

#include "tiler/core/error.hpp"

namespace fs = std::filesystem;

namespace tiler {

// A source's file defines its row; only this table names it.
const LabelSourceRow& labelImagesSource();       // label_images.cpp
const LabelSourceRow& annotationLabelsSource();  // annotation_labels.cpp
const LabelSourceRow& windowLabelsSource();      // window_labels.cpp

const std::vector<const LabelSourceRow*>& labelSources() {
  static const std::vector<const LabelSourceRow*> rows = {&labelImagesSource(), &annotationLabelsSource(),
                                                          &windowLabelsSource()};
  return rows;
}

const LabelSourceRow& chooseLabelSource(const FinetuneOptions& o) {
  const LabelSourceRow* chosen = nullptr;
  int given = 0;
  std::string flags;
  for (const LabelSourceRow* row : labelSources()) {
    if (!(o.*(row->option)).empty()) {
      chosen = row;
      ++given;
    }
    const bool last = row == labelSources().back();
    flags += std::string(flags.empty() ? "" : last ? " or " : ", ") + row->flag + " (" + row->what + ")";
  }
  TILER_CHECK(given == 1, ConfigError, "give " << flags << ", one of them");
  return *chosen;
}

const LabelSourceRow& heldOutLabelSource(const FinetuneOptions& o, const LabelSourceRow& training) {
  return o.val_annotations.empty() ? training : annotationLabelsSource();
}

void checkHeldOutMapFlags(const FinetuneOptions& o, bool vector_labels) {
  TILER_CHECK(o.val_images.empty() || (vector_labels ? !o.val_annotations.empty() : !o.val_labels.empty()),
              ConfigError,
              "--val_images needs " << (vector_labels ? "--val_annotations" : "--val_labels")
                                    << " as training has " << (vector_labels ? "--annotations" : "--labels"));
  TILER_CHECK(o.val_images.empty() == (o.val_labels.empty() && o.val_annotations.empty()), ConfigError,
              "--val_labels and --val_annotations go with --val_images");
  for (const auto* path : {&o.annotations, &o.val_annotations})
    TILER_CHECK(path->empty() || fs::exists(*path), ConfigError,
                "--annotations '" << *path << "': no such GeoJSON file or directory");
}

LabelShape LabelSource::shape() const {
  const ModelProbe& probe = context_.probe;
  return {probe.scale.apply(context_.plan.spec.window_h), probe.scale.apply(context_.plan.spec.window_w),
          context_.plan.loss == LossKind::kMse ? probe.output_channels : 1};
}

LabelSource::MapWindow LabelSource::mapWindow(const CatalogImage& image, int64_t local, int64_t label_w,
                                              int64_t label_h) const {
  const auto [oh, ow, tc] = shape();
  const Scale& scale = context_.probe.scale;
  const Rect r = image.grid.imageWindow(local);
  const Rect o{scale.apply(r.x), scale.apply(r.y), ow, oh};
  const int64_t x0 = std::max<int64_t>(o.x, 0), y0 = std::max<int64_t>(o.y, 0);
  const int64_t x1 = std::min(o.right(), label_w), y1 = std::min(o.bottom(), label_h);
  return {o, {x0, y0, x1 - x0, y1 - y0}, cv::Rect(int(x0 - o.x), int(y0 - o.y), int(x1 - x0), int(y1 - y0))};
}

}  // namespace tiler
