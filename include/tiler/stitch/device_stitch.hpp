// device_stitch: blend's Stitcher run where the predictions already are (the model's GPU), with LibTorch's
// device-generic operations: the ring of rows lives there, and each finished band is divided, converted to
// what is stored (labels; probabilities as f32, f16 or u8) and copied back once, in its stored type: a byte a
// pixel of labels instead of every window's float32 maps crossing the bus.
// Promise: the same bytes as blend's Stitcher followed by the host's conversions (outputs.cpp) of the same
// predictions. Every pixel sums importance x prediction of its windows in window order (a rounded multiply,
// then an add, as the host does), is divided by its summed importance once, and is rounded as OpenCV rounds
// (half to even). A band holding a value that is not finite comes back as float32 for the host to convert
// and count, so that NaN and infinity follow the host's rules.
// Memory: the ring ((C+1) x window height x padded width floats), one window's weighted copy and one band of
// each output are all allocated when it is made, so out of memory shows then (the caller stitches that image
// on the host instead) and not in the middle of an image; only windows that arrive before their turn (other
// ranks' parts of a row, at most --shard_buffer of them) are copied as they come. Its own stream: the
// caller's predictions must be complete when given (the forward synchronised) and may be freed once addMany
// returns. Not thread safe.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <opencv2/core.hpp>
#include <optional>
#include <vector>

#include "tiler/io/image_io.hpp"
#include "tiler/writers/blend.hpp"

namespace tiler {

// What a finished band becomes.
struct DeviceBandOptions {
  bool labels = true;                        // argmax (one channel: > threshold) as labelSampleType(C)
  bool probs = false;                        // the blended maps as probs_type
  SampleType probs_type = SampleType::kF32;  // f32 | f16 | u8 (round(p x 255), clamped to [0, 255])
  float threshold = 0.f;                     // one-channel models
};

class DeviceStitcher {
 public:
  // One finished band of image rows, on the host and valid during the call only: `labels` (one channel)
  // and `probs` (C channels, stored type) as asked, or, when the band holds a value that is not finite,
  // `floats` alone (HWC float32, what blend's Stitcher hands its sink) for the host to convert.
  struct Band {
    cv::Mat labels, probs, floats;
  };
  using BandSink = std::function<void(const Band& band)>;

  // As blend's Stitcher, on `device`; throws what LibTorch throws when the device lacks the memory.
  DeviceStitcher(const WindowGrid& grid, int channels, const StitchOptions& stitch, DeviceBandOptions outputs,
                 torch::Device device, BandSink sink,
                 std::optional<std::vector<int64_t>> windows = std::nullopt);
  ~DeviceStitcher();

  // Adds windows (grid index, C x h x w float32 on the device), any order, each once.
  void addMany(const std::vector<std::pair<int64_t, torch::Tensor>>& windows);
  bool done() const { return next_ == expected_.count() && flushed_ == layout_.padded_h; }
  // With no window to add at all, hands every (zero) row to the sink.
  void finishEmpty();

 private:
  void accumulate(int64_t index, const torch::Tensor& chw);
  void accumulateNext(int64_t index, const torch::Tensor& chw);  // the window whose turn it is
  void flushUpTo(int64_t padded_row);
  // Ring rows [ring_row, ring_row + rows) of the image's columns into band rows [at, at + rows).
  void divideInto(int64_t ring_row, int64_t rows, int64_t at);
  void handOver(int64_t rows);
  void synchronize() const;

  OutputLayout layout_;
  int channels_;
  DeviceBandOptions outputs_;
  torch::Device device_;
  c10::optional<c10::Stream> stream_;  // a pool stream of device_ (none on the CPU)
  BandSink sink_;
  ExpectedWindows expected_;
  int64_t next_ = 0;                        // position (in expected_) of the next
  std::map<int64_t, torch::Tensor> early_;  // windows that came before their turn, by position (copies)
  int64_t flushed_ = 0;                     // first padded row not yet handed out
  // Device tensors, all made by the constructor:
  torch::Tensor ring_;                 // [win_h, C+1, padded_w]: C planes of sum(w x pred) and one of sum(w)
  torch::Tensor weighted_;             // [C+1, win_h, win_w]: a window's w x pred, then w (constant)
  torch::Tensor band_;                 // [win_h, out_w, C]: divided rows, HWC
  torch::Tensor denominator_, empty_;  // [win_h, 1, out_w]: sum(w), 1 where it is 0; where it is 0
  torch::Tensor total_;                // [1] float: the band's sum (not finite: a value is not)
  torch::Tensor classes_;              // [win_h, out_w] int64 (argmax) or bool (threshold)
  torch::Tensor labels_, probs_, scaled_;  // [win_h, out_w(, C)] stored types; u8: p x 255 as float
  // Host copies (page-locked on a GPU):
  torch::Tensor host_labels_, host_probs_, host_total_;
};

}  // namespace tiler
