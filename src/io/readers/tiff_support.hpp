// tiff_support: what tiler's TIFF reader and writer share over libtiff: its error and warning handlers, the
// GeoTIFF and GDAL tags, the resolution and georeferencing metadata, and the bounds a decoded chunk must
// keep. Internal to the io floor (it names libtiff's types); the public interface is image_io.hpp. No
// LibTorch.
#pragma once

#include <tiffio.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tiler {

// GeoTIFF tags and GDAL's, unknown to libtiff: installTiffHandlers() registers them as ordinary fields.
constexpr ttag_t kModelPixelScale = 33550, kModelTiepoint = 33922, kModelTransformation = 34264,
                 kGeoKeyDirectory = 34735, kGeoDoubleParams = 34736, kGeoAsciiParams = 34737,
                 kGdalMetadata = 42112, kGdalNodata = 42113;

// libtiff's errors collect per thread for takeTiffError(), its warnings go to the debug log; the tags above
// are registered (once per process). Call it before any libtiff call.
void installTiffHandlers();
// Forgets this thread's collected libtiff errors (before a call whose failure takeTiffError() will name), and
// sets our handlers again, should another library's have replaced them.
void clearTiffError();
// This thread's libtiff errors since the last clear ("unknown libtiff error" when none), cleared.
std::string takeTiffError();
std::string compressionName(uint16_t compression);
// The file starts with a classic or BigTIFF header.
bool looksLikeTiff(const std::string& path);
// The same test on a file's first bytes, for a caller that has read them already.
bool isTiffMagic(const std::string& head);

// Inputs are read with read(2), not memory-mapped ("m"): mapped pages of the input count in the process's
// resident memory (time -v, top, Slurm's accounting) though they are the file's, and each tile is read once.
constexpr const char* kTiffReadMode = "rm";

// Opens the TIFF at `path` for reading: a local file with read(2) (kTiffReadMode), a remote input
// (isRemoteInput) by byte ranges through a RemoteFile that libtiff reads as its client (TIFFClientOpen), so
// every page, level and tile is read the same way wherever the file is. nullptr when libtiff cannot read
// it (takeTiffError() says why, naming the URL when the server cut a read short); throws IoError when a
// remote input cannot be opened at all.
TIFF* openTiffForReading(const std::string& path);
// The size in bytes of the file `tif` reads, local or remote.
uint64_t tiffFileSize(TIFF* tif);

struct TiffMetadata {
  bool has_resolution = false;
  float xres = 0, yres = 0;
  uint16_t res_unit = RESUNIT_NONE;
  std::vector<double> pixel_scale, tiepoint, transformation, double_params;
  std::vector<uint16_t> key_directory;
  std::string ascii_params;
};
TiffMetadata readMetadata(TIFF* tif);
// The first page's metadata; empty for a path that is "" or not a readable TIFF.
TiffMetadata readMetadata(const std::string& path);
// The least X/YResolution in pixels per inch taken as a physical size: below it (72, 96, 300 dpi) it is a
// writer's default, and the µm/px is unknown, as OpenSlide reports it.
constexpr double kLeastScanDpi = 1000;
// Micrometres per pixel (x) that the tags state: a projected GeoTIFF in metres first, then X/YResolution
// in centimetres, or in inches from kLeastScanDpi.
std::optional<double> micrometresPerPixel(const TiffMetadata& m);
// Writes `m` for output pixels that are 1/s input pixels (resolution up by s, ground size per pixel down by
// s), or at `mpp` when given.
void writeMetadata(TIFF* tif, TiffMetadata m, double s, std::optional<double> mpp);

// Checks every page of the TIFF at `path` the way a third-party decoder (OpenSlide) would trust it: each
// page's tile or strip table must have one entry per chunk, and every chunk must lie inside the file (a
// TileByteCounts retyped LONG8 made OpenSlide ask GLib for 63 TB and abort the process). Throws IoError
// naming the file, the page and the chunk.
void checkTiffChunkTables(const std::string& path);

// Largest decoded tile or strip we agree to hold; a header claiming more is absurd or needs re-saving.
constexpr uint64_t kMaxChunkBytes = uint64_t(1) << 30;
// The most `compression` can expand its stored bytes (see tiff_support.cpp).
uint64_t maxExpansion(uint16_t compression);
// The libjpeg messages about corrupt data (premature end, corrupt segments) that libtiff's JPEG codec passed
// on as warnings on this thread since the last clearTiffError(), cleared; "" when none. A tile they concern
// decoded to wrong pixels, so its read fails like any other corrupt chunk.
std::string takeTiffCorruptionWarning();
// Counts one decoded tile or strip for tiffChunksDecoded(). Thread safe.
void countDecodedChunk();

}  // namespace tiler
