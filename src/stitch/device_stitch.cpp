#include "tiler/stitch/device_stitch.hpp"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cmath>

#include "tiler/core/error.hpp"

namespace tiler {

namespace {

torch::ScalarType torchTypeOf(SampleType type) {
  switch (type) {
    case SampleType::kU8:
      return torch::kUInt8;
    case SampleType::kU16:  // class ids below 32768 have the same bits
      return torch::kInt16;
    case SampleType::kF16:
      return torch::kFloat16;
    case SampleType::kF32:
      return torch::kFloat32;
    default:
      break;
  }
  TILER_THROW(ConfigError, "device stitcher: no stored type " << sampleTypeName(type));
}

// `from`'s first `rows` into `to`'s (the host's copy, or `from` itself on the CPU), queued on the stream.
void copyRows(const torch::Tensor& to, const torch::Tensor& from, int64_t rows) {
  if (!to.is_same(from)) to.narrow(0, 0, rows).copy_(from.narrow(0, 0, rows), /*non_blocking=*/true);
}

// `f(ring_row, n, offset)` for each run of padded rows [from, end) in a ring of `ring` rows: ring rows
// [ring_row, ring_row + n) hold padded rows from + offset on. A run of at most `ring` rows wraps once at
// most.
template <typename F>
void forRingRuns(int64_t ring, int64_t from, int64_t end, const F& f) {
  for (int64_t row = from; row < end;) {
    const int64_t ring_row = row % ring, n = std::min(end - row, ring - ring_row);
    f(ring_row, n, row - from);
    row += n;
  }
}

cv::Mat matOf(const torch::Tensor& host, int64_t rows, SampleType type, int channels) {
  return cv::Mat(int(rows), int(host.size(1)), CV_MAKETYPE(cvDepthOf(type), channels), host.data_ptr());
}

}  // namespace

DeviceStitcher::DeviceStitcher(const WindowGrid& grid, int channels, const StitchOptions& stitch,
                               DeviceBandOptions outputs, torch::Device device, BandSink sink,
                               std::optional<std::vector<int64_t>> windows)
    : layout_(grid, stitch),
      channels_(channels),
      outputs_(outputs),
      device_(device),
      sink_(std::move(sink)),
      expected_(grid, std::move(windows)) {
  TILER_CHECK(channels >= 1, ConfigError, "device stitcher: need at least one channel");
  const int64_t win_w = layout_.win_w, win_h = layout_.win_h, out_w = layout_.out_w;
  // Crop: every pixel of a core weighs 1.
  std::vector<float> importance = layout_.importance;
  if (importance.empty()) importance.assign(size_t(win_w * win_h), 1.0f);
  if (!device_.is_cpu())
    stream_ = c10::impl::VirtualGuardImpl(device_.type()).getStreamFromGlobalPool(device_);
  c10::OptionalStreamGuard guard(stream_);
  const int64_t C = channels_;
  const auto on = torch::TensorOptions().device(device_);
  const auto f32 = on.dtype(torch::kFloat32);
  ring_ = torch::zeros({win_h, C + 1, layout_.padded_w}, f32);
  weighted_ = torch::empty({C + 1, win_h, win_w}, f32);
  weighted_.select(0, C).copy_(torch::from_blob(importance.data(), {win_h, win_w}, torch::kFloat32));
  band_ = torch::empty({win_h, out_w, C}, f32);
  denominator_ = torch::empty({win_h, 1, out_w}, f32);
  empty_ = torch::empty({win_h, 1, out_w}, on.dtype(torch::kBool));
  total_ = torch::empty({1}, f32);
  if (outputs_.labels) {
    classes_ = torch::empty({win_h, out_w}, on.dtype(C == 1 ? torch::kBool : torch::kInt64));
    labels_ = torch::empty({win_h, out_w}, on.dtype(torchTypeOf(labelSampleType(int(C)))));
  }
  if (outputs_.probs) {
    probs_ = outputs_.probs_type == SampleType::kF32
                 ? band_
                 : torch::empty({win_h, out_w, C}, on.dtype(torchTypeOf(outputs_.probs_type)));
    if (outputs_.probs_type == SampleType::kU8) scaled_ = torch::empty({win_h, out_w, C}, f32);
  }
  // Page-locked host copies on a GPU, so that each band's copy is queued on the stream; on the CPU, none.
  const auto host = [&](const torch::Tensor& t) {
    if (!t.defined() || device_.is_cpu()) return t;
    return torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
  };
  host_labels_ = host(labels_);
  host_probs_ = host(probs_);
  host_total_ = host(total_);
  synchronize();  // the importance map's copy is done before `importance` goes
}

DeviceStitcher::~DeviceStitcher() = default;

void DeviceStitcher::synchronize() const {
  if (stream_) c10::impl::VirtualGuardImpl(device_.type()).synchronizeStream(*stream_);
}

void DeviceStitcher::addMany(const std::vector<std::pair<int64_t, torch::Tensor>>& windows) {
  c10::OptionalStreamGuard guard(stream_);
  for (const auto& [index, chw] : windows) {
    const int64_t position = expected_.positionOf(index);
    TILER_CHECK(position >= next_ && position < expected_.count() && !early_.count(position), ConfigError,
                "device stitcher: window " << index << " added twice or not among the windows to expect");
    TILER_CHECK(chw.sizes() == torch::IntArrayRef({channels_, layout_.win_h, layout_.win_w}) &&
                    chw.scalar_type() == torch::kFloat32 && chw.device() == device_,
                ConfigError,
                "device stitcher: window " << index << " is " << chw.sizes() << " " << chw.scalar_type()
                                           << " on " << chw.device() << ", not " << channels_ << "x"
                                           << layout_.win_h << "x" << layout_.win_w << " float32 on "
                                           << device_);
    if (position != next_) {
      early_.emplace(position, chw.clone());
      continue;
    }
    accumulateNext(index, chw);
    for (auto it = early_.begin(); it != early_.end() && it->first == next_; it = early_.erase(it))
      accumulateNext(expected_.at(it->first), it->second);
  }
  if (next_ == expected_.count()) flushUpTo(layout_.padded_h);
  synchronize();  // the caller may free the predictions now
}

void DeviceStitcher::accumulateNext(int64_t index, const torch::Tensor& chw) {
  // No later window reaches above this one's first row: the rows above are finished.
  flushUpTo(layout_.part(index).y);
  accumulate(index, chw);
  ++next_;
}

void DeviceStitcher::finishEmpty() {
  TILER_CHECK(expected_.count() == 0, ConfigError, "device stitcher: finishEmpty() with windows to expect");
  c10::OptionalStreamGuard guard(stream_);
  flushUpTo(layout_.padded_h);
}

void DeviceStitcher::accumulate(int64_t index, const torch::Tensor& chw) {
  const OutputLayout::Part p = layout_.part(index);
  if (p.x1 <= p.x0 || p.y1 <= p.y0) return;
  // w x pred rounded, then added: the host's two roundings (a fused multiply-add would differ).
  torch::Tensor values = weighted_.narrow(0, 0, channels_);
  at::mul_out(values, chw, weighted_.select(0, channels_));
  const torch::Tensor rows = weighted_.permute({1, 0, 2}).narrow(2, p.x0, p.x1 - p.x0);  // [h, C+1, w]
  forRingRuns(layout_.win_h, p.y + p.y0, p.y + p.y1, [&](int64_t ring_row, int64_t n, int64_t offset) {
    ring_.narrow(0, ring_row, n).narrow(2, p.x + p.x0, p.x1 - p.x0).add_(rows.narrow(0, p.y0 + offset, n));
  });
}

void DeviceStitcher::flushUpTo(int64_t padded_row) {
  const int64_t win_h = layout_.win_h;
  const auto out = [&](int64_t first, int64_t last) {
    forRingRuns(win_h, first, last,
                [&](int64_t ring_row, int64_t n, int64_t at) { divideInto(ring_row, n, at); });
    handOver(last - first);
  };
  const auto clear = [&](int64_t from, int64_t end) {
    forRingRuns(win_h, from, end,
                [&](int64_t ring_row, int64_t n, int64_t) { ring_.narrow(0, ring_row, n).zero_(); });
  };
  flushed_ = layout_.forEachRun(flushed_, padded_row, out, clear);
}

void DeviceStitcher::divideInto(int64_t ring_row, int64_t rows, int64_t at) {
  const torch::Tensor piece = ring_.narrow(0, ring_row, rows).narrow(2, layout_.crop_x, layout_.out_w);
  const torch::Tensor weights = piece.narrow(1, channels_, 1);  // piece: [n, C+1, w]
  torch::Tensor empty = empty_.narrow(0, 0, rows), denominator = denominator_.narrow(0, 0, rows);
  // The host's `w > 0 ? sum / w : 0`: where no window reached, the sum is 0 and is divided by 1.
  at::eq_out(empty, weights, 0);
  at::add_out(denominator, weights, empty);
  torch::Tensor into = band_.narrow(0, at, rows).permute({0, 2, 1});  // [n, C, w] of the HWC band
  at::div_out(into, piece.narrow(1, 0, channels_), denominator);
}

void DeviceStitcher::handOver(int64_t rows) {
  const torch::Tensor band = band_.narrow(0, 0, rows);
  // A sum that is not finite: a value is not (or the sum overflowed float, which only sends the band the
  // host's way).
  at::sum_out(total_, band.reshape({-1}), {0}, /*keepdim=*/true);
  copyRows(host_total_, total_, 1);
  if (outputs_.labels) {
    torch::Tensor classes = classes_.narrow(0, 0, rows);
    if (channels_ == 1) {
      at::gt_out(classes, band.select(2, 0), outputs_.threshold);
    } else {
      at::argmax_out(classes, band, 2);  // the first of equal maxima, as the host's strict >
    }
    labels_.narrow(0, 0, rows).copy_(classes);
    copyRows(host_labels_, labels_, rows);
  }
  if (outputs_.probs) {
    if (outputs_.probs_type == SampleType::kU8) {
      // probabilitiesToBytes: p x 255 in float, rounded half to even, clamped (NaN never comes here).
      torch::Tensor scaled = scaled_.narrow(0, 0, rows);
      scaled.copy_(band).mul_(255.0f).round_().clamp_(0, 255);
      probs_.narrow(0, 0, rows).copy_(scaled);
    } else if (outputs_.probs_type == SampleType::kF16) {
      probs_.narrow(0, 0, rows).copy_(band);
    }
    copyRows(host_probs_, probs_, rows);
  }
  synchronize();
  Band out;
  if (!std::isfinite(host_total_.data_ptr<float>()[0])) {
    out.floats = matOf(band.to(torch::kCPU).contiguous(), rows, SampleType::kF32, channels_).clone();
  } else {
    if (outputs_.labels) out.labels = matOf(host_labels_, rows, labelSampleType(channels_), 1);
    if (outputs_.probs) out.probs = matOf(host_probs_, rows, outputs_.probs_type, channels_);
  }
  sink_(out);
}

}  // namespace tiler
