// finetune/training_data: the images training reads, each with its labels through a label source
// (label_source.hpp), and their windows split into those trained on and those validated on.
// Promise: every rank builds the same catalog and the same split (inputs sorted, shuffles seeded by --seed);
// a pair that cannot be read stops the run rather than train on less (an IoError naming it); held-out images
// are --val_images, else whole images drawn by --val_fraction (at least one, never all), else, of one image,
// a share of its windows. After load, read only: labels are read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tiler/finetune/label_source.hpp"
#include "tiler/io/catalog.hpp"

namespace tiler {

// A window of the pooled lists: its image, grid window index and index in the catalog's global list.
struct WindowRef {
  int image = 0;
  int64_t local = 0;
  int64_t global = 0;
};

struct TrainingData {
  WindowCatalog catalog;
  std::vector<WindowRef> train, val;
  // The sources, training's first; by image id, the index of the one its labels come from.
  std::vector<std::unique_ptr<LabelSource>> sources;
  std::vector<int> source_of;

  const LabelSource& labelsOf(int image_id) const { return *sources[size_t(source_of[size_t(image_id)])]; }
  // A window's labels as the loader holds them (training's source says their shape).
  LabelShape labelShape() const { return sources.front()->shape(); }
  void readLabels(const WindowRef& window, ReaderCache& readers, float* target, float* valid) const {
    labelsOf(window.image)
        .read(catalog.image(window.image), window.image, window.local, readers, target, valid);
  }
};

// Reads --images with their labels through `training`, and --val_images through `held_out` (null:
// `training`), and splits the windows the sources label. ConfigError for a flag that names no images or
// leaves no training windows; IoError for an image or label that cannot be read or does not fit.
TrainingData loadTrainingData(const LabelContext& context, std::unique_ptr<LabelSource> training,
                              std::unique_ptr<LabelSource> held_out);

}  // namespace tiler
