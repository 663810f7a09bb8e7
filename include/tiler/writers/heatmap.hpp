// writers/heatmap: --save heatmap, <stem>_heatmap.tif: K float bands, one pixel per grid window (its column
// and row), NaN where no window is. Small (a pixel a window), so held whole and written as one TIFF at
// finish, under its partial name, then committed by the commit protocol (output_file.hpp). No LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <opencv2/core.hpp>
#include <string>
#include <vector>

#include "tiler/io/image_io.hpp"
#include "tiler/writers/output_file.hpp"

namespace tiler {

// The most classes a heatmap holds (a band each: OpenCV's channel limit); a job asking for a heatmap of more
// is refused at set-up.
constexpr int64_t kHeatmapMaxClasses = 512;

class HeatmapTiff : public OutputWriter {
 public:
  // `options`: the TIFF's (compression, metadata, description). Throws ConfigError for more than
  // kHeatmapMaxClasses classes.
  HeatmapTiff(std::string path, int64_t rows, int64_t columns, int64_t classes, WriterOptions options);
  // The K scores of the window in grid cell (column, row).
  void set(int64_t column, int64_t row, const float* scores);
  void finish() override;
  void commit(std::vector<std::string>& renamed) override;

 private:
  std::string path_;
  WriterOptions options_;
  cv::Mat pixels_;                        // rows x columns x K floats
  std::unique_ptr<ImageOutput> written_;  // from finish() on
};

}  // namespace tiler
