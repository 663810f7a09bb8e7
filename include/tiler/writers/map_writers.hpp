// map_writers: the outputs of a stitched map (--task segment, regress) behind one interface, one
// writers/formats row per --save kind: labels (TIFF or PNG), probs (TIFF), polygons (GeoJSON traced from the
// labels), zarr (an OME-Zarr store); in an output directory in memory (memory_output.hpp), labels and probs
// as arrays. The stitcher hands each finished band, top to bottom, to every writer of
// an image, as the labels and stored probabilities each asked for; an image commits in two phases (every
// writer finished under its partial name, then all renamed or none: commitWriters). No LibTorch. Promise: a
// writer holds a band of rows (or rows of tiles/chunks), never the image; a writer destroyed before its
// commit removes what it wrote; every failure is an IoError naming the file.
#pragma once

#include <memory>
#include <opencv2/core.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tiler/io/image_io.hpp"
#include "tiler/io/polygons.hpp"
#include "tiler/writers/output_file.hpp"

namespace tiler {

// How a map's writers write it, the same for every image of a run (its task's settings).
struct MapSettings {
  SampleType probs_type = SampleType::kF32;  // probabilities as stored (--probs_dtype)
  std::vector<ClassInfo> classes_named;      // --classes
  std::string format = "tif";                // labels: tif | png
  double simplify = 0.0;                     // polygons: tolerance in input pixels
};

// What every writer of one image's map knows: sizes, classes, the run's settings, the stage's writer options.
struct MapOutput {
  int64_t width = 0, height = 0;  // output pixels
  int classes = 2;                // the model's output channels
  MapSettings settings;
  WriterOptions writer;  // compression, pool, metadata, µm/px, pyramid: the stage's
  double input_pixels_per_label_pixel = 1.0;
  // polygons: the labels file another writer of the image makes (its partial name; GDAL reads TIFF and PNG),
  // read instead of a copy of its own.
  std::string labels_raster;
};

// One band of the map, as its writers asked for it: labels (labelSampleType, one channel) and the
// probabilities as stored (probs_type, C channels); each null when no writer of the image needs it.
struct MapBand {
  const cv::Mat* labels = nullptr;
  const cv::Mat* probs = nullptr;
};

// A writer of the map's bands; finish() and commit() are the commit protocol's (output_file.hpp).
class MapWriter : public OutputWriter {
 public:
  virtual bool needsLabels() const = 0;
  virtual bool needsProbs() const = 0;
  virtual void write(const MapBand& band) = 0;
  // TILER_FAULT stage:write: what it compresses from now on throws.
  virtual void injectFault() = 0;
  // The labels file this writer makes (its partial name), for the polygons to read; "": none.
  virtual std::string labelsRaster() const { return ""; }
};

// The probabilities' description (TIFF ImageDescription, Zarr attributes): how to read them back (tiler info
// prints it), with the class names.
std::string probabilitiesDescription(SampleType type, const std::vector<ClassInfo>& named);

// The writer of --save kind `kind` (its writers/formats row's map opener) for an image whose output is `path`
// (its output name); null when `kind` is not a map's output. Make an image's writers in the formats' order,
// so that a format's `after` (the labels TIFF the polygons read) is made first.
std::unique_ptr<MapWriter> makeMapWriter(const std::string& kind, const std::string& path,
                                         const MapOutput& output);

}  // namespace tiler
