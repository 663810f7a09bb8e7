// libFuzzer target for ImageReader: the input bytes become a .png, .jpg or .tif file (by their first bytes)
// that the readers open and read from: OpenCV, libjpeg, libtiff, and OpenSlide for a TIFF that says it is a
// vendor's slide (the corpus holds an Aperio one). Build and run with scripts/fuzz.sh SECONDS.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "read_everything.hpp"
#include "tiler/io/readers/readers.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("OPENCV_IO_MAX_IMAGE_PIXELS", "1048576", 1);  // keep OpenCV's own allocations small
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string base = "/tmp/tiler-fuzz-" + std::to_string(getpid());
  const bool png = size > 0 && data[0] == 0x89, jpeg = size > 1 && data[0] == 0xFF && data[1] == 0xD8;
  const std::string path = base + (png ? ".png" : jpeg ? ".jpg" : ".tif");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  // CI's repeatable run leaves OpenSlide out: it allocates what a JPEG tile's header claims (a fuzzed Aperio
  // tile of 65279x65279 asked malloc for 17 GB), which tiler cannot check without decoding every tile.
  if (std::getenv("TILER_FUZZ_SKIP_OPENSLIDE")) {
    const tiler::ReaderBackend* reader = tiler::identifyReader(tiler::readFileHead(path));
    if (reader != nullptr && (reader->traits & tiler::kWholeSlide)) return 0;
  }
  tiler::fuzz::readEverything(path);
  return 0;
}
