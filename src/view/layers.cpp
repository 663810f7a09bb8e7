#include "tiler/view/layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <opencv2/core.hpp>

#include "tiler/core/error.hpp"
#include "tiler/io/classes.hpp"
#include "tiler/io/resolution.hpp"

namespace tiler {
namespace {

// A level's size relative to level 0, per axis (its downsample is the mean of the two).
double axisScale(const ImageInfo& info, int level, bool x) {
  if (info.levels.empty()) return 1.0;
  const auto& l = info.levels[size_t(level)];
  return x ? double(l.width) / double(info.width) : double(l.height) / double(info.height);
}

// The smallest level of at most this many pixels gives an image's value range.
constexpr int64_t kRangeSamplePixels = int64_t(1) << 22;

}  // namespace

const std::vector<HeatmapStop>& heatmapStops() {
  // Viridis at six stops: perceptually even, and legible to the colour-blind.
  static const std::vector<HeatmapStop> stops{{0.0, 68, 1, 84},    {0.2, 65, 68, 135},  {0.4, 42, 120, 142},
                                              {0.6, 34, 168, 132}, {0.8, 122, 209, 81}, {1.0, 253, 231, 37}};
  return stops;
}

std::array<uint8_t, 3> heatmapColor(double value) {
  const auto& s = heatmapStops();
  value = std::clamp(value, 0.0, 1.0);
  size_t k = 1;
  while (k + 1 < s.size() && value > s[k].value) ++k;
  const double t = (value - s[k - 1].value) / (s[k].value - s[k - 1].value);
  auto mix = [t](uint8_t a, uint8_t b) {
    return uint8_t(std::lround(double(a) + t * (double(b) - double(a))));
  };
  return {mix(s[k - 1].r, s[k].r), mix(s[k - 1].g, s[k].g), mix(s[k - 1].b, s[k].b)};
}

RasterLayer::RasterLayer(const std::string& path, LayerKind kind)
    : reader_(ImageReader::open(path)), kind_(kind) {
  const ImageInfo& i = reader_->info();
  if (kind_ == LayerKind::kImage && i.type != SampleType::kU8) {
    // Deeper samples are stretched over the range the smallest level shows.
    int level = 0;
    for (size_t l = 0; l < i.levels.size(); ++l)
      if (i.levels[l].width * i.levels[l].height <= kRangeSamplePixels) {
        level = int(l);
        break;
      }
    const auto& l = i.levels.empty() ? ImageInfo::Level{i.width, i.height, 1.0} : i.levels[size_t(level)];
    if (l.width * l.height <= kRangeSamplePixels) {
      cv::Mat all = reader_->readRegion({0, 0, l.width, l.height}, level);
      cv::minMaxLoc(all.reshape(1), &low_, &high_);
    } else {
      low_ = 0;
      high_ = i.type == SampleType::kU16 ? 65535 : 1;
    }
    if (high_ <= low_) high_ = low_ + 1;
  }
}

int RasterLayer::levelFor(double scale) const {
  const ImageInfo& i = info();
  int level = 0;
  for (size_t l = 0; l < i.levels.size(); ++l)
    if (i.levels[l].downsample <= scale * (1.0 + kResolutionTolerance)) level = int(l);
  return level;
}

cv::Mat RasterLayer::sample(const IiifRequest& q) {
  const ImageInfo& i = info();
  const double sx = double(q.region.w) / double(q.width), sy = double(q.region.h) / double(q.height);
  const int level = levelFor(std::min(sx, sy));
  const double ax = axisScale(i, level, true), ay = axisScale(i, level, false);
  // Output pixel (u, v) covers level-0 [x + u*sx, x + (u+1)*sx) x [y + v*sy, ...): in level pixels, times ax.
  const AreaAxis gx{double(q.region.x) * ax, sx * ax, 0, q.width};
  const AreaAxis gy{double(q.region.y) * ay, sy * ay, 0, q.height};
  if (kind_ == LayerKind::kImage || kind_ == LayerKind::kScores) return readByArea(*reader_, level, gx, gy);
  // Labels and window grids: the level pixel under each output pixel's centre.
  const int64_t lw = i.levels.empty() ? i.width : i.levels[size_t(level)].width;
  const int64_t lh = i.levels.empty() ? i.height : i.levels[size_t(level)].height;
  auto at = [](const AreaAxis& g, int64_t u, int64_t limit) {
    return std::clamp<int64_t>(int64_t(std::floor(g.origin + (double(u) + 0.5) * g.factor)), 0, limit - 1);
  };
  const int64_t x0 = at(gx, 0, lw), x1 = at(gx, q.width - 1, lw), y0 = at(gy, 0, lh),
                y1 = at(gy, q.height - 1, lh);
  cv::Mat block = reader_->readRegion({x0, y0, x1 - x0 + 1, y1 - y0 + 1}, level);
  std::vector<int> columns(size_t(q.width));
  for (int64_t u = 0; u < q.width; ++u) columns[size_t(u)] = int(at(gx, u, lw) - x0);
  cv::Mat out(int(q.height), int(q.width), block.type());
  const size_t pixel = block.elemSize();
  for (int64_t v = 0; v < q.height; ++v) {
    const uint8_t* src = block.ptr<uint8_t>(int(at(gy, v, lh) - y0));
    uint8_t* dst = out.ptr<uint8_t>(int(v));
    for (int64_t u = 0; u < q.width; ++u)
      std::copy_n(src + size_t(columns[size_t(u)]) * pixel, pixel, dst + size_t(u) * pixel);
  }
  return out;
}

cv::Mat RasterLayer::render(const IiifRequest& q, int band) {
  const ImageInfo& i = info();
  const bool scores = kind_ == LayerKind::kScores || kind_ == LayerKind::kGrid;
  if (scores && (band < 0 || band >= i.channels))
    throw RequestError("class " + std::to_string(band) + " is not a band of '" + i.path + "' (" +
                       std::to_string(i.channels) + " bands)");
  cv::Mat s = sample(q);
  cv::Mat values;
  s.convertTo(values, CV_64F);
  const int c = values.channels();
  cv::Mat rgba(s.rows, s.cols, CV_8UC4);
  const double unit = i.type == SampleType::kU8 ? 255.0 : i.type == SampleType::kU16 ? 65535.0 : 1.0;
  const auto& palette = i.colormap;
  for (int y = 0; y < s.rows; ++y) {
    const double* src = values.ptr<double>(y);
    uint8_t* dst = rgba.ptr<uint8_t>(y);
    for (int x = 0; x < s.cols; ++x, src += c, dst += 4) {
      dst[3] = 255;
      if (kind_ == LayerKind::kImage) {
        for (int k = 0; k < 3; ++k) {
          const double v = src[c >= 3 ? k : 0];
          dst[k] = uint8_t(std::clamp(std::lround((v - low_) / (high_ - low_) * 255.0), 0L, 255L));
        }
        if (c == 4 || c == 2) dst[3] = uint8_t(std::clamp(std::lround(src[c - 1] / unit * 255.0), 0L, 255L));
      } else if (kind_ == LayerKind::kLabels) {
        const auto id = int64_t(src[0]);
        std::array<uint8_t, 3> colour{0, 0, 0};
        if (palette && !palette->empty()) {
          const auto& p = (*palette)[size_t(std::min<int64_t>(id, int64_t(palette->size()) - 1))];
          colour = {uint8_t(p[0] >> 8), uint8_t(p[1] >> 8), uint8_t(p[2] >> 8)};
        } else if (id == 0) {
          dst[3] = 0;  // an instance map's background
        } else {
          colour = distinctColor(int((id - 1) % 20));
        }
        std::copy(colour.begin(), colour.end(), dst);
      } else {
        const double v = src[band];
        if (std::isnan(v)) {
          dst[0] = dst[1] = dst[2] = dst[3] = 0;
          continue;
        }
        const auto colour = heatmapColor(v / unit);
        std::copy(colour.begin(), colour.end(), dst);
      }
    }
  }
  return rgba;
}

}  // namespace tiler
