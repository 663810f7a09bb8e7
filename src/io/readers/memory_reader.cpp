// The in-memory backend of the reader registry (readers.hpp): pixels a caller holds (the Python module's
// NumPy arrays) read where they lie, through their strides, so that any axis order (H x W x C, C x H x W) is
// read without a copy of the whole image; a region is copied out as every reader's is.
#include <cstring>
#include <map>
#include <mutex>

#include "tiler/core/error.hpp"
#include "tiler/io/readers/readers.hpp"

namespace tiler {
namespace {

constexpr const char* kMemoryScheme = "memory:";

struct Registry {
  std::mutex mutex;
  std::map<std::string, MemoryPixels> images;
  int64_t next = 0;
};
Registry& registry() {
  static Registry r;
  return r;
}

class MemoryReader final : public ImageReader {
 public:
  MemoryReader(const std::string& name, const MemoryPixels& pixels) : pixels_(pixels) {
    info_.path = name;
    info_.width = pixels.width;
    info_.height = pixels.height;
    info_.channels = pixels.channels;
    info_.type = pixels.type;
    info_.format = "memory";
    info_.compression = "none";
    info_.reader = "memory";
    info_.levels = {{info_.width, info_.height, 1.0}};
  }
  const ImageInfo& info() const override { return info_; }
  size_t cachedBytes() const override { return 0; }  // the caller's pixels, none of ours
  cv::Mat readRegion(const Rect& r, int level) override {
    checkOneLevelRegion(info_, r, level);
    const int C = pixels_.channels;
    const size_t bytes = bytesPerSample(pixels_.type);
    cv::Mat out(int(r.h), int(r.w), CV_MAKETYPE(cvDepthOf(pixels_.type), C));
    const auto* base = static_cast<const unsigned char*>(pixels_.data);
    const bool packed = pixels_.stride_c == int64_t(bytes) && pixels_.stride_x == int64_t(bytes) * C;
    for (int64_t y = 0; y < r.h; ++y) {
      const unsigned char* row = base + (r.y + y) * pixels_.stride_y + r.x * pixels_.stride_x;
      unsigned char* dst = out.ptr<unsigned char>(int(y));
      if (packed) {
        std::memcpy(dst, row, size_t(r.w) * bytes * size_t(C));
        continue;
      }
      for (int64_t x = 0; x < r.w; ++x)
        for (int c = 0; c < C; ++c, dst += bytes)
          std::memcpy(dst, row + x * pixels_.stride_x + c * pixels_.stride_c, bytes);
    }
    return out;
  }

 private:
  MemoryPixels pixels_;
  ImageInfo info_;
};

}  // namespace

// The row's functions (readers.cpp).
bool identifyMemoryImage(const FileHead& head) {
  return isMemoryInput(head.path);
}

std::unique_ptr<ImageReader> openMemoryImage(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.images.find(name);
  TILER_CHECK(it != r.images.end(), IoError, "'" << name << "': no such in-memory image (it was released)");
  return std::make_unique<MemoryReader>(name, it->second);
}

bool isMemoryInput(const std::string& input) {
  return input.compare(0, std::strlen(kMemoryScheme), kMemoryScheme) == 0;
}

std::string registerMemoryImage(const MemoryPixels& pixels, const std::string& stem) {
  TILER_CHECK(pixels.width > 0 && pixels.height > 0 && pixels.channels > 0, ConfigError,
              "an in-memory image of " << pixels.width << " x " << pixels.height << " x " << pixels.channels
                                       << " pixels: every side must be at least 1");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string name = kMemoryScheme + std::to_string(r.next++) + "/" + stem;
  r.images[name] = pixels;
  return name;
}

void unregisterMemoryImage(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.images.erase(name);
}

}  // namespace tiler
