#include "tiler/finetune/training_data.hpp"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

#include "tiler/core/error.hpp"
#include "tiler/io/mask.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// The images of `set` into `data`'s catalog, their labels taken by source `source_index`.
void addImageSet(TrainingData& data, const LabelContext& context, int source_index, const ImageSet& set,
                 std::vector<bool>& held_out) {
  const FinetuneOptions& o = context.options;
  LabelSource& source = *data.sources[size_t(source_index)];
  TILER_CHECK(fs::is_directory(set.images), ConfigError,
              set.imagesFlag() << " '" << set.images << "' is not a directory");
  source.openSet(set);
  const auto files = listImages({set.images}, false);
  TILER_CHECK(!files.empty(), ConfigError, "no images in '" << set.images << "'");
  source.checkSetSize(set, files.size());
  const CatalogSpec spec{context.plan.spec,
                         context.probe.input_channels,
                         context.probe.scale,
                         o.scale,
                         parseMaskSpec(o.mask, o.mask_fraction, source.regionOf(set)),
                         ResolutionSpec{o.level, o.mpp, o.magnification, o.input_mpp, !o.no_upsample},
                         true,
                         parseChannelList(o.channels)};
  for (const auto& f : files) {
    const std::string label = source.labelOf(set, f);
    CatalogImage t = WindowCatalog::describe(f, spec);
    // Training needs every pair: a bad one stops the run (on every rank) rather than train on less.
    TILER_CHECK(t.status == "ok", IoError, t.error);
    t.label = label;
    source.add(t, int(data.catalog.images().size()));
    data.catalog.add(std::move(t), true);
    data.source_of.push_back(source_index);
    held_out.push_back(set.held_out);
  }
}

void splitWindows(TrainingData& data, const FinetuneOptions& o, const std::vector<bool>& held_out) {
  const int n = int(data.catalog.images().size());
  auto windowsOf = [&](int img, std::vector<WindowRef>& into) {
    const CatalogImage& image = data.catalog.image(img);
    const LabelSource& labels = data.labelsOf(img);
    for (int64_t k = 0; k < image.plannedWindows(); ++k)
      if (labels.labelled(img, image.gridWindow(k)))
        into.push_back({img, image.gridWindow(k), image.first_window + k});
  };
  auto& train = data.train;
  auto& val = data.val;
  if (!o.val_images.empty()) {
    for (int i = 0; i < n; ++i) windowsOf(i, held_out[size_t(i)] ? val : train);
    TILER_CHECK(!train.empty(), ConfigError, "no training windows (no annotated window of the images?)");
    return;
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(o.seed);
  for (int i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(rng() % uint64_t(i + 1))]);
  if (o.val_fraction <= 0) {
    for (int i = 0; i < n; ++i) windowsOf(i, train);
  } else if (n >= 2) {
    // Whole images are held out, at least one, never all.
    const int n_val = std::clamp(int(std::lround(o.val_fraction * n)), 1, n - 1);
    std::vector<bool> is_val(static_cast<size_t>(n), false);
    for (int k = 0; k < n_val; ++k) is_val[size_t(order[size_t(k)])] = true;
    for (int i = 0; i < n; ++i) windowsOf(i, is_val[size_t(i)] ? val : train);
  } else {
    std::vector<WindowRef> all;
    windowsOf(0, all);
    TILER_CHECK(!all.empty(), ConfigError, "no training windows (no annotated window of the image?)");
    std::vector<size_t> idx(all.size());
    std::iota(idx.begin(), idx.end(), 0);
    for (size_t i = idx.size() - 1; i > 0; --i) std::swap(idx[i], idx[rng() % (i + 1)]);
    const size_t n_val = std::max<size_t>(1, size_t(std::lround(o.val_fraction * double(all.size()))));
    std::vector<size_t> val_idx(idx.begin(), idx.begin() + long(std::min(n_val, all.size() - 1)));
    std::sort(val_idx.begin(), val_idx.end());
    for (size_t i = 0; i < all.size(); ++i)
      (std::binary_search(val_idx.begin(), val_idx.end(), i) ? val : train).push_back(all[i]);
  }
  TILER_CHECK(!train.empty(), ConfigError, "no training windows left after the validation split");
}

}  // namespace

TrainingData loadTrainingData(const LabelContext& context, std::unique_ptr<LabelSource> training,
                              std::unique_ptr<LabelSource> held_out) {
  const FinetuneOptions& o = context.options;
  TrainingData data;
  data.sources.push_back(std::move(training));
  if (held_out) data.sources.push_back(std::move(held_out));
  std::vector<bool> is_held_out;  // by image id
  addImageSet(data, context, 0, {o.images_dir, o.labels_dir, o.annotations, false}, is_held_out);
  if (!o.val_images.empty())
    addImageSet(data, context, int(data.sources.size()) - 1,
                {o.val_images, o.val_labels, o.val_annotations, true}, is_held_out);
  for (const auto& source : data.sources) source->finish();
  splitWindows(data, o, is_held_out);
  return data;
}

}  // namespace tiler
