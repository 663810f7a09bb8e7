// mask: where an image holds something worth a forward. A coverage map at low resolution (at most
// max_side pixels a side, made band by band: the full image is never in memory), values in [0,1] = the
// share of each map pixel that is inside the mask, and the share of any window inside it.
// Promise: `auto` is tissue on a light background for RGB images (Otsu on saturation, small holes closed,
// specks removed), valid data for images that declare nodata (GDAL_NODATA: every band equal to it) or carry
// alpha (alpha 0), and everything for other images; a PATH mask is any image stretched over the input,
// non-zero meaning inside. A region of interest (--roi: GeoJSON polygons and multipolygons, holes respected,
// in level-0 pixels or, for a georeferenced image, in its CRS) is rasterised into the same kind of map (pixel
// centres inside, supersampled when the map is smaller than the image), and intersects a mask given with it.
// Deterministic: every rank computes the same map. Throws IoError naming the mask or ROI file, the image and
// the problem. No LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/io/image_io.hpp"

namespace tiler {

enum class MaskMode { kNone, kAuto, kPath };

struct MaskSpec {
  MaskMode mode = MaskMode::kNone;
  std::string path;        // kPath
  double fraction = 0.05;  // a window is kept when at least this share of its pixels is inside
  int max_side = 2048;     // the coverage map's longest side
  std::string roi;         // a GeoJSON file, or a directory of <image stem>.geojson; empty: none
  std::string roi_class;   // only the ROI features of this classification name; empty: all
  bool active() const { return mode != MaskMode::kNone || !roi.empty(); }
};

// "none", "auto" or a file path, and a region of interest (a GeoJSON file or directory, empty: none) with
// its class filter; throws ConfigError on a bad fraction, a missing ROI path or a class without an ROI.
MaskSpec parseMaskSpec(const std::string& mask, double fraction, const std::string& roi = "",
                       const std::string& roi_class = "");

// The polygons of a region of interest: each its outer ring then its holes, in the GeoJSON's coordinates.
using RoiRing = std::vector<cv::Point2d>;
using RoiPolygon = std::vector<RoiRing>;
// The ROI file for `image_path` (`roi` itself, or <roi>/<stem>.geojson when `roi` is a directory).
std::string roiFileFor(const std::string& roi, const std::string& image_path);
// The largest ROI or annotations file read (a QuPath export of every detection of a slide is a few hundred
// MiB; its detections are dropped as they are parsed).
constexpr int64_t kMaxRoiBytes = int64_t(1) << 30;
// The largest coordinate an ROI position may have, in pixels or a CRS's units (past it, scaled edges
// overflow and cross nothing).
constexpr double kMaxRoiCoordinate = 1e12;
// The area features of a GeoJSON FeatureCollection, Feature or array of features (QuPath's export: only its
// annotations when objectType is given), those of class `roi_class` when it is not empty. Throws IoError
// naming `file` and the problem: not a regular file (a FIFO, a device), over kMaxRoiBytes, not JSON, nested
// deeper than kMaxJsonDepth, no polygon features, a coordinate past kMaxRoiCoordinate, a ring of fewer than 4
// positions, a coordinate that is not a finite number, a class that no feature has. `names` (optional)
// receives each polygon's classification name (empty: none), one per polygon, in order.
std::vector<RoiPolygon> readRoi(const std::string& file, const std::string& roi_class,
                                std::vector<std::string>* names = nullptr);
// `polygons` in a georeferenced image's CRS moved to its level-0 pixels (the inverted geotransform); other
// images' polygons are level-0 pixels already and stay. Throws IoError naming the image when the geotransform
// cannot be inverted.
void roiToPixels(const ImageInfo& info, std::vector<RoiPolygon>& polygons);
// `polygons` (coordinates scaled by sx, sy) drawn into a width x height map: 1 where a pixel's centre is
// inside a polygon (even-odd within a polygon, so holes are out; polygons united), else 0; float32.
cv::Mat rasterizeRoi(const std::vector<RoiPolygon>& polygons, int width, int height, double sx, double sy);

class CoverageMask {
 public:
  // Builds the map of `source`'s image for `spec` (mode auto or path), covering the image seen at
  // width x height (0: its level 0; another processing resolution of it). Auto masks are made from the
  // coarsest level that still has spec.max_side pixels.
  static CoverageMask make(ImageReader& source, const MaskSpec& spec, int64_t width = 0, int64_t height = 0);
  // A map given directly (tests): `map` float32 [0,1], covering an image of width x height.
  CoverageMask(cv::Mat map, int64_t width, int64_t height, std::string method);

  // Share of the image inside the mask.
  double coverage() const;
  // Share of the image's own pixels under `window` (image coordinates; what reaches outside the image, its
  // padding, counts neither way) that lies inside the mask: an image smaller than one window keeps its
  // window when its tissue would.
  double fractionInside(const Rect& window) const;
  const cv::Mat& map() const { return map_; }
  // tissue | nodata | alpha | file | everything, roi, or one of the first five then "+roi" (their
  // intersection)
  const std::string& method() const { return method_; }

 private:
  // The map of spec.mode alone (auto or path).
  static CoverageMask makeBase(ImageReader& source, const MaskSpec& spec, int64_t width, int64_t height);

  cv::Mat map_;       // float32, values in [0,1]
  cv::Mat integral_;  // float64 integral image of map_
  int64_t width_, height_;
  std::string method_;
};

// The image shrunk band by band to at most max_side pixels a side (INTER_AREA, or `interpolation`), in its
// own sample type; `per_band` (optional) turns each full-resolution band into the values to shrink instead.
cv::Mat shrinkImage(ImageReader& reader, int max_side,
                    const std::function<cv::Mat(const cv::Mat&)>& per_band = nullptr,
                    int interpolation = cv::INTER_AREA);

}  // namespace tiler
