#include "tiler/mask.hpp"

#include <algorithm>
#include <cmath>
#include <opencv2/imgproc.hpp>

#include "tiler/error.hpp"
#include "tiler/resolution.hpp"

namespace tiler {

MaskSpec parseMaskSpec(const std::string& mask, double fraction) {
  MaskSpec spec;
  TILER_CHECK(fraction >= 0 && fraction <= 1, ConfigError,
              "--mask_fraction must be in [0,1]; got " << fraction);
  spec.fraction = fraction;
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

CoverageMask CoverageMask::make(ImageReader& source, const MaskSpec& spec, int64_t width, int64_t height) {
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
  // The map pixels the in-image part covers (at least one), their mean times that part's share.
  const double sx = double(map_.cols) / double(width_), sy = double(map_.rows) / double(height_);
  const int mx0 = std::clamp(int(std::floor(double(x0) * sx)), 0, map_.cols - 1);
  const int my0 = std::clamp(int(std::floor(double(y0) * sy)), 0, map_.rows - 1);
  const int mx1 = std::clamp(int(std::ceil(double(x1) * sx)), mx0 + 1, map_.cols);
  const int my1 = std::clamp(int(std::ceil(double(y1) * sy)), my0 + 1, map_.rows);
  const double sum = integral_.at<double>(my1, mx1) - integral_.at<double>(my0, mx1) -
                     integral_.at<double>(my1, mx0) + integral_.at<double>(my0, mx0);
  const double mean = sum / double((mx1 - mx0) * (my1 - my0));
  const double inside_share = double((x1 - x0) * (y1 - y0)) / double(window.w * window.h);
  return mean * inside_share;
}

}  // namespace tiler
