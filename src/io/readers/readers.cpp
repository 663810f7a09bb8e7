#include "tiler/io/readers/readers.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace fs = std::filesystem;

namespace tiler {

// The rows' functions, each defined in its reader's file; nothing but the rows calls them. Each open throws
// IoError naming the file and the problem.
// tiff_reader.cpp: a TIFF's pages and SubIFDs as levels, local or remote (byte ranges).
bool identifyTiff(const FileHead& head);
std::unique_ptr<ImageReader> openTiff(const std::string& path);
// openslide_reader.cpp: levels, µm/px, objective power and vendor from OpenSlide's properties; RGB u8, with
// transparent regions (outside the scanned area) composited on white. Without OpenSlide it claims the slide
// extensions and fails their images, naming the feature.
bool identifyWholeSlide(const FileHead& head);
std::unique_ptr<ImageReader> openWholeSlide(const std::string& path);
// jpeg_reader.cpp: through libjpeg, so that a warning about corrupt or missing data fails the image, and a
// header that claims more pixels than the file's bytes can hold is refused before decoding.
bool identifyJpeg(const FileHead& head);
std::unique_ptr<ImageReader> openJpeg(const std::string& path);
// opencv_reader.cpp: whatever OpenCV decodes, whole.
bool identifyByOpenCv(const FileHead& head);
std::unique_ptr<ImageReader> openWithOpenCv(const std::string& path);

// memory_reader.cpp: a caller's pixels in memory (registerMemoryImage), read through their strides.
bool identifyMemoryImage(const FileHead& head);
std::unique_ptr<ImageReader> openMemoryImage(const std::string& name);

const std::vector<ReaderBackend>& readerBackends() {
  static const std::vector<ReaderBackend> backends = {
      {"memory", identifyMemoryImage, {}, 0, openMemoryImage},
      {"openslide",
       identifyWholeSlide,
       {".svs", ".ndpi", ".mrxs", ".scn", ".vms", ".vmu", ".bif", ".svslide"},
       kWholeSlide,
       openWholeSlide},
      {"tiff",
       identifyTiff,
       {".tif", ".tiff"},
       kTiffLayout | kTiffTags | kByteRanges | kClaimsItsNames,
       openTiff},
      {"jpeg", identifyJpeg, {".jpg", ".jpeg"}, kDecodedWhole, openJpeg},
      {"opencv",
       identifyByOpenCv,
       {".png", ".bmp", ".webp", ".jp2", ".pbm", ".pgm", ".ppm", ".pnm", ".exr", ".hdr", ".pic", ".sr",
        ".ras", ".pxm"},
       kDecodedWhole,
       openWithOpenCv},
  };
  return backends;
}

bool FileHead::named(const std::vector<std::string>& extensions) const {
  return !extension.empty() && std::find(extensions.begin(), extensions.end(), extension) != extensions.end();
}

FileHead readFileHead(const std::string& path) {
  return {path, lowerExtension(path), leadingBytes(path, kHeadBytes)};
}

const ReaderBackend* identifyReader(const FileHead& head) {
  for (const ReaderBackend& backend : readerBackends())
    if (backend.identify(head) || ((backend.traits & kClaimsItsNames) && head.named(backend.extensions)))
      return &backend;
  return nullptr;
}

bool readerHas(const ImageInfo& info, ReaderTrait trait) {
  for (const ReaderBackend& backend : readerBackends())
    if (info.reader == backend.name) return (backend.traits & trait) != 0;
  return false;
}

namespace {

bool anyRowNames(const std::string& path, unsigned traits) {
  const std::string extension = lowerExtension(path);
  return std::any_of(readerBackends().begin(), readerBackends().end(), [&](const ReaderBackend& backend) {
    return (backend.traits & traits) == traits &&
           std::find(backend.extensions.begin(), backend.extensions.end(), extension) !=
               backend.extensions.end();
  });
}

// A remote input is read by a row that reads byte ranges (OpenSlide and the decoders of whole files read
// local files only), identified by its first bytes; anything else is refused naming what it is not.
std::unique_ptr<ImageReader> openRemote(const std::string& url) {
  RemoteFile file(url);
  std::string bytes(kHeadBytes, '\0');
  const int64_t got = file.read(bytes.data(), bytes.size());
  TILER_CHECK(got >= 0, IoError, "'" << url << "': " << file.takeError());
  bytes.resize(size_t(got));
  const FileHead head{url, "", bytes};
  for (const ReaderBackend& backend : readerBackends())
    if ((backend.traits & kByteRanges) && backend.identify(head)) return backend.open(url);
  TILER_THROW(IoError,
              "'" << url
                  << "': not a TIFF; remote inputs are read by byte ranges as TIFFs only (tiled TIFF, "
                     "BigTIFF, SVS, COG): download other formats first");
}

}  // namespace

bool hasImageExtension(const std::string& path) {
  return anyRowNames(path, 0);
}

bool isWholeSlideExtension(const std::string& path) {
  return anyRowNames(path, kWholeSlide);
}

std::unique_ptr<ImageReader> ImageReader::open(const std::string& path) {
  if (isRemoteInput(path)) return openRemote(path);
  if (isMemoryInput(path)) return openMemoryImage(path);
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
  const ReaderBackend* backend = identifyReader(readFileHead(path));
  TILER_CHECK(backend != nullptr, IoError, "'" << path << "': no reader identifies it as an image");
  return backend->open(path);
}

}  // namespace tiler
