// mask: where an image holds something worth a forward. A coverage map at low resolution (at most
// max_side pixels a side, made band by band: the full image is never in memory), values in [0,1] = the
// share of each map pixel that is inside the mask, and the share of any window inside it.
// Promise: `auto` is tissue on a light background for RGB images (Otsu on saturation, small holes closed,
// specks removed), valid data for images that declare nodata (GDAL_NODATA: every band equal to it) or carry
// alpha (alpha 0), and everything for other images; a PATH mask is any image stretched over the input,
// non-zero meaning inside. Deterministic: every rank computes the same map. Throws IoError naming the mask
// file or the image. No LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <string>

#include "tiler/grid.hpp"
#include "tiler/image_io.hpp"

namespace tiler {

enum class MaskMode { kNone, kAuto, kPath };

struct MaskSpec {
  MaskMode mode = MaskMode::kNone;
  std::string path;        // kPath
  double fraction = 0.05;  // a window is kept when at least this share of its pixels is inside
  int max_side = 2048;     // the coverage map's longest side
};

// "none", "auto" or a file path; throws ConfigError on a bad fraction.
MaskSpec parseMaskSpec(const std::string& mask, double fraction);

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
  // Share of the pixels of `window` (image coordinates, may reach outside the image, where nothing is
  // inside) that lies inside the mask.
  double fractionInside(const Rect& window) const;
  const cv::Mat& map() const { return map_; }
  const std::string& method() const { return method_; }  // tissue | nodata | alpha | file | everything

 private:
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
