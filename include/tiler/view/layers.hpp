// view/layers: what `tiler view` draws of one raster (a job's input, its labels, a class of its
// probabilities): a IIIF request's region read from the pyramid level nearest its scale and turned into RGBA.
// The input and the probabilities are resampled by area (resolution's readByArea: the rule --mpp reads by);
// labels take the level pixel under each output pixel's centre (a mean of class ids is no class) and are
// coloured by the labels TIFF's own palette; probabilities go through kHeatmapStops. Thread safe, as the
// readers are. No LibTorch.
#pragma once

#include <array>
#include <memory>
#include <opencv2/core.hpp>
#include <string>
#include <vector>

#include "tiler/io/image_io.hpp"
#include "tiler/view/iiif.hpp"

namespace tiler {

// kGrid: a classifier's heatmap, a pixel a grid window, coloured as scores but sampled as labels are.
enum class LayerKind { kImage, kLabels, kScores, kGrid };

// The heatmap's colour map: a value in [0, 1] is interpolated between these stops (value, R, G, B); the
// page's legend draws the same stops.
struct HeatmapStop {
  double value;
  uint8_t r, g, b;
};
const std::vector<HeatmapStop>& heatmapStops();
std::array<uint8_t, 3> heatmapColor(double value);

class RasterLayer {
 public:
  // Opens `path` through tiler's readers; throws IoError naming it.
  RasterLayer(const std::string& path, LayerKind kind);
  const ImageInfo& info() const { return reader_->info(); }
  LayerKind kind() const { return kind_; }
  // The level a request of `scale` level-0 pixels per output pixel reads: the coarsest at least as fine.
  int levelFor(double scale) const;
  // The request's pixels as RGBA (u8, 4 channels, request.height x request.width); `band` is the class of
  // a scores layer (ignored otherwise). Throws RequestError for a band the image lacks.
  cv::Mat render(const IiifRequest& request, int band);
  // The samples of the request as read (before colouring), in the file's type: what the tests compare.
  cv::Mat sample(const IiifRequest& request);

 private:
  std::unique_ptr<ImageReader> reader_;
  LayerKind kind_;
  double low_ = 0, high_ = 255;  // kImage: the range mapped to 0..255 (8-bit: 0..255)
};

}  // namespace tiler
