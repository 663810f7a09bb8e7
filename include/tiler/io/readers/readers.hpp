// readers: which backend reads a file. Like libvips' loaders, each backend says which files it claims,
// from what their first bytes and name show (FileProbe), and ImageReader::open asks the backends in order:
// OpenSlide for the vendor formats it knows (whatever the extension), libtiff for any other TIFF (even named
// .svs), OpenSlide again for a slide extension that is not a TIFF (it says why it cannot read it), libjpeg
// for a JPEG, OpenCV for the rest; a file named .tif/.tiff that is not a TIFF is refused. A remote input
// (remote_input.hpp) goes to libtiff over byte ranges when it is a TIFF, and is refused otherwise. Adding a
// reader is a row of readerBackends() and a file of its own (docs/design.md). No LibTorch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tiler/io/image_io.hpp"

namespace tiler {

// What a backend decides by. `slide_vendor` is asked of OpenSlide only for TIFFs and slide extensions.
struct FileProbe {
  std::string path;
  std::string extension;     // lower case, with its dot
  bool tiff = false;         // starts with a TIFF or BigTIFF header
  bool jpeg = false;         // starts with a JPEG start-of-image marker (FF D8 FF)
  std::string slide_vendor;  // slideVendor(path), or ""
};
FileProbe probeFile(const std::string& path);

struct ReaderBackend {
  const char* name;  // the report's `reader`
  bool (*claims)(const FileProbe& probe);
  std::unique_ptr<ImageReader> (*open)(const std::string& path);
};
// In the order ImageReader::open asks them.
const std::vector<ReaderBackend>& readerBackends();

// The backends, each in a file of its own. Each throws IoError naming the file and the problem.
std::unique_ptr<ImageReader> openTiff(const std::string& path);        // tiff_reader.cpp
std::unique_ptr<ImageReader> openWithOpenCv(const std::string& path);  // opencv_reader.cpp
// jpeg_reader.cpp: through libjpeg, so that a warning about corrupt or missing data fails the image, and a
// header that claims more pixels than the file's bytes can hold is refused before decoding.
std::unique_ptr<ImageReader> openJpeg(const std::string& path);
// An image decoded whole (`pixels`: HWC, RGB(A) or grey) as a reader of its regions; `reader` is the
// report's name for the backend (opencv_reader.cpp).
std::unique_ptr<ImageReader> decodedImage(const std::string& path, cv::Mat pixels, const std::string& reader);
// openslide_reader.cpp: levels, µm/px, objective power and vendor from OpenSlide's properties; RGB u8, with
// transparent regions (outside the scanned area) composited on white.
std::unique_ptr<ImageReader> openWholeSlide(const std::string& path);
// Opens `path` with OpenSlide and reads a corner of each level in a child process, once per file and
// process (openWholeSlide does so first): a slide that makes OpenSlide end the process (a GLib abort, a crash
// in a decoder) throws an IoError naming it and the signal, and only the child is lost. Errors OpenSlide
// reports are left to the real open. kEveryTile reads every pixel of every level there instead (a slide a
// killed run was reading, see catalog.hpp), and an error OpenSlide reports on the way fails it too.
enum class SlideProbe { kCorners, kEveryTile };
void probeSlideInChildProcess(const std::string& path, SlideProbe depth = SlideProbe::kCorners);
// OpenSlide's vendor for `path` ("aperio", "hamamatsu", ...), or "" when OpenSlide does not know the file or
// knows it only as "generic-tiff" (plain TIFFs stay with tiler's libtiff reader).
std::string slideVendor(const std::string& path);

}  // namespace tiler
