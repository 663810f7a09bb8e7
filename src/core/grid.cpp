#include "tiler/core/grid.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "tiler/core/error.hpp"

namespace tiler {

std::pair<int64_t, int64_t> parseWindowSize(const std::string& text) {
  auto sep = text.find_first_of(",x");
  try {
    size_t used = 0;
    if (sep == std::string::npos) {
      int64_t n = std::stoll(text, &used);
      if (used == text.size() && n > 0) return {n, n};
    } else {
      int64_t w = std::stoll(text.substr(0, sep), &used);
      size_t used2 = 0;
      std::string rest = text.substr(sep + 1);
      int64_t h = std::stoll(rest, &used2);
      if (used == sep && used2 == rest.size() && w > 0 && h > 0) return {w, h};
    }
  } catch (const std::exception&) {
  }
  TILER_THROW(ConfigError, "--window: expected N or W,H with positive integers, got '" << text << "'");
}

void parseOverlap(const std::string& text, GridSpec& spec) {
  auto parse = [&](const std::string& s) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TILER_CHECK(used == s.size() && v >= 0.0 && v < 1.0, ConfigError,
                "--overlap must be F or FX,FY with values in [0,1); got '" << text << "'");
    return v;
  };
  auto comma = text.find(',');
  if (comma == std::string::npos) {
    spec.overlap_x = spec.overlap_y = parse(text);
  } else {
    spec.overlap_x = parse(text.substr(0, comma));
    spec.overlap_y = parse(text.substr(comma + 1));
  }
}

GridSpec parseGridSpec(const std::string& window, const std::string& overlap) {
  GridSpec spec;
  std::tie(spec.window_w, spec.window_h) = parseWindowSize(window);
  parseOverlap(overlap, spec);
  return spec;
}

int64_t axisInterval(int64_t size, int64_t window, double overlap) {
  if (window >= size) return window;
  // Truncation in double, exactly as MONAI's int(window * (1 - overlap)).
  auto interval = static_cast<int64_t>(double(window) * (1.0 - overlap));
  return std::max<int64_t>(interval, 1);
}

std::vector<int64_t> axisStarts(int64_t size, int64_t window, double overlap) {
  TILER_CHECK(window > 0 && size >= window, ConfigError,
              "grid: axis of " << size << " px cannot hold a window of " << window);
  TILER_CHECK(overlap >= 0.0 && overlap < 1.0, ConfigError, "overlap must be in [0,1), got " << overlap);
  int64_t interval = axisInterval(size, window, overlap);
  int64_t count = (size - window + interval - 1) / interval + 1;  // first d with d*interval+window>=size, +1
  std::vector<int64_t> starts(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t start = i * interval;
    starts[size_t(i)] = start - std::max<int64_t>(start + window - size, 0);
  }
  return starts;
}

std::vector<int64_t> latticeStarts(int64_t size, int64_t window, double overlap) {
  TILER_CHECK(window > 0 && size > 0, ConfigError, "grid: axis of " << size << " px, window of " << window);
  TILER_CHECK(overlap >= 0.0 && overlap < 1.0, ConfigError, "overlap must be in [0,1), got " << overlap);
  const int64_t stride = axisInterval(window + 1, window, overlap);
  std::vector<int64_t> starts;
  for (int64_t start = 0; start < size; start += stride) starts.push_back(start);
  return starts;
}

int64_t overlapPixels(int64_t window, double overlap, Scale scale) {
  // A 1/k grid is laid out in output pixels (WindowGrid), any other in input pixels scaled after.
  if (scale.den > 1) {
    const int64_t w = window / scale.den;
    return w - axisInterval(w + 1, w, overlap);
  }
  return scale.apply(window - axisInterval(window + 1, window, overlap));
}

double overlapFor(int64_t window, int64_t pixels, Scale scale) {
  const int64_t unit_window = scale.den > 1 ? window / scale.den : window,
                units = scale.den > 1 ? pixels : (pixels + scale.num - 1) / scale.num;
  if (units >= unit_window) return 1.0;
  // The truncation of window * (1 - overlap) may round a pixel either way: step up until it holds.
  double overlap = double(std::max<int64_t>(units, 0)) / double(unit_window);
  while (overlap < 1.0 && overlapPixels(window, overlap, scale) < pixels)
    overlap = std::nextafter(overlap, 1.0);
  return overlap;
}

WindowGrid::WindowGrid(int64_t image_w, int64_t image_h, const GridSpec& spec, Scale scale)
    : image_w_(image_w), image_h_(image_h), spec_(spec), scale_(scale) {
  TILER_CHECK(image_w > 0 && image_h > 0, ConfigError, "grid: empty image " << image_w << "x" << image_h);
  TILER_CHECK(spec.window_w > 0 && spec.window_h > 0, ConfigError, "grid: window must be positive");
  if (spec.lattice) {
    TILER_CHECK(scale.den == 1 && scale.num == 1, ConfigError,
                "grid: a lattice grid is for per-window models, which have no output scale");
    // No padding before the image: window starts are image coordinates; the last ones reach past its end.
    starts_x_ = latticeStarts(image_w, spec.window_w, spec.overlap_x);
    starts_y_ = latticeStarts(image_h, spec.window_h, spec.overlap_y);
    padded_w_ = starts_x_.back() + spec.window_w;
    padded_h_ = starts_y_.back() + spec.window_h;
    return;
  }
  padded_w_ = std::max(image_w, spec.window_w);
  padded_h_ = std::max(image_h, spec.window_h);
  pad_left_ = (padded_w_ - image_w) / 2;
  pad_top_ = (padded_h_ - image_h) / 2;
  if (scale.den > 1) {
    // Lay the grid out in output pixels so each window maps to whole output pixels; the last window may
    // then reach up to den-1 input pixels past the border, which padding fills.
    const int64_t k = scale.den;
    TILER_CHECK(spec.window_w % k == 0 && spec.window_h % k == 0, ConfigError,
                "grid: window " << spec.window_w << "x" << spec.window_h
                                << " is not divisible by the model's "
                                << "downscale factor " << k);
    auto scaled = [k](int64_t size, int64_t window, double overlap) {
      auto out = axisStarts((size + k - 1) / k, window / k, overlap);
      for (auto& s : out) s *= k;
      return out;
    };
    padded_w_ = std::max((image_w + k - 1) / k * k, spec.window_w);
    padded_h_ = std::max((image_h + k - 1) / k * k, spec.window_h);
    pad_left_ = image_w < spec.window_w ? (padded_w_ - image_w) / 2 / k * k : 0;
    pad_top_ = image_h < spec.window_h ? (padded_h_ - image_h) / 2 / k * k : 0;
    starts_x_ = scaled(padded_w_, spec.window_w, spec.overlap_x);
    starts_y_ = scaled(padded_h_, spec.window_h, spec.overlap_y);
  } else {
    starts_x_ = axisStarts(padded_w_, spec.window_w, spec.overlap_x);
    starts_y_ = axisStarts(padded_h_, spec.window_h, spec.overlap_y);
  }
}

Rect WindowGrid::window(int64_t i) const {
  int64_t cols = columns();
  return Rect{starts_x_[size_t(i % cols)], starts_y_[size_t(i / cols)], spec_.window_w, spec_.window_h};
}

Rect WindowGrid::imageWindow(int64_t i) const {
  Rect r = window(i);
  r.x -= pad_left_;
  r.y -= pad_top_;
  return r;
}

}  // namespace tiler
