#include "tiler/writers/heatmap.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "tiler/core/error.hpp"

namespace tiler {

HeatmapTiff::HeatmapTiff(std::string path, int64_t rows, int64_t columns, int64_t classes,
                         WriterOptions options)
    : path_(std::move(path)), options_(std::move(options)) {
  static_assert(kHeatmapMaxClasses == CV_CN_MAX);
  TILER_CHECK(
      classes <= kHeatmapMaxClasses, ConfigError,
      "'" << path_ << "': a heatmap holds at most " << kHeatmapMaxClasses << " classes, not " << classes);
  // Filled by hand: cv::Scalar fills at most 4 channels.
  pixels_.create(int(rows), int(columns), CV_32FC(int(classes)));
  std::fill_n(pixels_.ptr<float>(), pixels_.total() * size_t(classes),
              std::numeric_limits<float>::quiet_NaN());
}

void HeatmapTiff::set(int64_t column, int64_t row, const float* scores) {
  const size_t K = size_t(pixels_.channels());
  std::memcpy(pixels_.ptr<float>(int(row)) + column * int64_t(K), scores, K * sizeof(float));
}

void HeatmapTiff::finish() {
  written_ = std::make_unique<ImageOutput>(std::make_unique<ImageWriter>(
      path_, pixels_.cols, pixels_.rows, pixels_.channels(), SampleType::kF32, options_));
  written_->image().writeRows(pixels_);
  written_->finish();
}

void HeatmapTiff::commit(std::vector<std::string>& renamed) {
  TILER_CHECK(written_ != nullptr, IoError, "'" << path_ << "': committed before it was finished");
  written_->commit(renamed);
}

}  // namespace tiler
