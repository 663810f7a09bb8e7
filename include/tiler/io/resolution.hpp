// resolution: images at the resolution a model was trained for: the choice of level and target resolution
// (--level, --mpp, --magnification, --input_mpp, --no_upsample), and the reader that shows an image (any
// backend's, see readers.hpp) at its processing resolution: a level as it is, or a level resampled by area
// (one rule both ways: a processing pixel is the area-weighted mean of the level pixels it covers, which
// for a target finer than level 0 is the one or two level pixels under it along each axis).
// Promise: a region read at the processing resolution holds the same pixels wherever it lies (each
// processing pixel's weights depend on its own position only), so resampled windows tile exactly and every
// world size writes the same bytes.
// No LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tiler/io/image_io.hpp"

namespace tiler {

struct ResolutionSpec {
  int level = -1;            // --level: this level as it is
  double mpp = 0;            // --mpp: micrometres per processing pixel
  double magnification = 0;  // --magnification: the objective power to process at (20 = "20x")
  double input_mpp = 0;      // --input_mpp: every source's level-0 µm/px, over its metadata
  bool upsample = false;     // a target finer than level 0 is level 0 upsampled (else refused)
  bool chosen() const { return level >= 0 || mpp > 0 || magnification > 0; }
};

// A slide that states no objective power: X-times magnification is 10/X µm/px (40x 0.25, 20x 0.5).
constexpr double kMicrometresAtUnitMagnification = 10.0;
// A level within 1% of the target counts as the target (scanners round level sizes, so a "2x" level of an
// odd-sized slide has a downsample of 2.0003).
constexpr double kResolutionTolerance = 0.01;

struct ProcessingResolution {
  int level = 0;                     // the level read
  double factor = 1.0;               // that level's pixels per processing pixel (1: the level as it is)
  double downsample = 1.0;           // level-0 pixels per processing pixel
  int64_t width = 0, height = 0;     // the image at the processing resolution
  std::optional<double> mpp;         // processing µm/px, when level 0's is known
  std::optional<double> source_mpp;  // level 0's µm/px (metadata or --input_mpp)
  bool native() const { return level == 0 && factor == 1.0; }
  // Processing pixels per level-0 pixel where the target is finer than level 0 (> 1), else 1.
  double upsampleFactor() const { return downsample < 1.0 ? 1.0 / downsample : 1.0; }
};

// The processing resolution of the image `info` describes (its level 0 and levels) for `spec`: --level as
// it is; --mpp / --magnification from the coarsest level at least as fine as the target, resampled when no
// level is within kResolutionTolerance of it; level 0 upsampled for a target finer than level 0 (with
// spec.upsample); level 0 otherwise. Throws IoError naming the image when it cannot be met: no such level,
// no resolution metadata to go by, or a target finer than level 0 without spec.upsample.
ProcessingResolution chooseResolution(const ImageInfo& info, const ResolutionSpec& spec);
// The warning a run gives for `image` read at `resolution` where that upsamples level 0 (the image's µm/px,
// the target's and the factor; infer and finetune alike), else empty.
std::string upsampleWarning(const std::string& image, const ProcessingResolution& resolution);

// `source` seen at `resolution` (the source itself when native): info() is the source's with the processing
// width and height; regions are processing pixels. The second form does not own `source`.
std::unique_ptr<ImageReader> atResolution(std::unique_ptr<ImageReader> source,
                                          const ProcessingResolution& resolution);
std::unique_ptr<ImageReader> viewAtResolution(ImageReader& source, const ProcessingResolution& resolution);

// One axis of a grid of output pixels over a level: pixel i (start <= i < start + count) covers the level's
// [origin + i*factor, origin + (i+1)*factor), clipped to the level.
struct AreaAxis {
  double origin = 0;
  double factor = 1;
  int64_t start = 0, count = 0;
};
// Level `level` of `source` resampled by area onto the grid `x` by `y`: each output pixel the area-weighted
// mean of the level pixels it covers, in the source's sample type. atResolution's rule (its grid has origin
// 0), for a grid at any origin and a scale per axis (the viewer's IIIF regions).
cv::Mat readByArea(ImageReader& source, int level, const AreaAxis& x, const AreaAxis& y);

// The coarsest level whose longer side still has `min_side` pixels (level 0 when none has): what a
// low-resolution overview (the tissue mask) reads.
int overviewLevel(const ImageInfo& info, int min_side);

}  // namespace tiler
