// output_statistics: a model card's postprocessing over the blended output's own statistics
// (splitAtStatistics' rest: zero_mean_unit_variance, scale_range, scale_mean_variance and the steps after
// them), followed in two passes over one image's map. Promise: the first pass takes the blended bands in
// row order, writes them as float32 to an unlinked temporary file in the temporary directory (TMPDIR, else
// /tmp; width x height x channels x 4 bytes, which the system frees when it is closed, whatever ends the
// process) and gathers each channel's and all channels' count, mean and std (double, bands combined by
// Chan et al.'s pairwise update); percentiles, where a step reads them, from a histogram of kFloatBins bins
// over [min, max] in one more read (within one bin's width of numpy's linear percentile, the extremes
// exact). The second pass reads the file back band by band, applies the steps with those statistics (and
// the input's as read, for a reference_tensor) and hands each band on in row order, so the map's writers
// see what the whole chain makes of the whole blended output. Memory: a band at a time (the bands handed
// in, or `band_rows` rows read back), never the map. Every failure is an IoError naming the image and the
// temporary file's directory. No LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <opencv2/core.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tiler/core/processing.hpp"

namespace tiler {

class StatisticsPasses {
 public:
  // `steps`: the chain from its first statistics step on; `input`: the input's statistics as read where a
  // step reads them (else null; copied); `width` x `height` x `channels`: the blended map; `what`: the image,
  // for messages. Opens the temporary file.
  StatisticsPasses(std::vector<ProcessingStep> steps, const ImageStatistics* input, int64_t width,
                   int64_t height, int channels, std::string what);
  ~StatisticsPasses();
  StatisticsPasses(const StatisticsPasses&) = delete;
  StatisticsPasses& operator=(const StatisticsPasses&) = delete;

  // The first pass: the next rows of the blended map (HWC float32, `width` wide).
  void add(const cv::Mat& band);
  // Once every row was added: the statistics, then every row through the steps, to `sink` in bands of at
  // most `band_rows` rows (valid during the call), top to bottom.
  void replay(int64_t band_rows, const std::function<void(const cv::Mat& band)>& sink);
  // After replay(): the output's statistics and the map the affine steps made of them.
  const ImageStatistics& statistics() const { return statistics_; }
  const ChannelAffine& affine() const { return affine_; }
  // TILER_FAULT's write failure: the temporary file's next write fails as on a full disk.
  void failAsFullDisk() { full_ = true; }
  // The temporary file's directory.
  const std::string& directory() const { return dir_; }

 private:
  void read(int64_t first_row, int64_t rows, float* out) const;
  std::vector<ProcessingStep> steps_;
  std::optional<ImageStatistics> input_;
  int64_t width_, height_;
  int channels_;
  std::string what_, dir_;
  int fd_ = -1;
  int64_t rows_ = 0;  // rows written
  bool full_ = false;
  std::vector<double> percentiles_;  // of the output, read by some step
  StatisticsGatherer gatherer_;
  ImageStatistics statistics_;
  ChannelAffine affine_;
};

}  // namespace tiler
