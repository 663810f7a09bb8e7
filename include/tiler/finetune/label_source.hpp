// finetune/label_source: where training's labels come from, behind one interface, a registry row each: label
// images paired by stem (--labels), vector annotations drawn per window (--annotations), one class a grid
// window (--window_labels, for a per-window model's [B,K] class scores).
// Promise: a source checks its own flags (its row's settle, before anything is read) and each image's labels
// as the image joins (an IoError naming the file: training never runs on less than it was given); read()
// fills one window's target and valid mask at the output's scale, and is called from several threads at once,
// each with its own ReaderCache. A new source is its file and its row in labelSources().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tiler/dist/loader.hpp"
#include "tiler/finetune/options.hpp"
#include "tiler/finetune/plan_types.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/model/model.hpp"

namespace tiler {

// A window's target as the loader holds it: [h,w,c] at the output's scale; 1x1x1 for a window label.
struct LabelShape {
  int64_t h, w, c;
};

// One set of images and their labels as the flags name them: training's, or the held-out --val_images'.
struct ImageSet {
  std::string images, labels, annotations;
  bool held_out = false;
  const char* imagesFlag() const { return held_out ? "--val_images" : "--images"; }
  const char* labelsFlag() const { return held_out ? "--val_labels" : "--labels"; }
};

// What a source reads labels for: the flags, the plan and the model's probe (output scale and channels). The
// three outlive the source.
struct LabelContext {
  const FinetuneOptions& options;
  const FinetunePlan& plan;
  const ModelProbe& probe;
};

class LabelSource {
 public:
  explicit LabelSource(const LabelContext& context) : context_(context) {}
  virtual ~LabelSource() = default;

  // Before a set's images are listed: its label flags checked (a ConfigError naming the flag).
  virtual void openSet(const ImageSet& /*set*/) {}
  // Once a set's `count` images are listed (never 0).
  virtual void checkSetSize(const ImageSet& /*set*/, size_t /*count*/) const {}
  // The region a set's windows are drawn from (parseMaskSpec's roi): --roi's.
  virtual std::string regionOf(const ImageSet& /*set*/) const { return context_.options.roi; }
  // Image file `image`'s label file (CatalogImage::label), before the image is opened; an IoError naming the
  // image when it has none.
  virtual std::string labelOf(const ImageSet& set, const std::string& image) const = 0;
  // Takes the described `image` (its label set) as catalog image `image_id`, the next: its labels read or
  // checked against it.
  virtual void add(CatalogImage& image, int image_id) = 0;
  // After every set was added: what no image took is an error.
  virtual void finish() const {}
  // Whether grid window `local` of image `image_id` is one to train or validate on.
  virtual bool labelled(int /*image_id*/, int64_t /*local*/) const { return true; }
  virtual LabelShape shape() const;
  // The labels of grid window `local` of `image` (catalog image `image_id`) into target [h,w,c] and valid
  // [h,w] (1: counted), both zeroed by the caller.
  virtual void read(const CatalogImage& image, int image_id, int64_t local, ReaderCache& readers,
                    float* target, float* valid) const = 0;

 protected:
  // A map label's window: the window at the output's scale, and the part of it inside a label of label_w x
  // label_h (outside it nothing is counted): `inside` in label pixels, `at` the same part within the window.
  struct MapWindow {
    Rect window, inside;
    cv::Rect at;
  };
  MapWindow mapWindow(const CatalogImage& image, int64_t local, int64_t label_w, int64_t label_h) const;
  // --loss bce: any non-zero class is foreground (1).
  bool binary() const { return context_.plan.loss == LossKind::kBce; }

  LabelContext context_;
};

// A label source as the flags choose it: its flag and what it takes (for the choice's refusal), the option
// that gives it, whether it trains a per-window model, its flag checks (ConfigErrors, in order) and its
// maker.
struct LabelSourceRow {
  const char* flag;
  const char* what;
  std::string FinetuneOptions::*option;
  bool per_window;
  void (*settle)(const FinetuneOptions& o, const FinetunePlan& plan);
  std::unique_ptr<LabelSource> (*make)(const LabelContext& context);
};

// A row's maker of a source class constructed from the context.
template <class Source>
std::unique_ptr<LabelSource> makeLabelSource(const LabelContext& context) {
  return std::make_unique<Source>(context);
}

// Every label source, in the order the refusal names them.
const std::vector<const LabelSourceRow*>& labelSources();
// The row of the one label flag `o` gives; a ConfigError naming them all when it gives none or several.
const LabelSourceRow& chooseLabelSource(const FinetuneOptions& o);
// The source of the held-out --val_images: --val_annotations' when given, whatever training's labels are;
// else training's own.
const LabelSourceRow& heldOutLabelSource(const FinetuneOptions& o, const LabelSourceRow& training);
// The held-out set's flags of a map source (label images, annotations: `vector_labels`): --val_images and its
// labels go together, as training's do; annotation paths exist.
void checkHeldOutMapFlags(const FinetuneOptions& o, bool vector_labels);

}  // namespace tiler
