// image_statistics: the statistics of one catalog image that a card's statistics steps read, of the values
// the model is fed (its channels as the loader adapts them, before tiler's scale), over the whole image at
// its processing resolution (the level and resampling its windows are cut from; never a window's: windows of
// one image are normalised alike, or seams appear). Read in bands of whole rows of at most `band_bytes` as
// floats, never the whole image; one pass for 8- and 16-bit images (exact percentiles), two for any other
// (its range, then a histogram: percentiles within (max - min) / kFloatBins). Deterministic: any rank that
// gathers an image's statistics gets the same numbers.
#pragma once

#include <cstdint>
#include <vector>

#include "tiler/core/processing.hpp"
#include "tiler/io/catalog.hpp"

namespace tiler {

ImageStatistics gatherImageStatistics(const CatalogImage& img, int model_channels,
                                      const std::vector<double>& percentiles,
                                      int64_t band_bytes = int64_t(64) << 20);

}  // namespace tiler
