#include "tiler/writers/window_outputs.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "tiler/core/error.hpp"
#include "tiler/io/readers/readers.hpp"
#include "tiler/io/readers/remote_input.hpp"
#include "tiler/writers/blend.hpp"
#include "tiler/writers/coco.hpp"
#include "tiler/writers/formats.hpp"
#include "tiler/writers/hdf5.hpp"
#include "tiler/writers/objects_store.hpp"
#include "tiler/writers/torch_tensor.hpp"

namespace fs = std::filesystem;

namespace tiler {

namespace {

// The distance between a grid's first two window starts along one axis (its window when it has one).
int64_t gridStride(const std::vector<int64_t>& starts, int64_t window) {
  return starts.size() > 1 ? starts[1] - starts[0] : window;
}

}  // namespace

WindowPlace placeWindow(const CatalogImage& image, int64_t window) {
  const Rect r = image.grid.imageWindow(window);
  const double d = image.resolution.downsample;
  const auto level0 = [d](int64_t v) { return int64_t(std::llround(double(v) * d)); };
  WindowPlace p;
  p.x = level0(r.x);
  p.y = level0(r.y);
  p.width = level0(r.x + r.w) - p.x;
  p.height = level0(r.y + r.h) - p.y;
  p.column = window % image.grid.columns();
  p.row = window / image.grid.columns();
  return p;
}

std::vector<ClassInfo> classNames(int64_t classes, const std::vector<ClassInfo>& named) {
  std::vector<ClassInfo> out = named;
  for (int64_t k = int64_t(out.size()); k < classes && named.empty(); ++k)
    out.push_back({defaultClassName(int(k)), {}, false});
  // Every class of a classifier is a real class (none is background): those without a colour get the
  // palette's distinct colours, never black.
  for (size_t k = 0; k < out.size(); ++k)
    if (!out[k].colored) out[k].color = distinctColor(int(k));
  return out;
}

std::optional<double> level0Magnification(const CatalogImage& image) {
  if (image.info.objective_power) return image.info.objective_power;
  if (!image.resolution.source_mpp) return std::nullopt;
  // TRIDENT's buckets (mpp -> magnification) for a slide that states only its pixel size.
  const double mpp = *image.resolution.source_mpp;
  for (const auto& [below, power] :
       {std::pair{0.16, 80.0}, {0.3, 40.0}, {0.6, 20.0}, {1.2, 10.0}, {2.4, 5.0}})
    if (mpp < below) return power;
  return std::nullopt;
}

ClassInfo objectClass(int k, const std::vector<ClassInfo>& named) {
  if (k < int(named.size())) return named[size_t(k)];
  return {defaultClassName(k), distinctColor(k), true};
}

bool inWindowCore(const std::vector<int64_t>& starts, int64_t size, size_t i, double at) {
  const auto twice_centre = [&](size_t k) { return double(2 * starts[k] + size); };
  return (i == 0 || 4 * at >= twice_centre(i - 1) + twice_centre(i)) &&
         (i + 1 == starts.size() || 4 * at < twice_centre(i) + twice_centre(i + 1));
}

namespace {

// The attributes of the features HDF5 (TRIDENT's and CLAM's), in the order they are written.
FeaturesHdf5Layout featuresLayout(const CatalogImage& image, const WindowOutputOptions& o) {
  const double d = image.resolution.downsample;
  const int64_t window = image.grid.windowWidth();
  // Always present (TRIDENT's reader indexes them): NaN where the image does not say (no µm/px, no
  // objective power), which no arithmetic turns into a plausible number.
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  const auto power = level0Magnification(image);
  const auto& level0 = image.info.levels.empty() ? ImageInfo::Level{image.info.width, image.info.height, 1.0}
                                                 : image.info.levels.front();
  const std::string name = utf8Safe(inputStem(image.input)), encoder = utf8Safe(o.encoder);
  FeaturesHdf5Layout layout;
  layout.dim = o.dim;
  layout.max_rows = image.plannedWindows();
  layout.attributes = {
      {"patch_size", window},
      {"patch_size_level0", int64_t(std::llround(double(window) * d))},
      {"patch_level", int64_t(image.resolution.level)},
      // Overlap in pixels of the processing resolution, as TRIDENT states it, and as the grid's fraction.
      {"overlap", window - gridStride(image.grid.startsX(), window)},
      {"overlap_fraction", o.overlap},
      {"level0_magnification", power.value_or(unknown)},
      {"target_magnification", power ? *power / d : unknown},
      {"mpp", image.resolution.mpp.value_or(unknown)},
      {"level0_mpp", image.resolution.source_mpp.value_or(unknown)},
      {"level0_width", level0.width},
      {"level0_height", level0.height},
      {"name", name},
      {"encoder", encoder},
  };
  layout.features_attributes = {{"name", name}, {"encoder", encoder}};
  return layout;
}

}  // namespace

std::unique_ptr<WindowRowOutput> openFeatures(const RowContext& c) {
  return feedInto<WindowRowOutput>(
      std::make_unique<FeaturesHdf5>(c.path, featuresLayout(c.image, c.options)),
      [](FeaturesHdf5& f, const WindowPlace& p, const float* v) { f.append(v, p.x, p.y); });
}

std::unique_ptr<WindowRowOutput> openFeaturesTensor(const RowContext& c) {
  return feedInto<WindowRowOutput>(
      std::make_unique<TorchTensorFile>(c.path, c.options.dim),
      [](TorchTensorFile& f, const WindowPlace&, const float* v) { f.append(v); });
}

// <stem>.csv: WSInfer's columns.
std::unique_ptr<WindowRowOutput> openClassCsv(const RowContext& c) {
  std::vector<std::string> columns = {"minx", "miny", "width", "height"};
  for (const auto& k : c.classes) columns.push_back("prob_" + k.name);
  const size_t K = c.classes.size();
  return feedInto<WindowRowOutput>(
      std::make_unique<CsvFile>(c.path, columns), [K](CsvFile& f, const WindowPlace& p, const float* v) {
        std::string line = fmt::format("{},{},{},{}", p.x, p.y, p.width, p.height);
        for (size_t k = 0; k < K; ++k) line += "," + fmt::format("{}", v[k]);
        f.row(line);
      });
}

// <stem>_tiles.geojson: QuPath's tile objects, classified by their highest score.
std::unique_ptr<WindowRowOutput> openTiles(const RowContext& c) {
  return feedInto<WindowRowOutput>(
      std::make_unique<GeoJsonFile>(c.path),
      [classes = c.classes](GeoJsonFile& f, const WindowPlace& p, const float* v) {
        const size_t K = classes.size();
        // The argmax names the tile's class (the first of equals; NaN never wins): a tile whose
        // every score is NaN has no classification, as an object whose every class mean is NaN.
        const int best = highestClass(v, K);
        const double x0 = double(p.x), y0 = double(p.y), x1 = x0 + double(p.width),
                     y1 = y0 + double(p.height);
        GeoJsonFeature tile;
        tile.geometry = quadGeometry({{{x0, y0}, {x1, y0}, {x1, y1}, {x0, y1}}});
        tile.object_type = "tile";
        if (best >= 0) tile.classification = &classes[size_t(best)];
        tile.measurements.emplace();
        for (size_t k = 0; k < K; ++k) tile.measurements->add("prob_" + classes[k].name, v[k]);
        f.writer.add(tile);
      });
}

// <stem>_objects.db: each window as its box, in level-0 pixels, its class the highest score's (none where
// every score is NaN), its key its place among the windows written (from 1).
std::unique_ptr<WindowRowOutput> openTilesStore(const RowContext& c) {
  return feedInto<WindowRowOutput>(std::make_unique<ObjectsStore>(c.path),
                                   [classes = c.classes, written = int64_t(0)](
                                       ObjectsStore& f, const WindowPlace& p, const float* v) mutable {
                                     const size_t K = classes.size();
                                     const int best = highestClass(v, K);
                                     const double x0 = double(p.x), y0 = double(p.y),
                                                  x1 = x0 + double(p.width), y1 = y0 + double(p.height);
                                     nlohmann::ordered_json properties;
                                     if (best >= 0) {
                                       properties["type"] = classes[size_t(best)].name;
                                       properties["score"] = storeNumber(v[best]);
                                     }
                                     properties["area"] = (x1 - x0) * (y1 - y0);
                                     for (size_t k = 0; k < K; ++k)
                                       properties["prob_" + classes[k].name] = storeNumber(v[k]);
                                     f.add(++written, ObjectsStore::box(x0, y0, x1, y1), properties);
                                   });
}

namespace {

// The heatmap TIFF's options: a pixel spans a stride of processing pixels.
WriterOptions heatmapOptions(const CatalogImage& image, const WindowOutputOptions& o,
                             const std::vector<ClassInfo>& classes) {
  const int64_t stride_x = gridStride(image.grid.startsX(), image.grid.windowWidth());
  const int64_t stride_y = gridStride(image.grid.startsY(), image.grid.windowHeight());
  WriterOptions wo;
  // One pixel a window: too small for speed to matter, so the codec every reader knows, as it always was.
  wo.compression = o.compression ? *o.compression : Compression{Codec::kDeflate};
  wo.software = kTilerSoftware;
  // Its geotransform and resolution are the input's scaled by the stride (exact for square strides; a
  // non-square one takes x's).
  wo.metadata_from = readerHas(image.info, kTiffTags) ? image.input : "";
  wo.metadata_scale = 1.0 / (double(stride_x) * image.resolution.downsample);
  if (image.resolution.mpp) wo.mpp = *image.resolution.mpp * double(stride_x);
  wo.nodata = std::numeric_limits<double>::quiet_NaN();
  nlohmann::json names = nlohmann::json::array();
  for (const auto& c : classes) names.push_back(c.name);
  wo.description =
      nlohmann::json{{"heatmap",
                      {{"classes", names},
                       {"stride", {stride_x, stride_y}},
                       {"window", {image.grid.windowWidth(), image.grid.windowHeight()}},
                       {"meaning", "pixel (column, row) = the scores of grid window (column, row)"}}}}
          .dump();
  return wo;
}

}  // namespace

// <stem>_heatmap.tif: K float bands, one pixel per window (the grid's column and row).
std::unique_ptr<WindowRowOutput> openHeatmap(const RowContext& c) {
  const CatalogImage& image = c.image;
  return feedInto<WindowRowOutput>(
      std::make_unique<HeatmapTiff>(c.path, int64_t(image.grid.startsY().size()), image.grid.columns(),
                                    c.options.dim, heatmapOptions(image, c.options, c.classes)),
      [](HeatmapTiff& f, const WindowPlace& p, const float* v) { f.set(p.column, p.row, v); });
}

namespace {

// detect: whether `b`, box n of the `rows` of grid window `window` (x1, y1, x2, y2, score, class in window
// pixels), is one the window keeps: checked (an IoError naming window and box for a box that is no box), not
// padding (a score <= 0), its centre in the window's core and inside the image.
bool keepsBox(const CatalogImage& image, const std::vector<ClassInfo>& named, int64_t window, int64_t n,
              int64_t rows, const float* b) {
  const WindowGrid& grid = image.grid;
  const size_t column = size_t(window % grid.columns()), row = size_t(window / grid.columns());
  // Formatted only for an error: most rows are padding, and this runs for every row of every window.
  const auto where = [&] {
    return fmt::format("'{}': window {} (column {}, row {}), box {} of {}: ", image.input, window, column,
                       row, n, rows);
  };
  TILER_CHECK(!std::isnan(b[4]), IoError, where() << "its score is not a number");
  if (!(b[4] > 0)) return false;  // padding
  TILER_CHECK(std::isfinite(b[0]) && std::isfinite(b[1]) && std::isfinite(b[2]) && std::isfinite(b[3]) &&
                  std::isfinite(b[4]),
              IoError, where() << "a coordinate or its score is not finite");
  TILER_CHECK(
      b[2] >= b[0] && b[3] >= b[1], IoError,
      where() << "x2 < x1 or y2 < y1 (" << b[0] << ", " << b[1] << ", " << b[2] << ", " << b[3] << ")");
  TILER_CHECK(b[5] >= 0 && b[5] < 2147483648.0f && b[5] == std::floor(b[5]) &&
                  (named.empty() || b[5] < float(named.size())),
              IoError,
              where() << "class " << b[5] << " is not "
                      << (named.empty() ? "a class number"
                                        : "one of the " + std::to_string(named.size()) + " --classes"));
  const double cx = (double(b[0]) + b[2]) / 2, cy = (double(b[1]) + b[3]) / 2;
  if (!inWindowCore(grid.startsX(), grid.windowWidth(), column, double(grid.startsX()[column]) + cx) ||
      !inWindowCore(grid.startsY(), grid.windowHeight(), row, double(grid.startsY()[row]) + cy))
    return false;
  const Rect place = grid.imageWindow(window);
  const double ix = double(place.x) + cx, iy = double(place.y) + cy;
  return ix >= 0 && iy >= 0 && ix < double(grid.imageWidth()) && iy < double(grid.imageHeight());
}

}  // namespace

std::string detectionRecord(const CatalogImage& image, const WindowOutputOptions& options, int64_t window,
                            const float* values) {
  const int64_t rows = options.dim / 6;
  std::string record;
  for (int64_t n = 0; n < rows; ++n)
    if (keepsBox(image, options.classes, window, n, rows, values + 6 * n))
      record.append(reinterpret_cast<const char*>(values + 6 * n), 6 * sizeof(float));
  return record;
}

// <stem>_objects.geojson: QuPath's detections, in the input's CRS where it has one (a rotated grid turns the
// rectangle there). The id also in the properties, where GeoPandas and other tables read it.
std::unique_ptr<BoxOutput> openBoxesGeojson(const CatalogImage& image, const std::string&, double, double) {
  std::optional<GeoFrame> geo;
  auto file = openObjectsGeojson(image, geo);
  return feedInto<BoxOutput>(std::move(file), [geo](GeoJsonFile& f, const KeptBox& b) {
    std::array<std::array<double, 2>, 4> corner = {{{b.x1, b.y1}, {b.x2, b.y1}, {b.x2, b.y2}, {b.x1, b.y2}}};
    if (geo)
      for (auto& p : corner) p = geo->apply(p[0], p[1]);
    GeoJsonFeature feature;
    feature.id = b.id;
    feature.geometry = quadGeometry(corner);
    feature.object_type = "detection";
    feature.classification = b.c;
    feature.measurements = GeoJsonMeasurements().add("score", b.score);
    f.writer.add(feature);
  });
}

// <stem>_objects.csv, in pixels.
std::unique_ptr<BoxOutput> openBoxesCsv(const CatalogImage&, const std::string& path, double, double) {
  return feedInto<BoxOutput>(
      std::make_unique<CsvFile>(path,
                                std::vector<std::string>{"id", "class", "score", "x1", "y1", "x2", "y2"}),
      [](CsvFile& f, const KeptBox& b) {
        f.row(
            fmt::format("{},{},{},{},{},{},{}", b.id, csvField(b.c->name), b.score, b.x1, b.y1, b.x2, b.y2));
      });
}

// <stem>_objects.db, in level-0 pixels: each box as its polygon, its key its id.
std::unique_ptr<BoxOutput> openBoxesStore(const CatalogImage&, const std::string& path, double, double) {
  return feedInto<BoxOutput>(std::make_unique<ObjectsStore>(path), [](ObjectsStore& f, const KeptBox& b) {
    nlohmann::ordered_json properties;
    properties["type"] = b.c->name;
    properties["score"] = storeNumber(b.score);
    properties["area"] = (b.x2 - b.x1) * (b.y2 - b.y1);
    f.add(b.id, ObjectsStore::box(b.x1, b.y1, b.x2, b.y2), properties);
  });
}

// <stem>_coco.json, in pixels; the image's level-0 size is COCO's.
std::unique_ptr<BoxOutput> openCoco(const CatalogImage& image, const std::string& path, double width,
                                    double height) {
  const std::string file = utf8Safe(inputFileName(image.input));
  return feedInto<BoxOutput>(
      std::make_unique<CocoFile>(path, "tiler --task detect: " + file, file, width, height),
      [](CocoFile& f, const KeptBox& b) {
        f.add(b.id, b.k + 1, b.c->name, b.x1, b.y1, b.x2, b.y2, b.score);
      });
}

// detect: a window's boxes [N, 6] (x1, y1, x2, y2, score, class in window pixels; a score <= 0 pads). A box
// is kept by the one window whose core holds its centre (the partition of the window centres, the crop
// blend's), so an object every window that sees it whole finds alike is written once, whatever the world
// size; boxes go out in window order, in level-0 pixels clipped to the image, each file streamed.
class WindowOutputs::DetectionFiles {
 public:
  DetectionFiles(const CatalogImage& image, const WindowOutputOptions& o)
      : image_(image),
        named_(o.classes),
        nms_(o.nms_iou),
        level0_width_(double(std::llround(double(image.grid.imageWidth()) * image.resolution.downsample))),
        level0_height_(double(std::llround(double(image.grid.imageHeight()) * image.resolution.downsample))) {
    TILER_CHECK(o.dim % 6 == 0, ConfigError,
                "--task detect needs 6 values a box, not " << o.dim << " a window");
    const auto overlap = [](const std::vector<int64_t>& starts, int64_t size) {
      for (size_t i = 1; i < starts.size(); ++i)
        if (starts[i] - starts[i - 1] < size) return true;
      return false;
    };
    windows_overlap_ = overlap(image.grid.startsX(), image.grid.windowWidth()) ||
                       overlap(image.grid.startsY(), image.grid.windowHeight());
    const auto saved = [&](const char* kind) {
      return std::find(o.kinds.begin(), o.kinds.end(), kind) != o.kinds.end();
    };
    // In the formats' order, whatever order --save named them in.
    for (const OutputFormat& format : outputFormats())
      if (format.open.box != nullptr && saved(format.naming.name))
        writers_.push_back(
            format.open.box(image, image.outputs.at(format.naming.name), level0_width_, level0_height_));
  }

  // The window's `rows` boxes, those its rank kept (detectionRecord).
  void append(int64_t window, const float* values, int64_t rows) {
    const WindowGrid& grid = image_.grid;
    const Rect place = grid.imageWindow(window);
    const int64_t row = window / grid.columns();
    const double d = image_.resolution.downsample;
    // The window in level-0 pixels, within the image: where its cut boxes meet their other parts.
    const std::array<double, 4> seen = {std::clamp(double(place.x) * d, 0.0, level0_width_),
                                        std::clamp(double(place.y) * d, 0.0, level0_height_),
                                        std::clamp(double(place.right()) * d, 0.0, level0_width_),
                                        std::clamp(double(place.bottom()) * d, 0.0, level0_height_)};
    // No window from this one on reaches above its top: the cut boxes whose windows end there are complete.
    settleCuts(seen[1]);
    // A box reaching past the image (a window's padding; any finite value a model gives) ends at its edge.
    const auto x = [&](float at) { return std::clamp((double(place.x) + at) * d, 0.0, level0_width_); };
    const auto y = [&](float at) { return std::clamp((double(place.y) + at) * d, 0.0, level0_height_); };
    for (int64_t n = 0; n < rows; ++n) {
      const float* b = values + 6 * n;
      Box box;
      box.order = order_++;
      box.row = int64_t(row);
      box.k = int(b[5]);
      box.score = b[4];
      box.x1 = x(b[0]);
      box.y1 = y(b[1]);
      box.x2 = x(b[2]);
      box.y2 = y(b[3]);
      // Cut by the window where the window's edge is inside the image: a larger overlap would see it whole.
      box.at_window_edge = (b[0] <= 0 && place.x > 0) || (b[1] <= 0 && place.y > 0) ||
                           (b[2] >= float(place.w) && place.right() < grid.imageWidth()) ||
                           (b[3] >= float(place.h) && place.bottom() < grid.imageHeight());
      // Where windows overlap, its other parts may come in the windows beside it.
      if (box.at_window_edge && windows_overlap_) {
        cut(box, window, seen);
        continue;
      }
      keep(box);
    }
  }

  // Writes the boxes NMS still held.
  void settleAll() {
    settleCuts(std::numeric_limits<double>::infinity());
    settle(std::numeric_limits<int64_t>::max());
  }
  // In commit order.
  std::vector<OutputWriter*> writers() const {
    std::vector<OutputWriter*> writers;
    for (const auto& writer : writers_) writers.push_back(writer.get());
    return writers;
  }
  int64_t objects() const { return objects_; }
  int64_t atWindowEdge() const { return at_window_edge_; }

 private:
  // A kept box, in level-0 pixels; `order`: its place among the kept boxes of the image, in window order.
  struct Box {
    int64_t order = 0, row = 0;
    int k = 0;
    float score = 0;
    double x1 = 0, y1 = 0, x2 = 0, y2 = 0;
    bool at_window_edge = false;
    bool settled = false;  // NMS: written or suppressed
  };
  // A box to write: at once, or held for NMS.
  void keep(const Box& box) {
    if (nms_ <= 0) {
      write(box);
      return;
    }
    // With NMS a box waits until every box that could overlap it has come: those of its own grid row and
    // the rows next to it. A new row means the rows two above it are settled.
    if (box.row > last_row_) settle(box.row - 2);
    last_row_ = std::max(last_row_, box.row);
    pending_.push_back(box);
  }
  // A box cut by its window's edge, waiting for its parts in the windows beside it: its window (level-0
  // pixels within the image) and its group of parts (the id of the group's first).
  struct Cut {
    Box box;
    int64_t window = 0, group = 0;
    std::array<double, 4> seen;  // x1, y1, x2, y2
  };
  // Joins a cut box to the cut parts of other windows whose boxes, clipped to the region both windows see,
  // overlap it by an IoU above one half: an object larger than the overlap is seen cut by each window that
  // sees it, and those parts chain across the windows.
  void cut(const Box& box, int64_t window, const std::array<double, 4>& seen);
  // Writes (keep) the groups of cut parts whose windows all end at or above `top`: each group as one box,
  // their union, with the highest score; a part that met no other stays counted as cut by a window edge.
  void settleCuts(double top);

  static double iou(const Box& a, const Box& b) {
    const double w = std::min(a.x2, b.x2) - std::max(a.x1, b.x1),
                 h = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
    if (w <= 0 || h <= 0) return 0;
    const double both = w * h, area_a = (a.x2 - a.x1) * (a.y2 - a.y1), area_b = (b.x2 - b.x1) * (b.y2 - b.y1);
    return both / (area_a + area_b - both);
  }

  // Boxes by class and size, so that NMS looks only at the boxes that can overlap one (an IoU above 0 needs
  // an area in common): a box whose larger side is under 2^L pixels is in its class's level L, under the
  // cell (2^L square) of its top-left corner. A box that overlaps `b` starts less than 2^L before b's start
  // along each axis and before its end, so it is in a band of cells of its level around b's; where that band
  // holds more cells than the level has boxes, the level's boxes are looked at one by one instead: NMS stays
  // near linear in the pending boxes where every pair would be quadratic.
  class OverlapIndex {
   public:
    explicit OverlapIndex(const std::vector<Box>& boxes) {
      entries_.reserve(boxes.size());
      for (const Box& b : boxes) {
        int level = 0;
        std::frexp(std::max(b.x2 - b.x1, b.y2 - b.y1), &level);  // the larger side < 2^level
        level = std::max(level, 0);
        const double side = std::ldexp(1.0, level);
        entries_.push_back(Entry{b.k, level, cell(b.y1, side), cell(b.x1, side), b});
      }
      std::sort(entries_.begin(), entries_.end());
    }
    // Whether found(c) holds for some pending box c of b's class that may overlap `b` (a superset of those
    // that do; found() decides).
    template <typename Found>
    bool any(const Box& b, const Found& found) const {
      constexpr int64_t lowest = std::numeric_limits<int64_t>::min();
      auto at = std::lower_bound(entries_.begin(), entries_.end(), first(b.k, 0, lowest, lowest));
      while (at != entries_.end() && at->k == b.k) {
        const int level = at->level;
        const auto level_end = std::lower_bound(at, entries_.end(), first(b.k, level + 1, lowest, lowest));
        const double side = std::ldexp(1.0, level);
        // b.x1 / side is exact (a power of two): the cell before b's start holds every box that can reach it.
        const int64_t x0 = cell(b.x1, side) - 1, x1 = cell(b.x2, side), y0 = cell(b.y1, side) - 1,
                      y1 = cell(b.y2, side);
        if (y1 - y0 + 1 >= level_end - at) {
          for (auto e = at; e != level_end; ++e)
            if (found(e->box)) return true;
        } else {
          for (int64_t cy = y0; cy <= y1; ++cy)
            for (auto e = std::lower_bound(at, level_end, first(b.k, level, cy, x0));
                 e != level_end && e->cy == cy && e->cx <= x1; ++e)
              if (found(e->box)) return true;
        }
        at = level_end;
      }
      return false;
    }

   private:
    struct Entry {
      int k, level;
      int64_t cy, cx;  // the cell of the box's top-left corner
      Box box;         // a copy: a cell's boxes side by side in memory, as they are looked at
      bool operator<(const Entry& o) const {
        return std::tie(k, level, cy, cx, box.order) < std::tie(o.k, o.level, o.cy, o.cx, o.box.order);
      }
    };
    static int64_t cell(double at, double side) { return int64_t(std::floor(at / side)); }
    // The place of the first entry at or after (class, level, cell) in the sorted entries.
    static Entry first(int k, int level, int64_t cy, int64_t cx) {
      Entry key{k, level, cy, cx, Box{}};
      key.box.order = std::numeric_limits<int64_t>::min();
      return key;
    }
    std::vector<Entry> entries_;  // sorted: by class, level, cell row, cell column
  };

  // Settles the pending boxes of grid rows up to `row`: each is written unless a box of its class that
  // overlaps it by more than the NMS IoU outscores it (a higher score, or an equal one earlier in window
  // order), suppressed or not itself: a rule of pairs, so no order of looking changes it. Boxes of `row`
  // stay, settled, for the next row's boxes to meet; those above it go.
  void settle(int64_t row) {
    const bool any = std::any_of(pending_.begin(), pending_.end(),
                                 [row](const Box& b) { return !b.settled && b.row <= row; });
    if (any) {
      const OverlapIndex index(pending_);
      for (Box& b : pending_) {
        if (b.settled || b.row > row) continue;
        b.settled = true;
        const bool outscored = index.any(b, [&](const Box& c) {
          return c.order != b.order && (c.score > b.score || (c.score == b.score && c.order < b.order)) &&
                 iou(b, c) > nms_;
        });
        if (!outscored) write(b);
      }
    }
    pending_.erase(
        std::remove_if(pending_.begin(), pending_.end(), [row](const Box& b) { return b.row < row; }),
        pending_.end());
  }
  void write(const Box& box) {
    at_window_edge_ += box.at_window_edge;
    const ClassInfo c = objectClass(box.k, named_);
    ++objects_;
    const KeptBox kept{objects_, box.k, &c, box.score, box.x1, box.y1, box.x2, box.y2};
    for (auto& writer : writers_) writer->feed(kept);
  }

  const CatalogImage& image_;
  std::vector<ClassInfo> named_;                     // --classes (empty: class_<k>)
  std::vector<std::unique_ptr<BoxOutput>> writers_;  // one per saved kind, in the formats' order
  double nms_;  // IoU above which the lower-scoring of two boxes of a class goes; 0: none
  double level0_width_, level0_height_;  // the image at level 0, where boxes are clipped (COCO's size)
  int64_t objects_ = 0, at_window_edge_ = 0;
  int64_t order_ = 0;             // kept boxes so far
  int64_t last_row_ = -1;         // the grid row of the last kept box
  std::vector<Box> pending_;      // NMS: kept boxes not yet written, and written ones a later box may meet
  std::vector<Cut> cuts_;         // cut boxes whose groups are not complete, in the order they came
  bool windows_overlap_ = false;  // some two windows of the grid share pixels
};

void WindowOutputs::DetectionFiles::cut(const Box& box, int64_t window, const std::array<double, 4>& seen) {
  Cut c{box, window, box.order, seen};
  for (const Cut& e : cuts_) {
    if (e.window == window || e.box.k != box.k) continue;
    const double x1 = std::max(e.seen[0], seen[0]), y1 = std::max(e.seen[1], seen[1]);
    const double x2 = std::min(e.seen[2], seen[2]), y2 = std::min(e.seen[3], seen[3]);
    if (x2 <= x1 || y2 <= y1) continue;
    const auto clip = [&](Box b) {
      b.x1 = std::clamp(b.x1, x1, x2);
      b.x2 = std::clamp(b.x2, x1, x2);
      b.y1 = std::clamp(b.y1, y1, y2);
      b.y2 = std::clamp(b.y2, y1, y2);
      return b;
    };
    if (iou(clip(e.box), clip(box)) <= 0.5 || e.group == c.group) continue;
    // The later group joins the earlier.
    const int64_t from = std::max(e.group, c.group), into = std::min(e.group, c.group);
    for (Cut& other : cuts_)
      if (other.group == from) other.group = into;
    c.group = into;
  }
  cuts_.push_back(c);
}

void WindowOutputs::DetectionFiles::settleCuts(double top) {
  std::map<int64_t, double> bottom;  // group -> the lowest bottom of its parts' windows
  for (const Cut& c : cuts_) bottom[c.group] = std::max(bottom[c.group], c.seen[3]);
  for (const auto& [group, end] : bottom) {
    if (end > top) continue;
    Box merged;
    int parts = 0;
    for (const Cut& c : cuts_) {
      if (c.group != group) continue;
      if (parts++ == 0) {
        merged = c.box;
        continue;
      }
      merged.x1 = std::min(merged.x1, c.box.x1);
      merged.y1 = std::min(merged.y1, c.box.y1);
      merged.x2 = std::max(merged.x2, c.box.x2);
      merged.y2 = std::max(merged.y2, c.box.y2);
      merged.score = std::max(merged.score, c.box.score);
    }
    merged.at_window_edge = parts == 1;
    merged.row = std::max(merged.row, last_row_);
    keep(merged);
  }
  cuts_.erase(
      std::remove_if(cuts_.begin(), cuts_.end(), [&](const Cut& c) { return bottom.at(c.group) <= top; }),
      cuts_.end());
}

std::unique_ptr<GeoJsonFile> openObjectsGeojson(const CatalogImage& image, std::optional<GeoFrame>& geo) {
  if (readerHas(image.info, kTiffTags)) geo = geoFrameOf(image.input);
  return std::make_unique<GeoJsonFile>(image.outputs.at("objects"), geo ? geo->crs : "");
}

void WindowConsumer::addRecord(int64_t window, const std::string&) {
  TILER_THROW(IoError, "window " << window << ": a record for outputs that take the model's values");
}

WindowOutputs::WindowOutputs(const CatalogImage& image, WindowOutputOptions options)
    : image_(image), options_(std::move(options)), order_(image) {
  // A detector without rows (N = 0) finds nothing, which is an answer; a vector needs a value.
  TILER_CHECK(options_.dim > 0 || options_.boxes, ConfigError,
              "a per-window output needs a vector of at least one value");
  // An output may lie in a directory of its kind's (WSInfer's model-outputs-csv/).
  for (const auto& [kind, path] : image.outputs) makeParentDirectory(path);
  std::vector<ClassInfo> classes;
  if (options_.class_scores) {
    classes = classNames(options_.dim, options_.classes);
    TILER_CHECK(int64_t(classes.size()) == options_.dim, ConfigError,
                "--classes names " << classes.size() << " class(es), the model gives " << options_.dim);
  }
  // In the formats' order, whatever order --save named them in.
  for (const OutputFormat& format : outputFormats()) {
    const std::string kind = format.naming.name;
    // A detector's formats take its boxes, never its rows (a format may take either: objects_store).
    if (format.open.row != nullptr && !options_.boxes &&
        std::find(options_.kinds.begin(), options_.kinds.end(), kind) != options_.kinds.end())
      rows_.push_back(format.open.row(RowContext{image, options_, classes, image.outputs.at(kind)}));
  }
  if (options_.boxes) detections_ = std::make_unique<DetectionFiles>(image, options_);
}

WindowOutputs::~WindowOutputs() = default;

void WindowOutputs::add(int64_t window, const float* values) {
  // A detector's boxes are checked and chosen once, where a rank makes its record of them.
  if (detections_) return addRecord(window, detectionRecord(image_, options_, window, values));
  take(window, std::vector<float>(values, values + options_.dim));
}

void WindowOutputs::addRecord(int64_t window, const std::string& record) {
  TILER_CHECK(detections_ && record.size() % (6 * sizeof(float)) == 0, IoError,
              "'" << image_.input << "': window " << window << ": not a record of boxes");
  std::vector<float> boxes(record.size() / sizeof(float));
  if (!boxes.empty()) std::memcpy(boxes.data(), record.data(), record.size());
  take(window, std::move(boxes));
}

void WindowOutputs::take(int64_t window, std::vector<float> values) {
  TILER_CHECK(!done(), IoError, "'" << image_.input << "': window " << window << " arrived after the last");
  order_.take(window, std::move(values), [this](int64_t w, const std::vector<float>& v) { write(w, v); });
}

void WindowOutputs::write(int64_t window, const std::vector<float>& values) {
  const WindowPlace place = placeWindow(image_, window);
  for (auto& row : rows_) row->feed(place, values.data());
  if (detections_) detections_->append(window, values.data(), int64_t(values.size()) / 6);
}

std::vector<std::string> WindowOutputs::commit() {
  TILER_CHECK(done(), IoError,
              "'" << image_.input << "': " << order_.written() << " of " << image_.plannedWindows()
                  << " windows written");
  if (detections_) detections_->settleAll();
  std::vector<OutputWriter*> writers;
  for (auto& row : rows_) writers.push_back(row.get());
  if (detections_)
    for (OutputWriter* writer : detections_->writers()) writers.push_back(writer);
  return commitWriters(writers);
}

bool WindowOutputs::injectTileFault() {
  bool any = false;
  for (auto& row : rows_) any = row->failAsFullDisk() || any;
  if (detections_)
    for (OutputWriter* writer : detections_->writers()) any = writer->failAsFullDisk() || any;
  return any;
}

std::optional<std::array<int64_t, 2>> WindowOutputs::objects() const {
  if (!detections_) return std::nullopt;
  return std::array<int64_t, 2>{detections_->objects(), detections_->atWindowEdge()};
}

}  // namespace tiler
