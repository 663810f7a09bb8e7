#include "tiler/io/mask.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>
#include <set>

#include "tiler/core/error.hpp"
#include "tiler/core/json_document.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/polygons.hpp"
#include "tiler/io/readers/remote_input.hpp"
#include "tiler/io/resolution.hpp"

namespace fs = std::filesystem;

namespace tiler {

MaskSpec parseMaskSpec(const std::string& mask, double fraction, const std::string& roi,
                       const std::string& roi_class) {
  MaskSpec spec;
  TILER_CHECK(fraction >= 0 && fraction <= 1, ConfigError,
              "--mask_fraction must be in [0,1]; got " << fraction);
  spec.fraction = fraction;
  std::error_code ec;
  TILER_CHECK(roi.empty() || fs::exists(roi, ec), ConfigError,
              "--roi '" << roi << "': no such GeoJSON file or directory");
  const std::string not_a_file = roi.empty() || fs::is_directory(roi, ec) ? "" : notARegularFile(roi);
  TILER_CHECK(not_a_file.empty(), ConfigError,
              "--roi '" << roi << "': " << not_a_file << "; it takes a GeoJSON file or a directory of them");
  TILER_CHECK(roi_class.empty() || !roi.empty(), ConfigError,
              "--roi_class '" << roi_class << "' needs --roi");
  spec.roi = roi;
  spec.roi_class = roi_class;
  if (mask.empty() || mask == "none") return spec;
  if (mask == "auto") {
    spec.mode = MaskMode::kAuto;
  } else {
    spec.mode = MaskMode::kPath;
    spec.path = mask;
  }
  return spec;
}

cv::Mat shrinkImage(ImageReader& reader, int max_side, const std::function<cv::Mat(const cv::Mat&)>& per_band,
                    int interpolation) {
  const ImageInfo& info = reader.info();
  const double factor = std::min(1.0, double(max_side) / double(std::max(info.width, info.height)));
  const int out_w = std::max(1, int(std::lround(double(info.width) * factor)));
  const int out_h = std::max(1, int(std::lround(double(info.height) * factor)));
  // Bands whose heights map to whole output rows, so the shrunk bands stack to exactly out_h rows.
  const int rows_per_band = std::max(1, int(std::ceil(256.0 * factor)));
  cv::Mat out;
  for (int oy = 0; oy < out_h; oy += rows_per_band) {
    const int oh = std::min(rows_per_band, out_h - oy);
    const int64_t y0 = int64_t(std::floor(double(oy) * double(info.height) / out_h));
    const int64_t y1 = int64_t(std::floor(double(oy + oh) * double(info.height) / out_h));
    cv::Mat band = reader.readRegion({0, y0, info.width, std::max<int64_t>(1, y1 - y0)});
    if (per_band) band = per_band(band);
    cv::Mat small;
    cv::resize(band, small, cv::Size(out_w, oh), 0, 0, interpolation);
    if (out.empty()) out.create(out_h, out_w, small.type());
    small.copyTo(out.rowRange(oy, oy + oh));
  }
  return out;
}

namespace {

// 1 where any band differs from `nodata` (float32 result, one channel).
cv::Mat validOf(const cv::Mat& band, double nodata) {
  cv::Mat f;
  band.convertTo(f, CV_32F);
  std::vector<cv::Mat> planes;
  cv::split(f, planes);
  cv::Mat valid = cv::Mat::zeros(band.size(), CV_8U);
  for (const auto& p : planes) valid |= (p != float(nodata));
  cv::Mat out;
  valid.convertTo(out, CV_32F, 1.0 / 255.0);
  return out;
}

cv::Mat alphaOf(const cv::Mat& band) {
  cv::Mat alpha;
  cv::extractChannel(band, alpha, band.channels() - 1);
  cv::Mat out;
  cv::Mat(alpha != 0).convertTo(out, CV_32F, 1.0 / 255.0);
  return out;
}

// Tissue on a light background: saturation above Otsu's threshold, holes closed, specks removed.
cv::Mat tissueOf(const cv::Mat& small_rgb) {
  cv::Mat rgb8;
  if (small_rgb.depth() == CV_8U) {
    rgb8 = small_rgb;
  } else {
    double lo = 0, hi = 0;
    cv::minMaxLoc(small_rgb.reshape(1), &lo, &hi);
    small_rgb.convertTo(rgb8, CV_8U, hi > lo ? 255.0 / (hi - lo) : 1.0,
                        hi > lo ? -lo * 255.0 / (hi - lo) : 0.0);
  }
  if (rgb8.channels() == 4) cv::cvtColor(rgb8, rgb8, cv::COLOR_RGBA2RGB);
  cv::Mat hsv, planes[3];
  cv::cvtColor(rgb8, hsv, cv::COLOR_RGB2HSV);
  cv::split(hsv, planes);
  cv::Mat tissue;
  cv::threshold(planes[1], tissue, 0, 255, cv::THRESH_BINARY | cv::THRESH_OTSU);
  // A nearly uniform image has no tissue/background split: Otsu's threshold lands in noise.
  double sat_lo = 0, sat_hi = 0;
  cv::minMaxLoc(planes[1], &sat_lo, &sat_hi);
  if (sat_hi - sat_lo < 20) tissue.setTo(sat_hi >= 40 ? 255 : 0);
  const int k = std::max(3, (std::max(tissue.rows, tissue.cols) / 256) | 1);
  const cv::Mat kernel = cv::getStructuringElement(cv::MORPH_ELLIPSE, cv::Size(k, k));
  cv::morphologyEx(tissue, tissue, cv::MORPH_CLOSE, kernel);
  cv::morphologyEx(tissue, tissue, cv::MORPH_OPEN, kernel);
  cv::Mat out;
  tissue.convertTo(out, CV_32F, 1.0 / 255.0);
  return out;
}

}  // namespace

std::string roiFileFor(const std::string& roi, const std::string& image_path) {
  std::error_code ec;
  if (!fs::is_directory(roi, ec)) return roi;
  // By the input's stem as its outputs are named: a URL's last path element, less its query.
  return (fs::path(roi) / (inputStem(image_path) + ".geojson")).string();
}

namespace {

// QuPath writes classification as {"name": ..., "color": ...}; others a plain string.
std::string classOf(const nlohmann::json& feature) {
  const auto props = feature.find("properties");
  if (props == feature.end() || !props->is_object()) return "";
  const auto c = props->find("classification");
  if (c == props->end()) return "";
  if (c->is_string()) return c->get<std::string>();
  if (c->is_object() && c->contains("name") && (*c)["name"].is_string())
    return (*c)["name"].get<std::string>();
  return "";
}

// A feature QuPath marks as something other than an annotation (a detection, a cell, a tile) is no region.
bool isRegion(const nlohmann::json& feature) {
  const auto props = feature.find("properties");
  if (props == feature.end() || !props->is_object() || !props->contains("objectType")) return true;
  return (*props)["objectType"] == "annotation";
}

RoiPolygon polygonOf(const nlohmann::json& rings, const std::string& where) {
  TILER_CHECK(rings.is_array() && !rings.empty(), IoError, where << ": a polygon needs an array of rings");
  RoiPolygon polygon;
  for (size_t r = 0; r < rings.size(); ++r) {
    const nlohmann::json& ring = rings[r];
    TILER_CHECK(ring.is_array(), IoError, where << ", ring " << r << ": not an array of positions");
    TILER_CHECK(ring.size() >= 4, IoError,
                where << ", ring " << r << ": " << ring.size()
                      << " position(s); a ring needs at least 4 (its first repeated last)");
    RoiRing points;
    for (const auto& p : ring) {
      TILER_CHECK(p.is_array() && p.size() >= 2 && p[0].is_number() && p[1].is_number() &&
                      std::isfinite(p[0].get<double>()) && std::isfinite(p[1].get<double>()),
                  IoError,
                  where << ", ring " << r << ": position " << p.dump() << " is not two finite numbers");
      TILER_CHECK(std::abs(p[0].get<double>()) <= kMaxRoiCoordinate &&
                      std::abs(p[1].get<double>()) <= kMaxRoiCoordinate,
                  IoError,
                  where << ", ring " << r << ": position " << p.dump() << " lies beyond " << kMaxRoiCoordinate
                        << " (no image's pixels or map coordinates reach so far)");
      points.emplace_back(p[0].get<double>(), p[1].get<double>());
    }
    polygon.push_back(std::move(points));
  }
  return polygon;
}

}  // namespace

std::vector<RoiPolygon> readRoi(const std::string& file, const std::string& roi_class,
                                std::vector<std::string>* names) {
  std::string why;
  const auto text = readDocument(file, kMaxRoiBytes, why);
  TILER_CHECK(text, IoError, "ROI '" << file << "': " << why);
  // Detections, cells and tiles are dropped as they are parsed: a QuPath export of every object is read for
  // its few annotations.
  size_t dropped = 0;
  const auto doc = parseJsonDocument(*text, why, [&dropped](int depth, const nlohmann::json& object) {
    const bool keep = depth > 2 || depth == 0 || object.value("type", "") != "Feature" || isRegion(object);
    dropped += keep ? 0 : 1;
    return keep;
  });
  if (!doc) {
    // Python's json.dump writes NaN and Infinity, which no JSON reader takes.
    const bool non_finite =
        text->find("NaN") != std::string::npos || text->find("Infinity") != std::string::npos;
    TILER_THROW(IoError,
                "ROI '" << file << "': not JSON: " << why
                        << (non_finite ? " (a coordinate NaN or Infinity is no number in JSON)" : ""));
  }
  // QuPath writes a FeatureCollection, or (older exports) an array of features; a lone Feature is one.
  nlohmann::json features = nlohmann::json::array();
  if (doc->is_array()) {
    features = std::move(*doc);
  } else if (doc->is_object() && doc->value("type", "") == "FeatureCollection" && doc->contains("features") &&
             (*doc)["features"].is_array()) {
    features = std::move((*doc)["features"]);
  } else if (doc->is_object() && doc->value("type", "") == "Feature") {
    features.push_back(std::move(*doc));
  }
  TILER_CHECK(
      dropped == 0 || !features.empty(), IoError,
      "ROI '" << file << "': no annotations: its " << dropped
              << " feature(s) are QuPath detections, cells or tiles (objectType), which are no region");
  TILER_CHECK(!features.empty(), IoError,
              "ROI '" << file << "': no features (a GeoJSON FeatureCollection of Polygon/MultiPolygon)");
  std::vector<RoiPolygon> polygons;
  std::set<std::string> classes;
  size_t areas = 0;
  for (size_t f = 0; f < features.size(); ++f) {
    const nlohmann::json& feature = features[f];
    const std::string where = "ROI '" + file + "': feature " + std::to_string(f);
    TILER_CHECK(feature.is_object(), IoError, where << ": not an object");
    const auto geometry = feature.find("geometry");
    if (geometry == feature.end() || !geometry->is_object() || !isRegion(feature)) continue;
    const std::string type = geometry->value("type", "");
    if (type != "Polygon" && type != "MultiPolygon") continue;  // points and lines enclose nothing
    ++areas;
    const std::string name = classOf(feature);
    classes.insert(name.empty() ? "(none)" : name);
    if (!roi_class.empty() && name != roi_class) continue;
    const auto coordinates = geometry->find("coordinates");
    TILER_CHECK(coordinates != geometry->end() && coordinates->is_array(), IoError,
                where << ": " << type << " without coordinates");
    if (type == "Polygon") {
      polygons.push_back(polygonOf(*coordinates, where));
    } else {
      for (size_t k = 0; k < coordinates->size(); ++k)
        polygons.push_back(polygonOf((*coordinates)[k], where + ", polygon " + std::to_string(k)));
    }
    if (names) names->resize(polygons.size(), name);
  }
  TILER_CHECK(areas > 0, IoError,
              "ROI '" << file << "': no Polygon or MultiPolygon annotation among its " << features.size()
                      << " feature(s)");
  TILER_CHECK(!polygons.empty() || !roi_class.empty(), IoError,
              "ROI '" << file << "': its " << areas
                      << " Polygon or MultiPolygon feature(s) hold no polygon (an empty MultiPolygon)");
  if (polygons.empty()) {
    std::string present;
    for (const auto& c : classes) present += (present.empty() ? "" : ", ") + c;
    TILER_THROW(IoError, "ROI '" << file << "': no feature of class '" << roi_class << "' (--roi_class); "
                                 << "classes present: " << present);
  }
  return polygons;
}

namespace {

// One edge of a ring, scaled, with the rows whose centres it crosses: [first_row, last_row].
struct RoiEdge {
  cv::Point2d a, b;
  int64_t first_row, last_row;
};

}  // namespace

cv::Mat rasterizeRoi(const std::vector<RoiPolygon>& polygons, int width, int height, double sx, double sy) {
  cv::Mat inside = cv::Mat::zeros(height, width, CV_8U);
  std::vector<double> crossings;
  std::vector<RoiEdge> edges;
  std::vector<const RoiEdge*> active;
  for (const RoiPolygon& polygon : polygons) {
    // Even-odd along each row through the pixel centres: an edge counts when it crosses y + 0.5 (half-open in
    // y, so a vertex on the line counts once): rows ceil(top - 0.5) .. ceil(bottom - 0.5) - 1. A row looks
    // only at the edges that cross it (a slide-wide annotation has millions of vertices).
    edges.clear();
    for (const RoiRing& ring : polygon)
      for (size_t i = 0; i < ring.size(); ++i) {
        const cv::Point2d a{ring[i].x * sx, ring[i].y * sy};
        const cv::Point2d b{ring[(i + 1) % ring.size()].x * sx, ring[(i + 1) % ring.size()].y * sy};
        // A row wider on each side than the arithmetic says: the crossing test below is the exact one.
        // Clamped as doubles: a georeferenced ROI's pixels may lie past any integer.
        const auto row = [height](double v) {
          return int64_t(std::clamp(std::ceil(v - 0.5), -2.0, height + 2.0));
        };
        const int64_t first = row(std::min(a.y, b.y)) - 1, last = row(std::max(a.y, b.y));
        if (first <= last && last >= 0 && first < height)
          edges.push_back({a, b, std::max<int64_t>(first, 0), std::min<int64_t>(last, height - 1)});
      }
    std::sort(edges.begin(), edges.end(),
              [](const RoiEdge& l, const RoiEdge& r) { return l.first_row < r.first_row; });
    active.clear();
    size_t next = 0;
    for (int64_t y = edges.empty() ? height : edges.front().first_row; y < height; ++y) {
      while (next < edges.size() && edges[next].first_row == y) active.push_back(&edges[next++]);
      active.erase(
          std::remove_if(active.begin(), active.end(), [y](const RoiEdge* e) { return e->last_row < y; }),
          active.end());
      if (active.empty() && next == edges.size()) break;
      if (active.empty()) {
        y = edges[next].first_row - 1;
        continue;
      }
      // A pixel is in when its centre lies in [enter, leave).
      const double yc = double(y) + 0.5;
      crossings.clear();
      for (const RoiEdge* e : active) {
        const cv::Point2d &a = e->a, &b = e->b;
        if ((a.y <= yc) != (b.y <= yc)) crossings.push_back(a.x + (yc - a.y) * (b.x - a.x) / (b.y - a.y));
      }
      std::sort(crossings.begin(), crossings.end());
      uint8_t* row = inside.ptr<uint8_t>(int(y));
      for (size_t k = 0; k + 1 < crossings.size(); k += 2) {
        const double first = std::clamp(std::ceil(crossings[k] - 0.5), 0.0, double(width));
        const double end = std::clamp(std::ceil(crossings[k + 1] - 0.5), 0.0, double(width));
        if (end > first) std::fill(row + int(first), row + int(end), uint8_t(1));
      }
    }
  }
  cv::Mat map;
  inside.convertTo(map, CV_32F);
  return map;
}

void roiToPixels(const ImageInfo& info, std::vector<RoiPolygon>& polygons) {
  const auto frame = geoFrameOf(info.path);
  if (!frame) return;
  // CRS -> level-0 pixel: the inverse of the affine geotransform.
  const auto& g = frame->gt;
  const double det = g[1] * g[5] - g[2] * g[4];
  TILER_CHECK(det != 0, IoError, "'" << info.path << "': its geotransform cannot be inverted");
  for (auto& polygon : polygons)
    for (auto& ring : polygon)
      for (auto& p : ring) {
        const double dx = p.x - g[0], dy = p.y - g[3];
        p = {(g[5] * dx - g[2] * dy) / det, (-g[4] * dx + g[1] * dy) / det};
      }
}

namespace {

// readRoi's polygons, the last file's kept: one --roi file for every image of a job is parsed once.
std::shared_ptr<const std::vector<RoiPolygon>> cachedRoi(const std::string& file,
                                                         const std::string& roi_class) {
  struct Entry {
    std::string file, roi_class;
    fs::file_time_type modified;
    uintmax_t size = 0;
    std::shared_ptr<const std::vector<RoiPolygon>> polygons;
  };
  static std::mutex mutex;
  static Entry last;
  std::error_code ec;
  const auto modified = fs::last_write_time(file, ec);
  const uintmax_t size = ec ? 0 : fs::file_size(file, ec);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!ec && last.polygons && last.file == file && last.roi_class == roi_class &&
        last.modified == modified && last.size == size)
      return last.polygons;
  }
  auto polygons = std::make_shared<const std::vector<RoiPolygon>>(readRoi(file, roi_class));
  std::lock_guard<std::mutex> lock(mutex);
  if (!ec) last = {file, roi_class, modified, size, polygons};
  return polygons;
}

// The ROI of `source`'s image as a width x height map (its level-0 coordinates, or its CRS when it is
// georeferenced, stretched over the map), drawn at up to 4x4 samples a map pixel when the map is smaller.
cv::Mat roiMap(const ImageReader& source, const MaskSpec& spec, int width, int height) {
  const ImageInfo& info = source.info();
  const std::string file = roiFileFor(spec.roi, info.path);
  std::vector<RoiPolygon> polygons;
  try {
    polygons = *cachedRoi(file, spec.roi_class);
  } catch (const Error& e) {
    TILER_THROW(IoError, "'" << info.path << "': " << e.message());
  }
  roiToPixels(info, polygons);
  // An ROI of another image, or in a CRS this one lacks, would leave an empty result that looks like one.
  double x0 = std::numeric_limits<double>::infinity(), y0 = x0, x1 = -x0, y1 = -x0;
  for (const RoiPolygon& polygon : polygons)
    for (const auto& p : polygon.front()) {
      x0 = std::min(x0, p.x), y0 = std::min(y0, p.y), x1 = std::max(x1, p.x), y1 = std::max(y1, p.y);
    }
  TILER_CHECK(x1 > 0 && y1 > 0 && x0 < double(info.width) && y0 < double(info.height), IoError,
              "'" << info.path << "': ROI '" << file << "' lies outside the image: its polygons span x " << x0
                  << ".." << x1 << ", y " << y0 << ".." << y1 << ", the image 0.." << info.width << " x 0.."
                  << info.height << " pixels (another image's ROI, or coordinates in a CRS the image lacks)");
  const int samples =
      std::clamp(int(std::min(double(info.width) / width, double(info.height) / height)), 1, 4);
  cv::Mat map = rasterizeRoi(polygons, width * samples, height * samples,
                             double(width * samples) / info.width, double(height * samples) / info.height);
  if (samples > 1) cv::resize(map, map, cv::Size(width, height), 0, 0, cv::INTER_AREA);
  return map;
}

}  // namespace

CoverageMask CoverageMask::make(ImageReader& source, const MaskSpec& spec, int64_t width, int64_t height) {
  int64_t w = width, h = height;
  if (w <= 0 || h <= 0) {
    w = source.info().width;
    h = source.info().height;
  }
  if (spec.roi.empty()) return makeBase(source, spec, w, h);
  // The ROI's map is as large as a mask file's shrunk copy of the image would be (shrinkImage's rule).
  const ImageInfo& info = source.info();
  const double factor = std::min(1.0, double(spec.max_side) / double(std::max(info.width, info.height)));
  const cv::Size size(std::max(1, int(std::lround(double(info.width) * factor))),
                      std::max(1, int(std::lround(double(info.height) * factor))));
  cv::Mat roi = roiMap(source, spec, size.width, size.height);
  if (spec.mode == MaskMode::kNone) return CoverageMask(roi, w, h, "roi");
  // Both: the mask's map brought to the ROI's size (an "everything" map is one pixel), then their product.
  const CoverageMask base = makeBase(source, spec, w, h);
  cv::Mat base_map = base.map();
  if (base_map.size() != size)
    cv::resize(base_map, base_map, size, 0, 0,
               base_map.cols > size.width ? cv::INTER_AREA : cv::INTER_NEAREST);
  const cv::Mat both = roi.mul(base_map);
  return CoverageMask(both, w, h, base.method() + "+roi");
}

CoverageMask CoverageMask::makeBase(ImageReader& source, const MaskSpec& spec, int64_t width,
                                    int64_t height) {
  auto overview = viewAtResolution(
      source, chooseResolution(source.info(), ResolutionSpec{overviewLevel(source.info(), spec.max_side)}));
  ImageReader& reader = *overview;
  ImageInfo info = source.info();
  if (width > 0 && height > 0) {
    info.width = width;
    info.height = height;
  }
  const std::string& path = info.path;
  if (spec.mode == MaskMode::kPath) {
    std::unique_ptr<ImageReader> mask;
    try {
      mask = ImageReader::open(spec.path);
    } catch (const Error& e) {
      TILER_THROW(IoError, "'" << path << "': mask '" << spec.path << "': " << e.message());
    }
    cv::Mat map = shrinkImage(*mask, spec.max_side, [](const cv::Mat& band) {
      cv::Mat nonzero;
      cv::Mat f;
      band.convertTo(f, CV_32F);
      if (f.channels() > 1) cv::extractChannel(f, f, 0);
      cv::Mat(f != 0).convertTo(nonzero, CV_32F, 1.0 / 255.0);
      return nonzero;
    });
    return CoverageMask(map, info.width, info.height, "file");
  }
  TILER_CHECK(spec.mode == MaskMode::kAuto, ConfigError, "mask: no mode");
  // The scene's own word first: its mask band (internal, or a .msk beside it), its nodata, its alpha; the
  // tissue detector only for an RGB image that says nothing.
  const double factor = std::min(1.0, double(spec.max_side) / double(std::max(info.width, info.height)));
  const int mask_w = std::max(1, int(std::lround(double(info.width) * factor))),
            mask_h = std::max(1, int(std::lround(double(info.height) * factor)));
  if (auto own = sceneMaskOf(path, mask_w, mask_h)) {
    cv::Mat map;
    cv::Mat(mask_h, mask_w, CV_8U, own->data()).convertTo(map, CV_32F, 1.0 / 255.0);
    return CoverageMask(map, info.width, info.height, "scene");
  }
  if (info.nodata) {
    const double nodata = *info.nodata;
    return CoverageMask(
        shrinkImage(reader, spec.max_side, [nodata](const cv::Mat& b) { return validOf(b, nodata); }),
        info.width, info.height, "nodata");
  }
  if (info.channels == 4 || info.channels == 2)
    return CoverageMask(shrinkImage(reader, spec.max_side, alphaOf), info.width, info.height, "alpha");
  if (info.channels == 3)
    return CoverageMask(tissueOf(shrinkImage(reader, spec.max_side)), info.width, info.height, "tissue");
  cv::Mat all(1, 1, CV_32F, cv::Scalar(1.0));
  return CoverageMask(all, info.width, info.height, "everything");
}

CoverageMask::CoverageMask(cv::Mat map, int64_t width, int64_t height, std::string method)
    : width_(width), height_(height), method_(std::move(method)) {
  TILER_CHECK(!map.empty() && map.channels() == 1 && width > 0 && height > 0, ConfigError, "mask: empty map");
  map.convertTo(map_, CV_32F);
  cv::integral(map_, integral_, CV_64F);
}

double CoverageMask::coverage() const {
  return integral_.at<double>(map_.rows, map_.cols) / double(map_.total());
}

double CoverageMask::fractionInside(const Rect& window) const {
  if (window.w <= 0 || window.h <= 0) return 0.0;
  const int64_t x0 = std::max<int64_t>(window.x, 0), y0 = std::max<int64_t>(window.y, 0);
  const int64_t x1 = std::min(window.right(), width_), y1 = std::min(window.bottom(), height_);
  if (x1 <= x0 || y1 <= y0) return 0.0;
  // The mean of the map pixels the in-image part covers (at least one).
  const double sx = double(map_.cols) / double(width_), sy = double(map_.rows) / double(height_);
  const int mx0 = std::clamp(int(std::floor(double(x0) * sx)), 0, map_.cols - 1);
  const int my0 = std::clamp(int(std::floor(double(y0) * sy)), 0, map_.rows - 1);
  const int mx1 = std::clamp(int(std::ceil(double(x1) * sx)), mx0 + 1, map_.cols);
  const int my1 = std::clamp(int(std::ceil(double(y1) * sy)), my0 + 1, map_.rows);
  const double sum = integral_.at<double>(my1, mx1) - integral_.at<double>(my0, mx1) -
                     integral_.at<double>(my1, mx0) + integral_.at<double>(my0, mx0);
  return sum / double((mx1 - mx0) * (my1 - my0));
}

}  // namespace tiler
