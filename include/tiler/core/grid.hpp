// grid: the sliding-window grid of one image, as MONAI's sliding_window_inference computes it.
// Promise: pure arithmetic, no allocation beyond the per-axis start lists, no LibTorch. Coordinates are
// pixels in the padded image unless a name says otherwise; an image smaller than the window is padded
// symmetrically (before = diff / 2) up to the window size.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tiler {

struct Rect {
  int64_t x = 0, y = 0, w = 0, h = 0;
  int64_t right() const { return x + w; }
  int64_t bottom() const { return y + h; }
  bool operator==(const Rect& o) const { return x == o.x && y == o.y && w == o.w && h == o.h; }
};

// Window size and overlap, per axis. `lattice`: windows start at whole multiples of the stride only, and the
// last column and row reach past the image's right and bottom edges (padded there), as TRIDENT, CLAM and
// WSInfer cut patches, so that level-0 coordinates // patch size name distinct cells; otherwise (MONAI's
// grid) the last window is shifted back to end at the edge.
struct GridSpec {
  int64_t window_w = 256, window_h = 256;
  double overlap_x = 0.25, overlap_y = 0.25;
  bool lattice = false;
};

// Parses "N" or "W,H" (also "WxH"); throws ConfigError.
std::pair<int64_t, int64_t> parseWindowSize(const std::string& text);
// Parses "F" or "FX,FY" into spec's overlaps (each in [0,1)); throws ConfigError.
void parseOverlap(const std::string& text, GridSpec& spec);
// parseWindowSize and parseOverlap together.
GridSpec parseGridSpec(const std::string& window, const std::string& overlap);

// MONAI's interval: int(window * (1 - overlap)) truncated in double, at least 1, and = window when the
// window covers the whole axis.
int64_t axisInterval(int64_t size, int64_t window, double overlap);
// Start offsets along one axis of length `size` (>= window).
std::vector<int64_t> axisStarts(int64_t size, int64_t window, double overlap);
// Lattice starts along one axis of length `size` (any >= 1): 0, stride, 2 stride, ... below `size`, the
// stride being MONAI's interval for an axis longer than the window.
std::vector<int64_t> latticeStarts(int64_t size, int64_t window, double overlap);

// Output scale of a model as an exact ratio num/den with one of them 1 (2 = 2/1, 1/2, 1/4 ...).
struct Scale {
  int64_t num = 1, den = 1;
  double value() const { return double(num) / double(den); }
  int64_t apply(int64_t v) const { return v * num / den; }
  bool operator==(const Scale& o) const { return num == o.num && den == o.den; }
};

// The fewest output pixels two neighbouring windows of one axis share (an axis longer than one window): a
// window of `window` input px at `overlap`, laid out as WindowGrid lays it for `scale`.
int64_t overlapPixels(int64_t window, double overlap, Scale scale);
// The least overlap whose overlapPixels is at least `pixels`; 1 (no overlap can) when `pixels` reaches the
// output window.
double overlapFor(int64_t window, int64_t pixels, Scale scale);

// The windows of one image, in row-major order. For a fractional output scale 1/k the grid is laid out
// at the output's resolution so that every window maps to whole output pixels.
class WindowGrid {
 public:
  WindowGrid() = default;
  WindowGrid(int64_t image_w, int64_t image_h, const GridSpec& spec, Scale scale = {});

  int64_t imageWidth() const { return image_w_; }
  int64_t imageHeight() const { return image_h_; }
  int64_t paddedWidth() const { return padded_w_; }
  int64_t paddedHeight() const { return padded_h_; }
  int64_t padLeft() const { return pad_left_; }
  int64_t padTop() const { return pad_top_; }
  int64_t windowWidth() const { return spec_.window_w; }
  int64_t windowHeight() const { return spec_.window_h; }
  const std::vector<int64_t>& startsX() const { return starts_x_; }
  const std::vector<int64_t>& startsY() const { return starts_y_; }
  int64_t count() const { return int64_t(starts_x_.size() * starts_y_.size()); }
  int64_t columns() const { return int64_t(starts_x_.size()); }

  // Window i in padded-image coordinates.
  Rect window(int64_t i) const;
  // Window i in original-image coordinates (may reach outside the image where it was padded).
  Rect imageWindow(int64_t i) const;
  const Scale& scale() const { return scale_; }

 private:
  int64_t image_w_ = 0, image_h_ = 0, padded_w_ = 0, padded_h_ = 0, pad_left_ = 0, pad_top_ = 0;
  GridSpec spec_;
  Scale scale_;
  std::vector<int64_t> starts_x_, starts_y_;
};

}  // namespace tiler
