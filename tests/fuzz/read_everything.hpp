// What the fuzzer and its regression test do with one file: open it as an image and read a few regions.
// Any tiler::Error is a fine answer; a crash, a hang or a sanitizer report is a bug.
#pragma once

#include <algorithm>
#include <string>

#include "tiler/core/error.hpp"
#include "tiler/io/image_io.hpp"

namespace tiler::fuzz {

inline void readEverything(const std::string& path) {
  try {
    auto reader = ImageReader::open(path);
    const ImageInfo& info = reader->info();
    // Regions of at most 256 x 256: the fuzzer hunts for memory errors, not for big allocations.
    const int64_t w = std::min<int64_t>(info.width, 256), h = std::min<int64_t>(info.height, 256);
    reader->readRegion({0, 0, w, h});
    reader->readRegion({info.width - w, info.height - h, w, h});
    reader->readRegion({info.width / 2, info.height / 2, 1, 1});
  } catch (const Error&) {
  }
}

}  // namespace tiler::fuzz
