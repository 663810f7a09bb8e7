// The OpenCV backend of the reader registry (readers.hpp): PNG, BMP, WebP and OpenCV's other formats,
// decoded whole at open (OpenCV has no region reads) and shared by every region; the image held whole that
// the JPEG backend decodes too.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <utility>

#include "tiler/core/error.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/readers/readers.hpp"

namespace fs = std::filesystem;

namespace tiler {

void checkOneLevelRegion(const ImageInfo& info, const Rect& r, int level) {
  TILER_CHECK(level == 0, IoError, "'" << info.path << "': no resolution level " << level << " (it has 1)");
  TILER_CHECK(
      r.x >= 0 && r.y >= 0 && r.w > 0 && r.h > 0 && r.right() <= info.width && r.bottom() <= info.height,
      IoError, "'" << info.path << "': region outside the image");
}

namespace {

// An image decoded whole (RGB(A) or grey), shared by every region.
class DecodedImageReader final : public ImageReader {
 public:
  DecodedImageReader(const std::string& path, cv::Mat pixels, const std::string& reader)
      : image_(std::move(pixels)) {
    info_.path = path;
    std::string ext = fs::path(path).extension().string();
    info_.format = ext.empty() ? "unknown" : ext.substr(1);
    std::transform(info_.format.begin(), info_.format.end(), info_.format.begin(), ::tolower);
    info_.width = image_.cols;
    info_.height = image_.rows;
    info_.channels = image_.channels();
    switch (image_.depth()) {
      case CV_8U:
        info_.type = SampleType::kU8;
        break;
      case CV_16U:
        info_.type = SampleType::kU16;
        break;
      case CV_16S:
        info_.type = SampleType::kI16;
        break;
      case CV_32F:
        info_.type = SampleType::kF32;
        break;
      default:
        TILER_THROW(IoError, "'" << path << "': unsupported pixel depth " << image_.depth());
    }
    info_.compression = info_.format;
    info_.reader = reader;
    info_.levels = {{info_.width, info_.height, 1.0}};
  }
  const ImageInfo& info() const override { return info_; }
  size_t cachedBytes() const override { return image_.total() * image_.elemSize(); }
  cv::Mat readRegion(const Rect& r, int level) override {
    checkOneLevelRegion(info_, r, level);
    return image_(cv::Rect(int(r.x), int(r.y), int(r.w), int(r.h))).clone();
  }

 private:
  ImageInfo info_;
  cv::Mat image_;  // decoded once, read-only afterwards: concurrent reads need no lock
};

}  // namespace

std::unique_ptr<ImageReader> decodedImage(const std::string& path, cv::Mat pixels,
                                          const std::string& reader) {
  return std::make_unique<DecodedImageReader>(path, std::move(pixels), reader);
}

// The last row: OpenCV decodes by the bytes, whatever the name, and says when it cannot.
bool identifyByOpenCv(const FileHead&) {
  return true;
}

std::unique_ptr<ImageReader> openWithOpenCv(const std::string& path) {
  errno = 0;
  std::ifstream probe(path, std::ios::binary);
  TILER_CHECK(probe.good(), IoError,
              "'" << path << "': cannot open: " << std::strerror(errno ? errno : ENOENT));
  probe.seekg(0, std::ios::end);
  TILER_CHECK(probe.tellg() > 0, IoError, "'" << path << "': empty file (0 bytes)");
  cv::Mat image;
  try {
    image = cv::imread(path, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& e) {
    TILER_THROW(IoError, "'" << path << "': OpenCV cannot decode it: " << e.what());
  }
  TILER_CHECK(!image.empty(), IoError,
              "'" << path
                  << "': OpenCV cannot decode it (not an image, corrupt, or larger than OpenCV's limit of "
                  << "2^30 pixels; convert large images to tiled TIFF)");
  if (image.channels() == 3) cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  if (image.channels() == 4) cv::cvtColor(image, image, cv::COLOR_BGRA2RGBA);
  return decodedImage(path, std::move(image), "opencv");
}

}  // namespace tiler
