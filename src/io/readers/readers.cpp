#include "tiler/io/readers/readers.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tiff_support.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace fs = std::filesystem;

namespace tiler {

FileProbe probeFile(const std::string& path) {
  FileProbe p;
  p.path = path;
  p.extension = lowerExtension(path);
  // The first bytes, read once for every format's magic.
  const std::string head = leadingBytes(path, 4);  // never waits on a FIFO
  unsigned char magic[4] = {0, 0, 0, 0};
  std::copy(head.begin(), head.end(), magic);
  const size_t got = head.size();
  p.tiff = got == 4 && isTiffMagic(magic);
  p.jpeg = got >= 3 && magic[0] == 0xFF && magic[1] == 0xD8 && magic[2] == 0xFF;
  if (p.tiff || isWholeSlideExtension(path)) p.slide_vendor = slideVendor(path);
  return p;
}

const std::vector<ReaderBackend>& readerBackends() {
  static const std::vector<ReaderBackend> backends = {
      {"openslide", [](const FileProbe& p) { return !p.slide_vendor.empty(); }, openWholeSlide},
      {"tiff", [](const FileProbe& p) { return p.tiff; }, openTiff},
      // A slide extension that neither knows: OpenSlide's own error names the problem.
      {"openslide", [](const FileProbe& p) { return isWholeSlideExtension(p.path); }, openWholeSlide},
      {"jpeg", [](const FileProbe& p) { return p.jpeg && p.extension != ".tif" && p.extension != ".tiff"; },
       openJpeg},
      {"opencv", [](const FileProbe& p) { return p.extension != ".tif" && p.extension != ".tiff"; },
       openWithOpenCv},
  };
  return backends;
}

namespace {

// A remote input is read by libtiff over byte ranges (OpenSlide and the decoders of whole files read local
// files only): a TIFF, BigTIFF, SVS or COG; anything else is refused naming what it is not.
std::unique_ptr<ImageReader> openRemote(const std::string& url) {
  RemoteFile file(url);
  unsigned char magic[4] = {0, 0, 0, 0};
  const int64_t got = file.read(magic, 4);
  TILER_CHECK(got >= 0, IoError, "'" << url << "': " << file.takeError());
  TILER_CHECK(got == 4 && isTiffMagic(magic), IoError,
              "'" << url
                  << "': not a TIFF; remote inputs are read by byte ranges as TIFFs only (tiled TIFF, "
                     "BigTIFF, SVS, COG): download other formats first");
  return openTiff(url);
}

}  // namespace

std::unique_ptr<ImageReader> ImageReader::open(const std::string& path) {
  if (isRemoteInput(path)) return openRemote(path);
  std::error_code ec;
  const fs::file_status target = fs::status(path, ec);
  if (!fs::exists(target) || (ec && target.type() == fs::file_type::none)) {
    std::error_code link_ec;
    TILER_CHECK(!fs::is_symlink(fs::symlink_status(path, link_ec)), IoError,
                "'" << path << "': a symbolic link that leads nowhere (dangling, or a loop)");
    TILER_THROW(IoError, "'" << path << "': no such file");
  }
  TILER_CHECK(!fs::is_directory(target), IoError, "'" << path << "': is a directory");
  // A FIFO would block the first read for ever; a device or socket is no image either.
  TILER_CHECK(fs::is_regular_file(target), IoError,
              "'" << path << "': not a regular file (a FIFO, socket or device); refused");
  TILER_CHECK(access(path.c_str(), R_OK) == 0, IoError,
              "'" << path << "': cannot read: " << std::strerror(errno));
  const FileProbe probe = probeFile(path);
  for (const ReaderBackend& backend : readerBackends())
    if (backend.claims(probe)) return backend.open(path);
  TILER_THROW(IoError, "'" << path << "': not a TIFF (the file does not start with a TIFF header)");
}

}  // namespace tiler
