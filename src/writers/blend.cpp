#include "tiler/writers/blend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tiler/core/error.hpp"
#include "tiler/io/image_io.hpp"

namespace tiler {

namespace {

// countNonFinite's loop, with or without the test for large magnitudes (a loop each, so that the plain count
// pays nothing for it).
template <bool kLarge>
int64_t countBits(const float* values, int64_t count, bool& large) {
  // 32-bit counts a block: the inner loop vectorises, which a 64-bit sum of compares does not.
  int64_t bad = 0;
  uint32_t any_large = 0;
  for (int64_t start = 0; start < count; start += 65536) {
    const int64_t end = std::min<int64_t>(count, start + 65536);
    uint32_t block = 0;
    for (int64_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, values + i, sizeof bits);
      block += (bits & 0x7f800000u) == 0x7f800000u;
      if (kLarge) any_large |= (bits & 0x7fffffffu) >= 0x4b000000u;  // |v| >= 2^23, NaN and infinities
    }
    bad += block;
  }
  large = large || any_large != 0;
  return bad;
}

}  // namespace

int64_t countNonFinite(const float* values, int64_t count) {
  bool unused = false;
  return countBits<false>(values, count, unused);
}

int64_t countNonFinite(const float* values, int64_t count, bool& large) {
  return countBits<true>(values, count, large);
}

int64_t countBeyondHalf(const float* values, int64_t count) {
  // float16's largest is 65504; from 65520, halfway to the next power of two, rounding gives infinity.
  constexpr float kHalfInfinity = 65520.0f;
  int64_t beyond = 0;
  for (int64_t i = 0; i < count; ++i)
    beyond += std::isfinite(values[i]) && std::abs(values[i]) >= kHalfInfinity;
  return beyond;
}

BlendMode parseBlendMode(const std::string& name) {
  if (name == "constant") return BlendMode::kConstant;
  if (name == "gaussian") return BlendMode::kGaussian;
  if (name == "crop") return BlendMode::kCrop;
  TILER_THROW(ConfigError, "--blend must be constant, gaussian or crop; got '" << name << "'");
}

std::vector<float> gaussianImportance(int64_t w, int64_t h, double sigma_scale) {
  TILER_CHECK(sigma_scale > 0, ConfigError, "--sigma_scale must be > 0, got " << sigma_scale);
  auto axis = [sigma_scale](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    const double sigma = sigma_scale * double(n);
    for (int64_t i = 0; i < n; ++i) {
      double x = double(i) - double(n - 1) / 2.0;
      v[size_t(i)] = std::exp(-x * x / (2.0 * sigma * sigma));
    }
    return v;
  };
  std::vector<double> gx = axis(w), gy = axis(h);
  std::vector<float> map(static_cast<size_t>(w * h));
  float lowest = INFINITY;
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      float v = float(gy[size_t(y)] * gx[size_t(x)]);
      map[size_t(y * w + x)] = v;
      lowest = std::min(lowest, v);
    }
  }
  const float floor_value = std::max(lowest, 1e-3f);
  for (auto& v : map) v = std::max(v, floor_value);
  return map;
}

std::vector<int64_t> cropCores(const std::vector<int64_t>& starts, int64_t window, int64_t size) {
  std::vector<int64_t> cores(starts.size() + 1);
  cores.front() = 0;
  cores.back() = size;
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    const int64_t overlap_begin = starts[i + 1], overlap_end = starts[i] + window;
    cores[i + 1] = overlap_end > overlap_begin ? (overlap_begin + overlap_end) / 2 : overlap_begin;
  }
  return cores;
}

void probabilitiesToBytes(const float* p, int64_t count, uint8_t* out, bool large) {
  // OpenCV's convertTo rounds half to even and saturates (NaN and negatives to 0), vectorised; but p x 255
  // past 2^31 becomes 0, not 255: where such values may be, every p >= 1 is set to 255 after.
  cv::Mat bytes(1, int(count), CV_8U, out);
  cv::Mat(1, int(count), CV_32F, const_cast<float*>(p)).convertTo(bytes, CV_8U, 255.0);
  if (large)
    for (int64_t i = 0; i < count; ++i) out[i] = p[i] >= 1.0f ? uint8_t(255) : out[i];
}

cv::Mat labelsFromProbabilities(const cv::Mat& band, float threshold) {
  cv::Mat labels(band.rows, band.cols, cvDepthOf(labelSampleType(band.channels())));
  labelsInto(band, threshold, labels);
  return labels;
}

void labelsInto(const cv::Mat& band, float threshold, cv::Mat labels) {
  const int c = band.channels();
  const bool wide = labels.depth() == CV_16U;
  for (int y = 0; y < band.rows; ++y) {
    const float* p = band.ptr<float>(y);
    for (int x = 0; x < band.cols; ++x, p += c) {
      int best = 0;
      if (c == 1) {
        best = p[0] > threshold ? 1 : 0;
      } else {
        for (int k = 1; k < c; ++k) best = p[k] > p[best] ? k : best;
      }
      if (wide)
        labels.ptr<uint16_t>(y)[x] = uint16_t(best);
      else
        labels.ptr<uint8_t>(y)[x] = uint8_t(best);
    }
  }
}

OutputLayout::OutputLayout(const WindowGrid& g, const StitchOptions& options) : grid(g), scale(g.scale()) {
  win_w = scale.apply(grid.windowWidth());
  win_h = scale.apply(grid.windowHeight());
  padded_w = scale.apply(grid.paddedWidth());
  padded_h = scale.apply(grid.paddedHeight());
  crop_x = scale.apply(grid.padLeft());
  crop_y = scale.apply(grid.padTop());
  out_w = std::max<int64_t>(1, scale.apply(grid.imageWidth()));
  out_h = std::max<int64_t>(1, scale.apply(grid.imageHeight()));
  TILER_CHECK(win_w > 0 && win_h > 0, ConfigError, "stitcher: output window is empty at this scale");
  halo = options.halo;
  TILER_CHECK(halo >= 0 && 2 * halo < std::min(win_w, win_h), ConfigError,
              "stitcher: a halo of " << halo << " px leaves nothing of a " << win_w << "x" << win_h
                                     << " output window");
  if (options.mode == BlendMode::kGaussian) {
    importance = gaussianImportance(win_w, win_h, options.sigma_scale);
  } else if (options.mode == BlendMode::kConstant) {
    importance.assign(size_t(win_w * win_h), 1.0f);
  } else {
    auto scaled = [this](const std::vector<int64_t>& starts) {
      std::vector<int64_t> out;
      for (auto s : starts) out.push_back(scale.apply(s));
      return out;
    };
    cores_x = cropCores(scaled(grid.startsX()), win_w, padded_w);
    cores_y = cropCores(scaled(grid.startsY()), win_h, padded_h);
  }
}

OutputLayout::Part OutputLayout::part(int64_t index) const {
  const Rect r = grid.window(index);
  Part p{scale.apply(r.x), scale.apply(r.y), 0, win_w, 0, win_h};
  if (!cores_x.empty()) {
    const int64_t col = index % grid.columns(), row = index / grid.columns();
    p.x0 = cores_x[size_t(col)] - p.x;
    p.x1 = cores_x[size_t(col) + 1] - p.x;
    p.y0 = cores_y[size_t(row)] - p.y;
    p.y1 = cores_y[size_t(row) + 1] - p.y;
  }
  if (halo > 0) {
    // A window's first and last column and row of the grid meet the image's border, the others a neighbour.
    const int64_t col = index % grid.columns(), row = index / grid.columns();
    const int64_t columns = grid.columns(), rows = int64_t(grid.startsY().size());
    if (col > 0) p.x0 = std::max(p.x0, halo);
    if (col + 1 < columns) p.x1 = std::min(p.x1, win_w - halo);
    if (row > 0) p.y0 = std::max(p.y0, halo);
    if (row + 1 < rows) p.y1 = std::min(p.y1, win_h - halo);
  }
  return p;
}

ExpectedWindows::ExpectedWindows(const WindowGrid& grid, std::optional<std::vector<int64_t>> kept)
    : all_(!kept.has_value()), kept_(kept ? std::move(*kept) : std::vector<int64_t>{}) {
  count_ = all_ ? grid.count() : int64_t(kept_.size());
  TILER_CHECK(std::is_sorted(kept_.begin(), kept_.end()) &&
                  (kept_.empty() || (kept_.front() >= 0 && kept_.back() < grid.count())),
              ConfigError, "stitcher: the windows to expect must be ascending grid indices");
}

int64_t ExpectedWindows::positionOf(int64_t index) const {
  if (all_) return index;
  auto it = std::lower_bound(kept_.begin(), kept_.end(), index);
  return it != kept_.end() && *it == index ? int64_t(it - kept_.begin()) : -1;
}

Stitcher::Stitcher(const WindowGrid& grid, int channels, StitchOptions options, BandSink sink,
                   std::optional<std::vector<int64_t>> windows)
    : layout_(grid, options),
      channels_(channels),
      options_(options),
      sink_(std::move(sink)),
      expected_(grid, std::move(windows)) {
  TILER_CHECK(channels >= 1, ConfigError, "stitcher: need at least one channel");
  acc_.assign(size_t(layout_.win_h * layout_.padded_w * channels_), 0.0f);
  weight_.assign(size_t(layout_.win_h * layout_.padded_w), 0.0f);
}

size_t Stitcher::bytesHeld() const {
  size_t pending = 0;
  for (auto& [i, v] : pending_) pending += v.size() * sizeof(float);
  for (auto& v : spare_) pending += v.size() * sizeof(float);
  return (acc_.size() + weight_.size() + layout_.importance.size()) * sizeof(float) + pending;
}

void Stitcher::add(int64_t index, const float* chw) {
  addMany({{index, chw}});
}

void Stitcher::addMany(const std::vector<std::pair<int64_t, const float*>>& windows) {
  std::vector<std::pair<int64_t, const float*>> run;  // the windows to accumulate now, in order
  std::vector<std::vector<float>> used;               // early copies among them (moving keeps their data)
  for (const auto& [index, chw] : windows) {
    const int64_t position = expected_.positionOf(index);
    TILER_CHECK(position >= next_ && position < expected_.count() && !pending_.count(position), ConfigError,
                "stitcher: window " << index << " added twice, out of range (0.." << layout_.grid.count() - 1
                                    << ") or not among the windows to expect");
    if (position != next_) {
      const size_t n = size_t(channels_ * layout_.win_w * layout_.win_h);
      std::vector<float> copy;
      if (!spare_.empty()) {
        copy = std::move(spare_.back());
        spare_.pop_back();
      } else {
        ++early_buffers_made_;
      }
      copy.assign(chw, chw + n);
      pending_.emplace(position, std::move(copy));
      continue;
    }
    run.emplace_back(index, chw);
    ++next_;
    for (auto it = pending_.begin(); it != pending_.end() && it->first == next_; it = pending_.erase(it)) {
      used.push_back(std::move(it->second));
      run.emplace_back(expected_.at(it->first), used.back().data());
      ++next_;
    }
  }
  accumulateRun(run);
  for (auto& buffer : used) spare_.push_back(std::move(buffer));
  if (next_ == expected_.count() && !run.empty()) {
    spare_.clear();
    flushUpTo(layout_.padded_h);
  }
}

void Stitcher::accumulateRun(const std::vector<std::pair<int64_t, const float*>>& run) {
  // Windows arrive in row-major order: those of one grid row share their top row, and no later window
  // reaches above it, so the rows above are flushed first. A grid row's windows are then accumulated
  // together, each piece of rows going through all of them in window order.
  for (size_t first = 0; first < run.size();) {
    const int64_t y0 = layout_.part(run[first].first).y;
    size_t last = first + 1;
    while (last < run.size() && layout_.part(run[last].first).y == y0) ++last;
    flushUpTo(y0);
    parallelRows(options_.pool, layout_.win_h, kMinRowsPerPiece, [&](int64_t y_first, int64_t y_last) {
      for (size_t k = first; k < last; ++k) accumulateRows(run[k].first, run[k].second, y_first, y_last);
    });
    first = last;
  }
}

void Stitcher::finishEmpty() {
  TILER_CHECK(expected_.count() == 0, ConfigError, "stitcher: finishEmpty() with windows to expect");
  flushUpTo(layout_.padded_h);
}

void Stitcher::accumulateRows(int64_t index, const float* chw, int64_t y_first, int64_t y_last) {
  const OutputLayout::Part part = layout_.part(index);
  const int64_t win_w = layout_.win_w, win_h = layout_.win_h, padded_w = layout_.padded_w;
  const int64_t cx0 = part.x0, cx1 = part.x1, cy0 = std::max(part.y0, y_first),
                cy1 = std::min(part.y1, y_last);
  const int64_t plane = win_w * win_h;
  for (int64_t y = cy0; y < cy1; ++y) {
    const int64_t ring_row = (part.y + y) % win_h;
    float* wsum = weight_.data() + size_t(ring_row * padded_w + part.x);
    const float* imp = layout_.importance.empty() ? nullptr : layout_.importance.data() + size_t(y * win_w);
    if (imp) {
      for (int64_t x = cx0; x < cx1; ++x) wsum[x] += imp[x];
    } else {
      for (int64_t x = cx0; x < cx1; ++x) wsum[x] += 1.0f;
    }
    // Channel planes in the ring as in the window: the loops run over contiguous floats and vectorise.
    for (int c = 0; c < channels_; ++c) {
      float* acc = acc_.data() + size_t(((ring_row * channels_ + c) * padded_w) + part.x);
      const float* p = chw + c * plane + y * win_w;
      if (imp) {
        for (int64_t x = cx0; x < cx1; ++x) acc[x] += imp[x] * p[x];
      } else {
        for (int64_t x = cx0; x < cx1; ++x) acc[x] += p[x];
      }
    }
  }
}

void Stitcher::flushUpTo(int64_t padded_row) {
  const OutputLayout& l = layout_;
  // At most one ring of rows at a time: rows past the ring (a gap a mask left) were never written, so are 0.
  const auto out = [&](int64_t first, int64_t last) {
    // One buffer for every band (50 MB for two channels of 192 rows of 32768 px: above glibc's mmap
    // threshold, a band made per flush would be mapped and faulted in each time).
    if (band_buffer_.empty()) band_buffer_.create(int(l.win_h), int(l.out_w), CV_MAKETYPE(CV_32F, channels_));
    cv::Mat band = band_buffer_.rowRange(0, int(last - first));
    parallelRows(options_.pool, last - first, kMinRowsPerPiece, [&](int64_t a, int64_t b) {
      for (int64_t row = first + a; row < first + b; ++row) {
        const int64_t ring_row = row % l.win_h;
        const float* wsum = weight_.data() + size_t(ring_row * l.padded_w + l.crop_x);
        float* values = band.ptr<float>(int(row - first));
        for (int c = 0; c < channels_; ++c) {
          const float* acc = acc_.data() + size_t((ring_row * channels_ + c) * l.padded_w + l.crop_x);
          for (int64_t x = 0; x < l.out_w; ++x)
            values[x * channels_ + c] = wsum[x] > 0 ? acc[x] / wsum[x] : 0.0f;
        }
      }
    });
    sink_(band, first - l.crop_y);
  };
  const auto clear = [&](int64_t from, int64_t end) {
    parallelRows(options_.pool, end - from, kMinRowsPerPiece, [&](int64_t a, int64_t b) {
      for (int64_t row = from + a; row < from + b; ++row) {
        const int64_t ring_row = row % l.win_h;
        std::fill_n(acc_.begin() + ring_row * l.padded_w * channels_, l.padded_w * channels_, 0.0f);
        std::fill_n(weight_.begin() + ring_row * l.padded_w, l.padded_w, 0.0f);
      }
    });
  };
  flushed_ = l.forEachRun(flushed_, padded_row, out, clear);
}

}  // namespace tiler
