#include "tiler/io/resolution.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

// 0.5 rather than to_string's 0.500000.
std::string number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Area weights of one axis: output pixel i covers source [origin + i*f, origin + (i+1)*f) of the level, a
// part of one or two level pixels when f < 1 (upsampling), many when f > 1.
struct AxisWeights {
  std::vector<int64_t> first;  // first source index of each output pixel (relative to the block)
  std::vector<std::vector<double>> weights;
};

AxisWeights areaWeights(const AreaAxis& axis, int64_t block_start, int64_t limit) {
  AxisWeights a;
  const double factor = axis.factor;
  for (int64_t i = axis.start; i < axis.start + axis.count; ++i) {
    const double s0 = axis.origin + double(i) * factor, s1 = axis.origin + double(i + 1) * factor;
    const int64_t j0 = std::min<int64_t>(int64_t(std::floor(s0)), limit - 1);
    const int64_t j1 = std::max<int64_t>(std::min<int64_t>(int64_t(std::ceil(s1)), limit), j0 + 1);
    a.first.push_back(j0 - block_start);
    std::vector<double> w;
    for (int64_t j = j0; j < j1; ++j)
      w.push_back((std::min(double(j + 1), s1) - std::max(double(j), s0)) / factor);
    a.weights.push_back(std::move(w));
  }
  return a;
}

// The level pixels [first, end) that an axis's output pixels cover.
std::pair<int64_t, int64_t> areaSpan(const AreaAxis& axis, int64_t limit) {
  const int64_t first =
      std::min<int64_t>(int64_t(std::floor(axis.origin + double(axis.start) * axis.factor)), limit - 1);
  const int64_t end = std::min<int64_t>(
      int64_t(std::ceil(axis.origin + double(axis.start + axis.count) * axis.factor)), limit);
  return {first, std::max(end, first + 1)};
}

class ResampledReader final : public ImageReader {
 public:
  ResampledReader(ImageReader& source, std::unique_ptr<ImageReader> owned, const ProcessingResolution& r)
      : source_(source), owned_(std::move(owned)), resolution_(r), info_(source.info()) {
    info_.width = r.width;
    info_.height = r.height;
  }
  const ImageInfo& info() const override { return info_; }
  size_t cachedBytes() const override { return source_.cachedBytes(); }

  cv::Mat readRegion(const Rect& r, int level) override {
    TILER_CHECK(level == 0, IoError, "'" << info_.path << "': a resampled image has one level");
    TILER_CHECK(
        r.x >= 0 && r.y >= 0 && r.w > 0 && r.h > 0 && r.right() <= info_.width && r.bottom() <= info_.height,
        IoError,
        "'" << info_.path << "': region " << r.x << "," << r.y << " " << r.w << "x" << r.h
            << " outside the image at its processing resolution (" << info_.width << "x" << info_.height
            << ")");
    if (resolution_.factor == 1.0) return source_.readRegion(r, resolution_.level);
    const double f = resolution_.factor;
    return readByArea(source_, resolution_.level, {0.0, f, r.x, r.w}, {0.0, f, r.y, r.h});
  }

 private:
  ImageReader& source_;
  std::unique_ptr<ImageReader> owned_;  // the source, when this reader owns it
  ProcessingResolution resolution_;
  ImageInfo info_;
};

}  // namespace

cv::Mat readByArea(ImageReader& source, int level, const AreaAxis& x, const AreaAxis& y) {
  const ImageInfo& info = source.info();
  const ImageInfo::Level& l =
      info.levels.empty() ? ImageInfo::Level{info.width, info.height, 1.0} : info.levels[size_t(level)];
  // The level pixels the output pixels cover, read once.
  const auto [sx0, sx1] = areaSpan(x, l.width);
  const auto [sy0, sy1] = areaSpan(y, l.height);
  cv::Mat block = source.readRegion({sx0, sy0, sx1 - sx0, sy1 - sy0}, level);
  cv::Mat values;
  block.convertTo(values, CV_64F);
  const int channels = block.channels();
  const AxisWeights wx = areaWeights(x, sx0, l.width);
  const AxisWeights wy = areaWeights(y, sy0, l.height);
  // Columns first, then rows; each output's sum runs in the same order wherever the region lies.
  cv::Mat across(values.rows, int(x.count), CV_64FC(channels));
  for (int row = 0; row < values.rows; ++row) {
    const double* src = values.ptr<double>(row);
    double* dst = across.ptr<double>(row);
    for (int64_t i = 0; i < x.count; ++i) {
      for (int c = 0; c < channels; ++c) {
        double sum = 0;
        const auto& w = wx.weights[size_t(i)];
        for (size_t k = 0; k < w.size(); ++k)
          sum += w[k] * src[(size_t(wx.first[size_t(i)]) + k) * size_t(channels) + size_t(c)];
        dst[size_t(i) * size_t(channels) + size_t(c)] = sum;
      }
    }
  }
  cv::Mat out(int(y.count), int(x.count), CV_64FC(channels), cv::Scalar::all(0));
  for (int64_t i = 0; i < y.count; ++i) {
    double* dst = out.ptr<double>(int(i));
    const auto& w = wy.weights[size_t(i)];
    for (size_t k = 0; k < w.size(); ++k) {
      const double* src = across.ptr<double>(int(wy.first[size_t(i)] + int64_t(k)));
      for (int64_t v = 0; v < x.count * channels; ++v) dst[v] += w[k] * src[v];
    }
  }
  cv::Mat result;
  out.convertTo(result, block.type());
  return result;
}

ProcessingResolution chooseResolution(const ImageInfo& info, const ResolutionSpec& spec) {
  const std::string& p = info.path;
  std::vector<ImageInfo::Level> levels = info.levels;
  if (levels.empty()) levels.push_back({info.width, info.height, 1.0});
  ProcessingResolution r;
  r.source_mpp = spec.input_mpp > 0 ? std::optional<double>(spec.input_mpp) : info.mpp;
  r.width = levels[0].width;
  r.height = levels[0].height;
  if (spec.level >= 0) {
    TILER_CHECK(size_t(spec.level) < levels.size(), IoError,
                "'" << p << "': --level " << spec.level << " does not exist (it has " << levels.size()
                    << " level(s), 0.." << levels.size() - 1 << ")");
    r.level = spec.level;
    r.downsample = levels[size_t(r.level)].downsample;
    r.width = levels[size_t(r.level)].width;
    r.height = levels[size_t(r.level)].height;
  } else if (spec.mpp > 0 || spec.magnification > 0) {
    double target = 1.0;  // level-0 pixels per processing pixel
    std::string wanted;
    if (spec.mpp > 0) {
      TILER_CHECK(r.source_mpp, IoError,
                  "'" << p << "': the file states no resolution (µm/px) to choose --mpp " << spec.mpp
                      << " by; pass --input_mpp with the scan's µm/px, or choose a --level");
      target = spec.mpp / *r.source_mpp;
      wanted = "--mpp " + number(spec.mpp);
    } else if (info.objective_power) {
      target = *info.objective_power / spec.magnification;
      wanted = "--magnification " + number(spec.magnification);
    } else {
      TILER_CHECK(r.source_mpp, IoError,
                  "'" << p << "': the file states neither an objective power nor a resolution (µm/px) to "
                      << "choose --magnification " << spec.magnification
                      << " by; pass --input_mpp with the scan's µm/px, or choose a --level");
      target = kMicrometresAtUnitMagnification / spec.magnification / *r.source_mpp;
      wanted = "--magnification " + number(spec.magnification);
    }
    TILER_CHECK(spec.upsample || target >= 1.0 - kResolutionTolerance, IoError,
                "'" << p << "': " << wanted << " is finer than the scan itself (level 0"
                    << (r.source_mpp ? " is " + number(*r.source_mpp) + " µm/px" : std::string())
                    << (info.objective_power ? ", " + number(*info.objective_power) + "x" : std::string())
                    << "), which would take upsampling " << number(1.0 / target)
                    << "x; --no_upsample refuses it");
    for (size_t l = 0; l < levels.size(); ++l)
      if (levels[l].downsample <= target * (1.0 + kResolutionTolerance)) r.level = int(l);
    // Coarser than one pixel of the whole image would be no image at all (and --mpp 1e308 overflows a
    // region).
    const double coarsest = double(std::min(levels[0].width, levels[0].height));
    TILER_CHECK(target <= coarsest, IoError,
                "'" << p << "': " << wanted << " is coarser than the whole image (" << levels[0].width << "x"
                    << levels[0].height << " level-0 pixels would make less than one pixel)");
    const ImageInfo::Level& l = levels[size_t(r.level)];
    r.factor = target / l.downsample;
    if (std::abs(r.factor - 1.0) <= kResolutionTolerance) r.factor = 1.0;
    if (r.factor == 1.0) {
      r.width = l.width;
      r.height = l.height;
    } else {
      r.width = std::max<int64_t>(1, int64_t(std::floor(double(l.width) / r.factor)));
      r.height = std::max<int64_t>(1, int64_t(std::floor(double(l.height) / r.factor)));
    }
    r.downsample = l.downsample * r.factor;
  }
  if (r.source_mpp) r.mpp = *r.source_mpp * r.downsample;
  return r;
}

std::unique_ptr<ImageReader> atResolution(std::unique_ptr<ImageReader> source,
                                          const ProcessingResolution& resolution) {
  if (resolution.native()) return source;
  ImageReader& ref = *source;
  return std::make_unique<ResampledReader>(ref, std::move(source), resolution);
}

std::unique_ptr<ImageReader> viewAtResolution(ImageReader& source, const ProcessingResolution& resolution) {
  return std::make_unique<ResampledReader>(source, nullptr, resolution);
}

int overviewLevel(const ImageInfo& info, int min_side) {
  int level = 0;
  for (size_t l = 0; l < info.levels.size(); ++l)
    if (std::max(info.levels[l].width, info.levels[l].height) >= min_side) level = int(l);
  return level;
}

std::string upsampleWarning(const std::string& image, const ProcessingResolution& resolution) {
  if (!(resolution.upsampleFactor() > 1.0)) return {};
  return fmt::format(
      "'{}': its level 0 ({} um/px) is coarser than the model's {} um/px: upsampled {:.6g}x by area "
      "(--no_upsample refuses)",
      image, resolution.source_mpp.value_or(0), resolution.mpp.value_or(0), resolution.upsampleFactor());
}

}  // namespace tiler
