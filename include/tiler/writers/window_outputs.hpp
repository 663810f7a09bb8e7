// window_outputs: the glue between a model that gives one vector per window instead of a map and the
// writers of its outputs (writers/): an encoder's features (embed: hdf5, torch_tensor), a classifier's class
// scores (classify: csv, geojson_file tiles, heatmap) or a detector's boxes (detect: a fixed number of box
// records a window, kept by the windows' cores, a box cut by a window edge merged with its parts from
// overlapping windows, clipped to the image; NMS near linear in the boxes, through a spatial index; written
// by geojson_file, csv and coco). No LibTorch, no blending, no file format.
// Promise: an image's vectors are written in its window order (the catalog's, whatever order they arrive
// in: early ones wait in memory, as the stitcher's rows do), each window with its level-0 rectangle, so any
// world size gives the same files (WSInfer's layout, writers/wsinfer.cpp, holds them to write them column by
// column). An output may lie in a directory of its kind's, made here. An image's writers are committed
// together by the one commit protocol (output_file.hpp's commitWriters): every file under its partial name
// until all are finished, then all renamed or none; a writer destroyed before commit removes its partial
// files. Every failure is an IoError naming the file.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tiler/core/job_options.hpp"
#include "tiler/core/output_kinds.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/io/geojson.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/polygons.hpp"
#include "tiler/writers/csv.hpp"
#include "tiler/writers/geojson_file.hpp"
#include "tiler/writers/heatmap.hpp"
#include "tiler/writers/output_file.hpp"

namespace tiler {

// A window where the level-0 image has it (pixels; the window may reach past an image smaller than it), and
// its cell in the grid.
struct WindowPlace {
  int64_t x = 0, y = 0, width = 0, height = 0;
  int64_t column = 0, row = 0;
};
// Grid window `window` of `image` in level-0 pixels: processing pixels x the processing downsample, rounded.
WindowPlace placeWindow(const CatalogImage& image, int64_t window);

struct WindowOutputOptions {
  bool class_scores = false;               // the vector is class scores (classify), else features (embed)
  bool boxes = false;                      // the values are N boxes of 6 (detect)
  std::vector<std::string> kinds;          // what to write (the task's --save kinds)
  int64_t dim = 0;                         // features D, classes K, or 6 N for N boxes
  std::string encoder;                     // embed: the HDF5 attribute `encoder`
  double overlap = 0.0;                    // the grid's overlap (x), for the HDF5 attribute
  std::vector<ClassInfo> classes;          // classify: names and colours of classes 0..K-1 (classNames)
  std::optional<Compression> compression;  // the heatmap's (unset: defaultCompression)
  // detect: a kept box that a box of its class overlapping it by more than this IoU outscores is dropped
  // (non-maximum suppression across windows; 0: none).
  double nms_iou = 0.0;
};

// An output fed one item at a time (`Item`: its arguments) by the glue, then finished and committed.
template <typename... Item>
class FedOutput : public OutputWriter {
 public:
  using Fed = FedOutput;
  virtual void feed(Item... item) = 0;
};

// A per-window output as the glue feeds it: each window's vector, in window order, with its level-0 place.
class WindowRowOutput : public FedOutput<const WindowPlace&, const float*> {};

// A writer of src/writers/ as an `Output` (a FedOutput), as a format's opener makes it: each item through
// `Feed(writer, item...)`, its finish and commit passed through.
template <typename Output, typename Writer, typename Feed, typename Fed = typename Output::Fed>
class FeedInto;
template <typename Output, typename Writer, typename Feed, typename... Item>
class FeedInto<Output, Writer, Feed, FedOutput<Item...>> : public Output {
 public:
  FeedInto(std::unique_ptr<Writer> writer, Feed feed) : writer_(std::move(writer)), feed_(std::move(feed)) {}
  void feed(Item... item) override { feed_(*writer_, item...); }
  void finish() override { writer_->finish(); }
  void commit(std::vector<std::string>& renamed) override { writer_->commit(renamed); }
  bool failAsFullDisk() override { return writer_->failAsFullDisk(); }

 private:
  std::unique_ptr<Writer> writer_;
  Feed feed_;
};

template <typename Output, typename Writer, typename Feed>
std::unique_ptr<Output> feedInto(std::unique_ptr<Writer> writer, Feed feed) {
  return std::make_unique<FeedInto<Output, Writer, Feed>>(std::move(writer), std::move(feed));
}

// What a row output's opener (a writers/formats row) gets: the image, the options, and (classify) the class
// names.
struct RowContext {
  const CatalogImage& image;
  const WindowOutputOptions& options;
  const std::vector<ClassInfo>& classes;  // classNames of the model's K scores; empty unless classify
  const std::string& path;                // the output's name (image.outputs)
};

// A kept box as detect's outputs take it: level-0 pixels, clipped to the image; `id` from 1.
struct KeptBox {
  int64_t id = 0;
  int k = 0;
  const ClassInfo* c = nullptr;  // its class (objectClass)
  float score = 0;
  double x1 = 0, y1 = 0, x2 = 0, y2 = 0;
};

// An object output as detect's glue feeds it: each kept box, in window order.
class BoxOutput : public FedOutput<const KeptBox&> {};

// Class names for K classes: --classes as given, else class_0, class_1, ... (CSV column prob_<name>);
// classes without a colour of their own get distinct palette colours (none black).
std::vector<ClassInfo> classNames(int64_t classes, const std::vector<ClassInfo>& named);
// An object's class k: --classes' k-th where named, else class_<k> in a distinct colour.
ClassInfo objectClass(int k, const std::vector<ClassInfo>& named);
// The objective power of `image`'s level 0: the slide's own, else TRIDENT's bucket of its µm/px (0.25 -> 40x,
// 0.5 -> 20x, 1.0 -> 10x); none when neither is known.
std::optional<double> level0Magnification(const CatalogImage& image);

// Whether `at` (padded-image pixels along one axis) lies in window `i`'s share of that axis: the points
// nearer its centre (starts[i] + size / 2) than any other window's, the first and last windows' shares
// running on past the grid. The crop blend's partition: an object is kept by the one window whose core holds
// its centre, whatever the world size. Twice and four times the coordinates keep half pixels exact.
bool inWindowCore(const std::vector<int64_t>& starts, int64_t size, size_t i, double at);

// An image's window results in its window order, whatever order they arrive in: the result whose turn it is
// is written at once, then those that waited for it; one that comes early is held until its turn.
template <typename T>
class InWindowOrder {
 public:
  explicit InWindowOrder(const CatalogImage& image) : image_(image) {}
  // write(window, result) for `window`'s result when its turn has come, then for each held one whose turn
  // follows.
  template <typename Write>
  void take(int64_t window, T result, const Write& write) {
    if (done() || window != image_.gridWindow(written_)) {
      early_.emplace(window, std::move(result));
      return;
    }
    write(window, result);
    ++written_;
    for (auto it = early_.begin(); !done() && it != early_.end() && it->first == image_.gridWindow(written_);
         it = early_.erase(it)) {
      write(it->first, it->second);
      ++written_;
    }
  }
  bool done() const { return written_ == image_.plannedWindows(); }
  int64_t written() const { return written_; }   // planned windows written
  size_t held() const { return early_.size(); }  // results waiting for their turn

 private:
  const CatalogImage& image_;  // the catalog's, which outlives its user
  int64_t written_ = 0;
  std::map<int64_t, T> early_;  // grid window -> its result, until its turn
};

// Creates `image`'s objects GeoJSON (outputs["objects"]); a georeferenced TIFF's objects are placed in its
// CRS (QGIS), which `geo` receives and the file names.
std::unique_ptr<GeoJsonFile> openObjectsGeojson(const CatalogImage& image, std::optional<GeoFrame>& geo);

// What takes an image's window results (MONAI's Merger): stitched maps (outputs.cpp's StitchedOutputs),
// per-window vectors and boxes (WindowOutputs), instance maps (InstanceOutputs). The output stage hands it
// each window once, in any order, and commits it when done. Not thread safe (the output stage's thread).
class WindowConsumer {
 public:
  virtual ~WindowConsumer() = default;
  // The result of grid window `window` (one of the image's planned windows) as the model gave it.
  virtual void add(int64_t window, const float* values) = 0;
  // A window's result as the record its rank made of it (a task that exchanges records: instances).
  virtual void addRecord(int64_t window, const std::string& record);
  // A step's windows of the image, in window order (a stitcher accumulates a grid row's together).
  virtual void addMany(const std::vector<std::pair<int64_t, const float*>>& windows) {
    for (const auto& [window, values] : windows) add(window, values);
  }
  // Every planned window added (true at once for an image without any).
  virtual bool done() const = 0;
  // Closes every file under its partial name (throws IoError; nothing is renamed then), then renames them
  // all; a failed rename takes back those already renamed. Returns the final paths.
  virtual std::vector<std::string> commit() = 0;
  // Object tasks: the objects written and those a window edge inside the image cut; nullopt otherwise.
  virtual std::optional<std::array<int64_t, 2>> objects() const { return std::nullopt; }
  // Values of the windows' results that were not finite, where the consumer counts them itself (records).
  virtual int64_t nonFiniteValues() const { return 0; }
  // TILER_FAULT's write failure: true when the consumer's tiles now fail as they are compressed, or its
  // objects store as on a full disk; false when it has neither (the stage fails the image itself).
  virtual bool injectTileFault() { return false; }
};

// detect: what the rank that ran grid window `window` sends its image's owner: the boxes (rows of 6 floats,
// as the model gave them) that the window keeps, those whose centre lies in its core and inside the image.
// Padding rows (a score <= 0) are neither sent nor checked, whatever they hold; a box that is no box (a value
// that is not finite among them) throws an IoError naming window and box, so a kept box is always finite.
std::string detectionRecord(const CatalogImage& image, const WindowOutputOptions& options, int64_t window,
                            const float* values);

// The outputs of one image. Not thread safe (the output stage's thread).
class WindowOutputs : public WindowConsumer {
 public:
  // Creates the partial files of `image`'s outputs (image.outputs names them, by kind).
  WindowOutputs(const CatalogImage& image, WindowOutputOptions options);
  ~WindowOutputs() override;
  WindowOutputs(const WindowOutputs&) = delete;
  WindowOutputs& operator=(const WindowOutputs&) = delete;

  // The vector (dim floats) of grid window `window`, one of the image's planned windows, in any order.
  void add(int64_t window, const float* values) override;
  // detect: the boxes its rank kept of the window (detectionRecord).
  void addRecord(int64_t window, const std::string& record) override;
  bool done() const override { return order_.done(); }
  // Vectors held because they arrived before their turn.
  size_t heldVectors() const { return order_.held(); }
  std::vector<std::string> commit() override;
  // detect: the objects written and those of them cut by a window edge inside the image; nullopt otherwise.
  std::optional<std::array<int64_t, 2>> objects() const override;
  // TILER_FAULT's write failure: the outputs that can fail as on a full disk (the objects store) now do.
  bool injectTileFault() override;

 private:
  class DetectionFiles;
  void take(int64_t window, std::vector<float> values);
  void write(int64_t window, const std::vector<float>& values);

  const CatalogImage& image_;  // the catalog's, which outlives the stage
  WindowOutputOptions options_;
  InWindowOrder<std::vector<float>> order_;  // a window's vector, or a detector's rows, 6 floats a box
  std::vector<std::unique_ptr<WindowRowOutput>> rows_;  // the per-window outputs saved, in registry order
  std::unique_ptr<DetectionFiles> detections_;          // owned; null unless objects, objects_csv or coco
};

}  // namespace tiler
