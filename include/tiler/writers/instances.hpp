// instances: an instance-segmentation model's objects (--task instances). Each window's map gives
// window-local object ids (channel 0: 0 = background, whole numbers below 2^31, as InstanSeg's TorchScript
// models return them) and optionally K class-score channels; an object is every pixel of one id.
// Promise: an object that every window seeing a part of it sees whole is kept by the one window whose core
// holds its centroid (inWindowCore: the crop blend's partition), as that window saw it. An object that some
// window edge inside the image cuts is joined at the image's owner from the parts the windows saw
// (WindowPart): two windows' parts are one object where a 4-connected piece of one, inside the region both
// windows see, lies at least half in the other (parts chain, so rings and C shapes whose parts meet only in
// a third window are one); the object is then the view of a window that saw it whole where one did, else
// every window's part within that window's core, and it is measured from those pixels. So each object is
// written once, whole, whatever the world size. What is held for that is bounded: an object is joined while
// its rows fit the band of kJoinBandWindows window heights kept in memory; a taller one is counted (the
// report's objects_at_window_edge), never written in pieces. An object is only its pixels inside the image.
// Ids are read exactly (maps of doubles). The rank that ran a window finds its objects and parts and sends
// them to the image's owner as a record (encodeWindowObjects); objects get ids 1, 2, ... in the order the
// owner completes them (global window order), and are written in that order: outlines exact to the pixel
// edges (4-connected parts, holes kept: an outline's area is its pixel count) and valid as GEOS judges it
// (simple rings; a hole may touch the outer ring or another hole at a point), streamed; the GeoJSON holds no
// NaN or Inf; the instance label TIFF is rasterised band by band, so memory is the band and the parts of
// objects not yet complete, never the image or all its objects. Every file goes through ".partial" and is
// renamed with the image's others. Errors are IoErrors naming image, window and value. No LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tiler/io/catalog.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {

class ObjectsStore;

// A ring of an outline: pixel-corner vertices (x right, y down), only where the direction turns, starting
// at its smallest (y, x), each vertex once (a simple ring); outer rings run clockwise on screen (a positive
// shoelace area in these coordinates), holes the other way.
using OutlineRing = std::vector<std::array<int32_t, 2>>;
// One 4-connected part of a mask: its outer ring, then its holes.
using OutlinePolygon = std::vector<OutlineRing>;
// The outlines of the 4-connected parts of `mask` (row-major, `width` x `height`, nonzero = in), in the
// raster order of their first pixel. Two parts that meet only at a corner are two polygons; where background
// inside a part meets the outside (or other background) only at a corner, it is a hole that touches the outer
// ring (or the other hole) at that point.
std::vector<OutlinePolygon> traceOutlines(const uint8_t* mask, int64_t width, int64_t height);
// The area a ring encloses (shoelace; negative for a hole).
double ringArea(const OutlineRing& ring);

// One object of a window's map, in the window's output pixels.
struct WindowObject {
  int64_t id = 0;                            // the window-local id
  int64_t pixels = 0;                        // its pixel count
  int64_t x0 = 0, y0 = 0, x1 = 0, y1 = 0;    // its bounding box, half-open
  double cx = 0, cy = 0;                     // its centroid (the mean of its pixel centres)
  std::vector<double> class_means;           // K class channels: each one's mean over its pixels
  std::vector<std::array<int32_t, 3>> runs;  // its pixels: (y, x begin, x end) rows of runs, in raster order
};
// Every object of the map `values` (`channels` x `height` x `width` doubles, which hold every id exactly:
// ids, then K class channels) within `inside` (the pixels that are the image's; those outside are no
// object's and not read), in the raster order of its first pixel. An id that is not a whole number in
// [0, 2^31) throws an IoError starting with `where()`.
std::vector<WindowObject> objectsOfWindow(const double* values, int64_t channels, int64_t height,
                                          int64_t width, const Rect& inside,
                                          const std::function<std::string()>& where);

struct InstanceOptions {
  std::vector<std::string> kinds;  // what to write: objects, objects_csv, instances
  int64_t channels = 1;            // the map's channels: 1 id channel + K class channels
  int64_t height = 0, width = 0;   // the map's size: the window's in output pixels
  Scale scale;                     // output pixels per processing pixel
  std::vector<ClassInfo> classes;  // the K classes' names and colours (classNames)
  WriterOptions tiff;              // the instance TIFF's (compression, pyramid, metadata, pool)
};

// An object a window keeps, ready to write: its measurements and pixels in the window's output pixels, its
// outlines (when the GeoJSON is saved) relative to (object.x0 - 1, object.y0 - 1).
struct KeptObject {
  WindowObject object;
  std::vector<OutlinePolygon> outlines;
  int k = -1;           // class: the highest mean (highestClass; -1 without classes or when all are NaN)
  double score = 0;     // that class's mean score
  bool shared = false;  // another window that sees it cuts it: the owner joins that window's part to it
};
// A window's view of an object that a window edge inside the image cuts (this window's, or another's that
// sees a pixel of it), for the owner to join with the other windows' parts of it; in the window's output
// pixels, clipped to the image.
struct WindowPart {
  WindowObject object;
  bool whole = false;  // this window sees it whole (another window cuts it), its centroid elsewhere
  // Its pixels in this window's core: their count, the sums of their centres, the K class channels' sums.
  int64_t core_pixels = 0;
  double core_sx = 0, core_sy = 0;
  std::vector<double> core_sums;
};
// What a window gives its image's owner: the objects it keeps, the parts to join, and how many of its map's
// values were not finite (NaN or Inf class scores).
struct WindowObjects {
  int64_t non_finite = 0;
  std::vector<KeptObject> kept;
  std::vector<WindowPart> parts;
};
// The band of rows the owner holds to join objects, in window heights: an object whose rows span at most
// (kJoinBandWindows - 1) window heights is always joined; a taller one may be counted instead.
constexpr int64_t kJoinBandWindows = 3;
// Grid window `window` of `image` with the map `values` (options.channels x height x width): its objects
// within the image (a window that reaches past it is clipped to it: pixels, measurements and outlines). An
// object it sees whole is kept, measured and outlined where its centroid lies in its core (shared where
// another window that sees a pixel of it cuts it), and is a part where its centroid lies elsewhere and such
// a window cuts it; one that a window edge inside the image cuts here is a part. Throws IoError
// naming image, window and pixel for a value that is not an id. Runs on the rank that ran the window.
WindowObjects keepWindowObjects(const CatalogImage& image, const InstanceOptions& options, int64_t window,
                                const double* values);
// A window's objects as bytes for the step exchange, and back (IoError, starting with `where`, for bytes that
// are not such a record). Byte for byte the same objects on every rank.
std::string encodeWindowObjects(const WindowObjects& objects);
WindowObjects decodeWindowObjects(const std::string& bytes, const std::string& where);

// The objects of one image.
class InstanceOutputs : public WindowConsumer {
 public:
  // Creates the partial files of `image`'s outputs (image.outputs names them, by kind).
  InstanceOutputs(const CatalogImage& image, InstanceOptions options);
  ~InstanceOutputs() override;
  InstanceOutputs(const InstanceOutputs&) = delete;
  InstanceOutputs& operator=(const InstanceOutputs&) = delete;

  // A window's map (its objects found here; a float map holds ids exactly only below 2^24, the pipeline
  // sends records made from maps of doubles) or its record (found by the rank that ran it).
  void add(int64_t window, const float* values) override;
  void addRecord(int64_t window, const std::string& record) override;
  bool done() const override { return order_.done(); }
  int64_t nonFiniteValues() const override { return non_finite_; }
  std::vector<std::string> commit() override;
  // The objects written, and those cut by a window edge that were too tall to join (left out).
  std::optional<std::array<int64_t, 2>> objects() const override;
  // TILER_FAULT's write failure: the objects store fails as on a full disk; false when it is not saved.
  bool injectTileFault() override;
  // Windows whose kept objects wait for an earlier window.
  size_t heldWindows() const { return order_.held(); }

 private:
  struct Joins;  // the parts not yet joined into complete objects
  void take(int64_t window, WindowObjects objects);
  void write(int64_t window, const WindowObjects& objects);
  void writeObject(const KeptObject& kept, const Rect& rect);
  void writeFeature(const KeptObject& kept, const Rect& rect);
  void paint(const KeptObject& kept, const Rect& rect);
  void advanceRaster(int64_t to);
  // Joins: a window's parts added and matched with its neighbours'; the objects no later window reaches
  // (their last row above `before`) written or counted; those taller than the band counted.
  void addParts(int64_t window, const WindowObjects& objects);
  void finishJoins(int64_t before);
  void giveUpTall(int64_t top, int64_t bottom);
  void finishGroup(int64_t group);
  int64_t openTop() const;

  const CatalogImage& image_;  // the catalog's, which outlives the stage
  InstanceOptions options_;
  InWindowOrder<WindowObjects> order_;  // each window's kept objects
  int64_t objects_ = 0, cut_ = 0, non_finite_ = 0;
  std::unique_ptr<GeoJsonFile> geojson_;  // owned; null unless saved
  std::unique_ptr<CsvFile> csv_;          // owned; null unless saved
  std::unique_ptr<ObjectsStore> store_;   // owned; null unless saved
  std::optional<GeoFrame> geo_;           // the input's CRS, where the GeoJSON is written in it
  std::unique_ptr<ImageOutput> raster_;   // the instance TIFF; null unless saved
  int64_t out_w_ = 0, out_h_ = 0;         // the map's size in output pixels (the TIFF's)
  cv::Mat band_;                          // int32 rows [band_top_, band_top_ + band_rows_) of the TIFF
  int64_t band_top_ = 0, band_rows_ = 0;
  std::unique_ptr<Joins> joins_;
};

}  // namespace tiler
