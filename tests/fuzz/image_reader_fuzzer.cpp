// libFuzzer target for ImageReader: the input bytes become a .tif or .png file (by their first byte) that the
// reader opens and reads from. Build and run with scripts/fuzz.sh SECONDS.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "read_everything.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("OPENCV_IO_MAX_IMAGE_PIXELS", "1048576", 1);  // keep OpenCV's own allocations small
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string base = "/tmp/tiler-fuzz-" + std::to_string(getpid());
  const std::string path = base + (size > 0 && data[0] == 0x89 ? ".png" : ".tif");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  tiler::fuzz::readEverything(path);
  return 0;
}
