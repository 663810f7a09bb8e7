// readers: which backend reads a file, and what the code above the readers may ask of one. Like libvips'
// loaders, each backend is a row of readerBackends(): its name, how it identifies its files from one shared
// FileHead (the first bytes, read once per file, and the name), the extensions it reads (directory
// discovery lists exactly those), the traits other code asks about instead of its name, and its `open`.
// ImageReader::open gives a file to the first row that identifies it: OpenSlide for the vendor formats it
// knows (whatever the extension) and for a slide extension that is no TIFF (its own error says why it
// cannot read it), libtiff for any other TIFF (even named .svs) and for a .tif/.tiff, which it refuses when
// it is not one, libjpeg for a JPEG, OpenCV for the rest; an in-memory image (memory:...) by its name alone.
// A remote input (remote_input.hpp) is identified by its bytes alone, by the rows that read byte ranges
// (libtiff), and refused otherwise. Adding a reader is a file of its own and a row here (docs/design.md). No
// LibTorch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tiler/io/image_io.hpp"

namespace tiler {

// What a row identifies a file by.
struct FileHead {
  std::string path;
  std::string extension;  // lower case, with its dot; "" for a remote input (a server's name is not asked)
  std::string bytes;      // the first kHeadBytes bytes, fewer when the file is shorter
  bool startsWith(const std::string& magic) const { return bytes.compare(0, magic.size(), magic) == 0; }
  bool named(const std::vector<std::string>& extensions) const;
};
constexpr size_t kHeadBytes = 64;
// The head of a local file, through leadingBytes (never waits on a FIFO).
FileHead readFileHead(const std::string& path);

// What code above the readers asks of an image's reader (readerHas), rather than comparing its name.
enum ReaderTrait : unsigned {
  // A vendor whole slide through OpenSlide, whose decoders can end the process: a slide a killed run was
  // reading is read whole in a probe process first (probeSlideInChildProcess). Its extensions are
  // isWholeSlideExtension's.
  kWholeSlide = 1u << 0,
  // ImageInfo's TIFF layout (tiling or strips, compression, pages, BigTIFF) describes the file.
  kTiffLayout = 1u << 1,
  // Its TIFF tags (resolution, GeoTIFF georeferencing) are the outputs' to copy, and say its CRS.
  kTiffTags = 1u << 2,
  // Decoded whole when opened, by a codec that ImageInfo's `format` names.
  kDecodedWhole = 1u << 3,
  // Reads a remote input (a URL) by byte ranges.
  kByteRanges = 1u << 4,
  // A local file bearing one of its extensions is its, whatever the bytes (once no earlier row identified
  // it): its open refuses one it cannot read, naming why, rather than a later row reading it as something
  // else.
  kClaimsItsNames = 1u << 5,
};

struct ReaderBackend {
  const char* name;                        // the report's `reader`, and ImageInfo's
  bool (*identify)(const FileHead& head);  // the file is this row's to read (asked in the rows' order)
  std::vector<std::string> extensions;     // the names it reads, lower case with their dot
  unsigned traits;                         // ReaderTrait bits
  std::unique_ptr<ImageReader> (*open)(const std::string& path);
};
// In the order ImageReader::open asks them.
const std::vector<ReaderBackend>& readerBackends();
// The first row that identifies `head`'s file or, with kClaimsItsNames, bears its name; null when none does.
const ReaderBackend* identifyReader(const FileHead& head);
// Whether the reader that opened `info`'s image has `trait` (false for an image no reader opened).
bool readerHas(const ImageInfo& info, ReaderTrait trait);

// An extension some row reads: what directory discovery lists.
bool hasImageExtension(const std::string& path);
// An extension of a kWholeSlide row (.svs .ndpi .mrxs .scn .vms .vmu .bif .svslide).
bool isWholeSlideExtension(const std::string& path);

// Pixels a caller holds in memory (the Python module's NumPy arrays), as the in-memory row reads them: sample
// (y, x, c) at data + y * stride_y + x * stride_x + c * stride_c (bytes), colour RGB(A) or grey as a file's.
struct MemoryPixels {
  const void* data = nullptr;
  SampleType type = SampleType::kU8;
  int64_t width = 0, height = 0;
  int channels = 0;
  int64_t stride_y = 0, stride_x = 0, stride_c = 0;
};
// Makes `pixels` an input, named "memory:<n>/<stem>" (its outputs' stem is `stem`), until unregistered; the
// caller keeps them alive and unchanged until then. ConfigError for an empty image.
std::string registerMemoryImage(const MemoryPixels& pixels, const std::string& stem);
void unregisterMemoryImage(const std::string& name);
// The input names a registered in-memory image ("memory:..."): never a file, whatever is on the disk.
bool isMemoryInput(const std::string& input);

// An image decoded whole (`pixels`: HWC, RGB(A) or grey) as a reader of its regions; `reader` is the
// report's name for the backend (opencv_reader.cpp; the decoders of whole files share it).
std::unique_ptr<ImageReader> decodedImage(const std::string& path, cv::Mat pixels, const std::string& reader);
// Throws an IoError naming the image unless `region` lies inside level `level` of `info`'s image, which has
// one level (the decoded-whole and in-memory readers').
void checkOneLevelRegion(const ImageInfo& info, const Rect& region, int level);
// Opens `path` with OpenSlide and reads a corner of each level in a child process, once per file and
// process (the OpenSlide reader does so first): a slide that makes OpenSlide end the process (a GLib abort,
// a crash in a decoder) throws an IoError naming it and the signal, and only the child is lost. Errors
// OpenSlide reports are left to the real open. kEveryTile reads every pixel of every level there instead (a
// slide a killed run was reading, see catalog.hpp), and an error OpenSlide reports on the way fails it too.
enum class SlideProbe { kCorners, kEveryTile };
void probeSlideInChildProcess(const std::string& path, SlideProbe depth = SlideProbe::kCorners);
// OpenSlide's vendor for `path` ("aperio", "hamamatsu", ...), or "" when OpenSlide does not know the file or
// knows it only as "generic-tiff" (plain TIFFs stay with tiler's libtiff reader).
std::string slideVendor(const std::string& path);

}  // namespace tiler
