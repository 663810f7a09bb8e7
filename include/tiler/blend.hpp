// blend: importance maps and the streaming Stitcher. No LibTorch (predictions arrive as float CHW arrays).
//
// Stitcher promises: output bytes depend only on the predictions, never on their arrival order: windows are
// accumulated (w*pred and w, float32) strictly in window-index order, buffering early arrivals. Memory is a
// ring of one output window's height of rows across the padded output width, (C+1) floats per pixel, plus
// the importance map and early arrivals: bytesHeld() <= wh*PW*(C+1)*4 + ww*wh*4 + the most pending at once.
// Rows are divided by the summed weights (0 where no window reached) and handed to the sink, top to bottom,
// in bands of at most one window's height, as soon as no later window can touch them. Not thread safe: one
// thread feeds a Stitcher. With a pool, accumulating, dividing and clearing run in pieces of rows on it as
// well (each pixel still sums its windows in window order): the same bytes as without.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <opencv2/core.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tiler/grid.hpp"
#include "tiler/queue.hpp"

namespace tiler {

enum class BlendMode { kConstant, kGaussian, kCrop };
BlendMode parseBlendMode(const std::string& name);

// The gaussian importance map of MONAI: separable exp(-x^2/(2 sigma^2)), sigma = sigma_scale * n per axis,
// x = -(n-1)/2 ... (n-1)/2, clamped below at max(min(map), 1e-3). Row-major w x h.
std::vector<float> gaussianImportance(int64_t w, int64_t h, double sigma_scale);

// Per-axis cores for crop blending: core i of the windows starting at `starts` (each `window` long) is
// [cores[i], cores[i+1]); overlaps are split at their middle and border windows reach the edges.
std::vector<int64_t> cropCores(const std::vector<int64_t>& starts, int64_t window, int64_t size);

// Labels of a blended HWC float band: argmax over channels (labelSampleType: u8 up to 256 classes); a single
// channel is thresholded at `threshold` (0 for logits, 0.5 for sigmoid probabilities).
cv::Mat labelsFromProbabilities(const cv::Mat& band, float threshold);

// How many of `count` floats are NaN or infinite (a model's output that blending would turn into label 0
// without a word; blending keeps them non-finite). Exponent bits only, so that it vectorises: 20 us for a
// 2x256x256 window's floats on this machine, a pass over memory.
int64_t countNonFinite(const float* values, int64_t count);

// Labels of `band` (as labelsFromProbabilities) into `labels`, a CV_8U or CV_16U matrix of its size.
void labelsInto(const cv::Mat& band, float threshold, cv::Mat labels);

struct StitchOptions {
  BlendMode mode = BlendMode::kGaussian;
  double sigma_scale = 0.125;
  WorkPool* pool = nullptr;  // not owned; rows are blended in pieces on it too (null: the caller's thread)
};

class Stitcher {
 public:
  // band: rows of the output image (HWC float32, image width * scale), with the index of its first row;
  // valid during the call only (the stitcher reuses its buffer).
  using BandSink = std::function<void(const cv::Mat& band, int64_t first_row)>;

  // `grid` is the input-space grid; predictions are channels x (window*scale) arrays. `windows`: the grid
  // windows that will be added, ascending (a mask skipped the others; possibly none); nullopt: all of them.
  // Output pixels no added window covers are 0.
  Stitcher(const WindowGrid& grid, int channels, StitchOptions options, BandSink sink,
           std::optional<std::vector<int64_t>> windows = std::nullopt);

  // Adds grid window `index` (one of `windows`) as CHW float32. Any order; each index once.
  void add(int64_t index, const float* chw);
  // Adds several (a step's windows of this image), each as add() would: windows that follow one another
  // are accumulated together, in row pieces on the pool. The arrays need to live during the call only.
  void addMany(const std::vector<std::pair<int64_t, const float*>>& windows);
  // True once every window was added and every row handed to the sink.
  bool done() const { return next_ == count_ && flushed_ == padded_h_; }
  // With no window to add at all, hands every (zero) row to the sink.
  void finishEmpty();
  int64_t outputWidth() const { return out_w_; }
  int64_t outputHeight() const { return out_h_; }
  size_t bytesHeld() const;
  // Buffers made for early arrivals so far (each reused once its window is accumulated).
  int64_t earlyBuffersMade() const { return early_buffers_made_; }

 private:
  // Accumulates `run` (consecutive windows, in order): those of one grid row together.
  void accumulateRun(const std::vector<std::pair<int64_t, const float*>>& run);
  // Window-local rows [y_first, y_last) of window `index` (clipped to its crop core in crop mode).
  void accumulateRows(int64_t index, const float* chw, int64_t y_first, int64_t y_last);
  int64_t positionOf(int64_t index) const;
  int64_t windowAt(int64_t position) const {
    return windows_.empty() ? position : windows_[size_t(position)];
  }
  void flushUpTo(int64_t padded_row);

  WindowGrid grid_;
  int channels_;
  StitchOptions options_;
  BandSink sink_;
  Scale scale_;
  int64_t win_w_, win_h_;                   // output-space window
  int64_t padded_w_, padded_h_;             // output-space padded image
  int64_t crop_x_, crop_y_;                 // output-space offset of the image inside the padding
  int64_t out_w_, out_h_;                   // output image size
  std::vector<float> importance_;           // win_w_ x win_h_ (gaussian/constant)
  std::vector<int64_t> cores_x_, cores_y_;  // crop mode
  std::vector<float> acc_;                  // ring of win_h_ rows: channels_ planes of padded_w_ (w*pred)
  std::vector<float> weight_;               // ring of win_h_ rows: padded_w_ (w)
  cv::Mat band_buffer_;                     // win_h_ rows x out_w_: the band handed to the sink
  int64_t flushed_ = 0;                     // first padded row not yet handed out
  bool all_windows_ = true;                 // expect every grid window, else those in windows_
  std::vector<int64_t> windows_;            // the grid windows to expect (ascending)
  int64_t count_ = 0;                       // how many
  int64_t next_ = 0;                        // position (in windows_) of the next to accumulate
  std::map<int64_t, std::vector<float>> pending_;  // early arrivals by position, owned copies
  // Buffers of early arrivals already accumulated, reused for the next ones: with several ranks half the
  // windows arrive early, and a fresh buffer each is a fresh mapping whose pages all fault.
  std::vector<std::vector<float>> spare_;
  int64_t early_buffers_made_ = 0;
};

}  // namespace tiler
