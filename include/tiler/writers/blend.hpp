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

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <opencv2/core.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/core/queue.hpp"

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
// The same, in the same pass setting `large` when any value's magnitude is 2^23 or more or is not finite:
// the values OpenCV's byte conversion gets wrong (probabilitiesToBytes).
int64_t countNonFinite(const float* values, int64_t count, bool& large);
// The finite values that become infinite stored as float16 (magnitude 65520 and more: past its largest,
// 65504, by more than rounding takes back).
int64_t countBeyondHalf(const float* values, int64_t count);

// Probabilities stored as bytes (--probs_dtype u8): round(p x 255), half to even, after clamping p to [0, 1]
// (NaN to 0). p x 255 is rounded to float first, as OpenCV's convertTo and the device stitcher do. `large`:
// some value may be 2^23 or more (countNonFinite said so), which costs a second look at every value.
void probabilitiesToBytes(const float* p, int64_t count, uint8_t* out, bool large = true);

// Labels of `band` (as labelsFromProbabilities) into `labels`, a CV_8U or CV_16U matrix of its size.
void labelsInto(const cv::Mat& band, float threshold, cv::Mat labels);

struct StitchOptions {
  BlendMode mode = BlendMode::kGaussian;
  double sigma_scale = 0.125;
  WorkPool* pool = nullptr;  // not owned; rows are blended in pieces on it too (null: the caller's thread)
  // The model's output halo, output px: the band of each window along an edge that meets another window of
  // the grid is never blended (weight 0, every mode); along the image's border it is kept, as a forward of
  // the whole image keeps it. The grid's overlap must be at least twice it, or pixels go uncovered.
  int64_t halo = 0;
};

// A grid in output pixels (the model's scale applied), as both stitchers (this one and device_stitch) lay it
// out: padded image, window, the image inside the padding, and what each window adds.
struct OutputLayout {
  OutputLayout(const WindowGrid& grid, const StitchOptions& options);
  // The part of window `index` that is blended: its output-space origin and the window-local rows and columns
  // (all of it, or its crop core), less the halo along each edge that meets another window.
  struct Part {
    int64_t x = 0, y = 0;                    // origin in the padded output
    int64_t x0 = 0, x1 = 0, y0 = 0, y1 = 0;  // window-local [x0, x1) x [y0, y1)
  };
  Part part(int64_t index) const;
  // Padded rows [from, to) (to clamped to padded_h) in runs of at most one ring of win_h rows:
  // `out(first, last)` with the image rows among them when there are any (not the padding's), then
  // `clear(begin, end)` with the run. Returns where it stopped.
  template <typename Out, typename Clear>
  int64_t forEachRun(int64_t from, int64_t to, const Out& out, const Clear& clear) const {
    to = std::min(to, padded_h);
    while (from < to) {
      const int64_t end = std::min(to, from + win_h);
      const int64_t first = std::max(from, crop_y), last = std::min(end, crop_y + out_h);
      if (last > first) out(first, last);
      clear(from, end);
      from = end;
    }
    return from;
  }

  WindowGrid grid;  // the input-space grid
  Scale scale;
  int64_t win_w, win_h;                   // output-space window
  int64_t padded_w, padded_h;             // output-space padded image
  int64_t crop_x, crop_y;                 // offset of the image inside the padding
  int64_t out_w, out_h;                   // output image size
  int64_t halo = 0;                       // StitchOptions::halo
  std::vector<float> importance;          // win_w x win_h (gaussian, constant; crop: empty, weight 1)
  std::vector<int64_t> cores_x, cores_y;  // crop mode: the windows' cores per axis
};

// The grid windows a stitcher expects, by position: every one of the grid, or those a mask kept.
class ExpectedWindows {
 public:
  // `kept`: ascending grid indices (throws ConfigError otherwise); nullopt: all of them.
  ExpectedWindows(const WindowGrid& grid, std::optional<std::vector<int64_t>> kept);
  int64_t count() const { return count_; }
  int64_t at(int64_t position) const { return all_ ? position : kept_[size_t(position)]; }
  // The position of grid window `index`; -1 when it is not expected.
  int64_t positionOf(int64_t index) const;

 private:
  bool all_;
  std::vector<int64_t> kept_;
  int64_t count_;
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
  bool done() const { return next_ == expected_.count() && flushed_ == layout_.padded_h; }
  // With no window to add at all, hands every (zero) row to the sink.
  void finishEmpty();
  size_t bytesHeld() const;
  // Buffers made for early arrivals so far (each reused once its window is accumulated).
  int64_t earlyBuffersMade() const { return early_buffers_made_; }

 private:
  // Accumulates `run` (consecutive windows, in order): those of one grid row together.
  void accumulateRun(const std::vector<std::pair<int64_t, const float*>>& run);
  // Window-local rows [y_first, y_last) of window `index` (clipped to its crop core in crop mode).
  void accumulateRows(int64_t index, const float* chw, int64_t y_first, int64_t y_last);
  void flushUpTo(int64_t padded_row);

  OutputLayout layout_;
  int channels_;
  StitchOptions options_;
  BandSink sink_;
  std::vector<float> acc_;     // ring of win_h rows: channels_ planes of padded_w (w*pred)
  std::vector<float> weight_;  // ring of win_h rows: padded_w (w)
  cv::Mat band_buffer_;        // win_h rows x out_w: the band handed to the sink
  int64_t flushed_ = 0;        // first padded row not yet handed out
  ExpectedWindows expected_;
  int64_t next_ = 0;                               // position (in expected_) of the next to accumulate
  std::map<int64_t, std::vector<float>> pending_;  // early arrivals by position, owned copies
  // Buffers of early arrivals already accumulated, reused for the next ones: with several ranks half the
  // windows arrive early, and a fresh buffer each is a fresh mapping whose pages all fault.
  std::vector<std::vector<float>> spare_;
  int64_t early_buffers_made_ = 0;
};

}  // namespace tiler
