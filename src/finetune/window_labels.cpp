// finetune/window_labels: the label source of --window_labels (label_source.hpp): a CSV of one class a grid
// window (annotations.hpp's readWindowLabels: image, level-0 top-left corner, class), which trains a
// per-window model's [B,K] class scores by cross-entropy and labels --val_images' windows too. Windows no row
// labels are left out, or are class 0 under --unlabeled background; a row that is no window to train on is an
// IoError naming its line.
#include <cmath>
#include <filesystem>
#include <map>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/finetune/label_source.hpp"
#include "tiler/io/annotations.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

class WindowLabelSource final : public LabelSource {
 public:
  explicit WindowLabelSource(const LabelContext& context)
      : LabelSource(context),
        rows_(readWindowLabels(context.options.window_labels, context.plan.class_names)),
        row_used_(rows_.size(), false) {}

  std::string labelOf(const ImageSet& /*set*/, const std::string& /*image*/) const override {
    return context_.options.window_labels;
  }

  // The class of every row's window of the image (rows naming it by file name or stem).
  void add(CatalogImage& img, int image_id) override {
    const FinetuneOptions& o = context_.options;
    const std::string name = fs::path(img.input).filename().string(),
                      stem = fs::path(img.input).stem().string();
    std::map<std::pair<int64_t, int64_t>, int64_t> corners;  // the windows to train on, by top-left corner
    for (int64_t k = 0; k < img.plannedWindows(); ++k) {
      const Rect r = img.grid.imageWindow(img.gridWindow(k));
      corners[{r.x, r.y}] = img.gridWindow(k);
    }
    auto& classes = classes_[image_id];
    for (size_t i = 0; i < rows_.size(); ++i) {
      const WindowLabel& row = rows_[i];
      if (row.image != name && row.image != stem) continue;
      const auto where = "window labels '" + o.window_labels + "' line " + std::to_string(row.line) + ": ";
      // Level-0 corners at the processing resolution, to the nearest pixel.
      const double d = img.resolution.downsample;
      const auto it = corners.find({std::llround(row.x / d), std::llround(row.y / d)});
      TILER_CHECK(it != corners.end(), IoError,
                  where << "(" << row.x << ", " << row.y << ") of '" << img.input
                        << "' is not the level-0 top-left corner of a window of --window " << o.window
                        << " --overlap " << o.overlap << " at the processing resolution"
                        << (img.masked ? " inside the mask or --roi" : ""));
      TILER_CHECK(row.label < context_.probe.output_channels, IoError,
                  where << "class " << row.label << " but the model has " << context_.probe.output_channels
                        << " classes (0.." << context_.probe.output_channels - 1 << ")");
      classes[it->second] = row.label;
      row_used_[i] = true;
    }
  }

  void finish() const override {
    const FinetuneOptions& o = context_.options;
    for (size_t i = 0; i < rows_.size(); ++i)
      TILER_CHECK(row_used_[i], IoError,
                  "window labels '" << o.window_labels << "' line " << rows_[i].line << ": image '"
                                    << rows_[i].image << "' is none of --images"
                                    << (o.val_images.empty() ? "" : " or --val_images")
                                    << " (a file name or stem)");
  }

  bool labelled(int image_id, int64_t local) const override {
    return context_.plan.unlabeled_background || classOf(image_id, local) >= 0;
  }

  LabelShape shape() const override { return {1, 1, 1}; }

  void read(const CatalogImage& /*image*/, int image_id, int64_t local, ReaderCache& /*readers*/,
            float* target, float* valid) const override {
    const int label = classOf(image_id, local);
    target[0] = label < 0 ? 0.0f : float(label);
    valid[0] = label >= 0 || context_.plan.unlabeled_background ? 1.0f : 0.0f;
  }

 private:
  // The class a row gives grid window `local` of image `image_id`; -1: none.
  int classOf(int image_id, int64_t local) const {
    const auto image = classes_.find(image_id);
    if (image == classes_.end()) return -1;
    const auto it = image->second.find(local);
    return it == image->second.end() ? -1 : it->second;
  }

  std::vector<WindowLabel> rows_;
  std::vector<bool> row_used_;                     // whether an image took each row
  std::map<int, std::map<int64_t, int>> classes_;  // by image id, each labelled grid window's class
};

void settleWindowLabels(const FinetuneOptions& o, const FinetunePlan& plan) {
  const std::string not_a_file = notARegularFile(o.window_labels);
  TILER_CHECK(not_a_file.empty(), ConfigError,
              "--window_labels '" << o.window_labels << "': " << not_a_file << "; it takes a CSV file");
  TILER_CHECK(o.val_labels.empty() && o.val_annotations.empty(), ConfigError,
              "--window_labels labels --val_images' windows too: not --val_labels or --val_annotations");
  TILER_CHECK(plan.loss == LossKind::kCe, ConfigError,
              "--window_labels trains a model's [B,K] class scores by cross-entropy: --loss ce, not '"
                  << o.loss << "'");
}

}  // namespace

const LabelSourceRow& windowLabelsSource() {
  static const LabelSourceRow row{"--window_labels",
                                  "CSV",
                                  &FinetuneOptions::window_labels,
                                  /*per_window=*/true,
                                  settleWindowLabels,
                                  &makeLabelSource<WindowLabelSource>};
  return row;
}

}  // namespace tiler
