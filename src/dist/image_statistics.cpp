#include "tiler/dist/image_statistics.hpp"

#include <algorithm>
#include <opencv2/core.hpp>

#include "tiler/core/error.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/io/resolution.hpp"

namespace tiler {

ImageStatistics gatherImageStatistics(const CatalogImage& img, int model_channels,
                                      const std::vector<double>& percentiles, int64_t band_bytes) {
  auto reader = atResolution(ImageReader::open(img.input), img.resolution);
  const int64_t width = reader->info().width, height = reader->info().height;
  const int64_t row_bytes = std::max<int64_t>(1, width * model_channels * int64_t(sizeof(float)));
  const int64_t rows = std::clamp<int64_t>(band_bytes / row_bytes, 1, std::max<int64_t>(height, 1));
  // 8- and 16-bit samples (palette colours too) are integers of 16 bits at most: a histogram of every value.
  const bool exact = img.info.type == SampleType::kU8 || img.info.type == SampleType::kU16;
  StatisticsGatherer gatherer(model_channels, exact, percentiles);
  std::vector<float> band(size_t(rows * width * model_channels));
  for (int pass = exact ? 1 : 0; pass < 2; ++pass) {
    for (int64_t y = 0; y < height; y += rows) {
      const int64_t h = std::min(rows, height - y);
      cv::Mat region = reader->readRegion(Rect{0, y, width, h});
      if (!img.channels.empty()) {
        cv::Mat chosen(region.rows, region.cols, CV_MAKETYPE(region.depth(), int(img.channels.size())));
        std::vector<int> from_to;
        for (size_t k = 0; k < img.channels.size(); ++k)
          from_to.push_back(img.channels[k]), from_to.push_back(int(k));
        cv::mixChannels(&region, 1, &chosen, 1, from_to.data(), img.channels.size());
        region = chosen;
      }
      windowToModelInput(region, img.adapt, band.data(), img.info.colormap.get());
      const int64_t plane = h * width;
      for (int c = 0; c < model_channels; ++c) {
        const float* values = band.data() + size_t(c) * size_t(plane);
        if (pass == 0)
          gatherer.addRange(c, values, plane);
        else
          gatherer.add(c, values, plane);
      }
    }
  }
  ImageStatistics statistics = gatherer.finish();
  // A channel of NaN alone (a nodata band) has no mean, std or percentile to normalise it by.
  for (size_t c = 0; c < statistics.channels.size(); ++c)
    TILER_CHECK(
        statistics.channels[c].count > 0, IoError,
        "'" << img.input << "': the model's input channel " << c
            << " holds no number (every value NaN): the card's statistics steps have nothing to go by");
  return statistics;
}

}  // namespace tiler
