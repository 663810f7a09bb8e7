#include "tiff_support.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <utility>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace tiler {
namespace {

// ---- libtiff's handlers become exceptions (errors) and debug lines (warnings) ----------------------------

thread_local std::string t_tiff_error;     // this thread's libtiff errors since the last clear
std::atomic<int64_t> g_chunks_decoded{0};  // tiffChunksDecoded()

void tiffErrorHandler(const char* module, const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (!t_tiff_error.empty()) t_tiff_error += "; ";
  t_tiff_error += module ? std::string(module) + ": " + buf : std::string(buf);
}

thread_local std::string t_tiff_corruption;  // takeTiffCorruptionWarning()

void tiffWarningHandler(const char* module, const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  spdlog::debug("libtiff warning: {}: {}", module ? module : "", buf);
  // libjpeg's warnings about the data (JWRN_HIT_MARKER, JWRN_JPEG_EOF, JWRN_EXTRANEOUS_DATA, ...): libjpeg
  // filled the rest of the tile with grey and went on.
  const std::string text = buf;
  if (text.find("Corrupt JPEG data") != std::string::npos ||
      text.find("Premature end of JPEG") != std::string::npos)
    t_tiff_corruption = text;
}

const TIFFFieldInfo kGeoFields[] = {
    {kModelPixelScale, -1, -1, TIFF_DOUBLE, FIELD_CUSTOM, 1, 1, const_cast<char*>("ModelPixelScaleTag")},
    {kModelTiepoint, -1, -1, TIFF_DOUBLE, FIELD_CUSTOM, 1, 1, const_cast<char*>("ModelTiepointTag")},
    {kModelTransformation, -1, -1, TIFF_DOUBLE, FIELD_CUSTOM, 1, 1,
     const_cast<char*>("ModelTransformationTag")},
    {kGeoKeyDirectory, -1, -1, TIFF_SHORT, FIELD_CUSTOM, 1, 1, const_cast<char*>("GeoKeyDirectoryTag")},
    {kGeoDoubleParams, -1, -1, TIFF_DOUBLE, FIELD_CUSTOM, 1, 1, const_cast<char*>("GeoDoubleParamsTag")},
    {kGeoAsciiParams, -1, -1, TIFF_ASCII, FIELD_CUSTOM, 1, 0, const_cast<char*>("GeoASCIIParamsTag")},
    {kGdalMetadata, -1, -1, TIFF_ASCII, FIELD_CUSTOM, 1, 0, const_cast<char*>("GDALMetadataTag")},
    {kGdalNodata, -1, -1, TIFF_ASCII, FIELD_CUSTOM, 1, 0, const_cast<char*>("GDALNoDataTag")},
};

TIFFExtendProc g_parent_extender = nullptr;

void geoTagExtender(TIFF* tif) {
  TIFFMergeFieldInfo(tif, kGeoFields, sizeof(kGeoFields) / sizeof(kGeoFields[0]));
  if (g_parent_extender) g_parent_extender(tif);
}

template <typename T>
std::vector<T> getArray(TIFF* tif, ttag_t tag) {
  uint16_t count = 0;
  T* data = nullptr;
  if (TIFFGetField(tif, tag, &count, &data) && data != nullptr) return std::vector<T>(data, data + count);
  return {};
}

// GeoKeys: GTModelTypeGeoKey 1024 (1 = projected), ProjLinearUnitsGeoKey 3076 (9001 = metre).
std::optional<uint16_t> geoKey(const std::vector<uint16_t>& directory, uint16_t key) {
  for (size_t i = 4; i + 3 < directory.size(); i += 4)
    if (directory[i] == key && directory[i + 1] == 0) return directory[i + 3];
  return std::nullopt;
}

// libtiff's client procedures over a RemoteFile: a read the server cuts short is libtiff's read error, with
// the URL and the cause as the error libtiff's message follows.
tmsize_t remoteRead(thandle_t handle, void* data, tmsize_t n) {
  auto* file = static_cast<RemoteFile*>(handle);
  const int64_t got = file->read(data, size_t(n));
  if (got < 0) TIFFErrorExt(handle, file->url().c_str(), "%s", file->takeError().c_str());
  return tmsize_t(got);
}

tmsize_t remoteWrite(thandle_t, void*, tmsize_t) {
  return -1;
}

toff_t remoteSeek(thandle_t handle, toff_t offset, int whence) {
  auto* file = static_cast<RemoteFile*>(handle);
  const uint64_t base = whence == SEEK_CUR ? file->position() : whence == SEEK_END ? file->size() : 0;
  file->seek(base + offset);
  return file->position();
}

int remoteClose(thandle_t handle) {
  delete static_cast<RemoteFile*>(handle);
  return 0;
}

toff_t remoteSize(thandle_t handle) {
  return static_cast<RemoteFile*>(handle)->size();
}

int noMapping(thandle_t, void**, toff_t*) {
  return 0;
}

void noUnmapping(thandle_t, void*, toff_t) {}

}  // namespace

TIFF* openTiffForReading(const std::string& path) {
  if (!isRemoteInput(path)) return TIFFOpen(path.c_str(), kTiffReadMode);
  auto file = std::make_unique<RemoteFile>(path);
  // Once open, the TIFF closes its client (remoteClose); a failed open leaves it to us, as TIFFOpen does.
  TIFF* tif = TIFFClientOpen(path.c_str(), kTiffReadMode, file.get(), remoteRead, remoteWrite, remoteSeek,
                             remoteClose, remoteSize, noMapping, noUnmapping);
  if (tif != nullptr) file.release();
  return tif;
}

uint64_t tiffFileSize(TIFF* tif) {
  return TIFFGetSizeProc(tif)(TIFFClientdata(tif));
}

void installTiffHandlers() {
  // libtiff's handlers are the process's: OpenCV's TIFF codec sets its own at every TIFF it reads or writes
  // (one under another extension, through the opencv reader), and libtiff's errors and corrupt-tile warnings
  // would go to its log from then on. Ours are set again before each call whose failure we name (a store of
  // the same two pointers; setting OpenCV's first, once, does not hold: it sets them again).
  TIFFSetErrorHandler(tiffErrorHandler);
  TIFFSetWarningHandler(tiffWarningHandler);
  static std::once_flag once;
  std::call_once(once, [] { g_parent_extender = TIFFSetTagExtender(geoTagExtender); });
}

void clearTiffError() {
  installTiffHandlers();
  t_tiff_error.clear();
  t_tiff_corruption.clear();
}

std::string takeTiffError() {
  std::string e = t_tiff_error.empty() ? "unknown libtiff error" : t_tiff_error;
  t_tiff_error.clear();
  return e;
}

std::string compressionName(uint16_t c) {
  switch (c) {
    case COMPRESSION_NONE:
      return "none";
    case COMPRESSION_LZW:
      return "lzw";
    case COMPRESSION_ADOBE_DEFLATE:
    case COMPRESSION_DEFLATE:
      return "deflate";
    case COMPRESSION_JPEG:
      return "jpeg";
    case COMPRESSION_OJPEG:
      return "ojpeg";
    case COMPRESSION_PACKBITS:
      return "packbits";
    case COMPRESSION_ZSTD:
      return "zstd";
    case COMPRESSION_LZMA:
      return "lzma";
    case COMPRESSION_WEBP:
      return "webp";
    case COMPRESSION_CCITTFAX3:
      return "ccitt-g3";
    case COMPRESSION_CCITTFAX4:
      return "ccitt-g4";
    default:
      return "code " + std::to_string(c);
  }
}

// The fields of one image directory (full or reduced resolution): size, samples, tiling, compression,
// palette.
bool looksLikeTiff(const std::string& path) {
  return isTiffMagic(leadingBytes(path, 4));
}

bool isTiffMagic(const std::string& head) {
  return head.size() >= 4 && (head.compare(0, 4, "II*\0", 4) == 0 || head.compare(0, 4, "II+\0", 4) == 0 ||
                              head.compare(0, 4, "MM\0*", 4) == 0 || head.compare(0, 4, "MM\0+", 4) == 0);
}

TiffMetadata readMetadata(TIFF* tif) {
  TiffMetadata m;
  m.has_resolution =
      TIFFGetField(tif, TIFFTAG_XRESOLUTION, &m.xres) && TIFFGetField(tif, TIFFTAG_YRESOLUTION, &m.yres);
  TIFFGetFieldDefaulted(tif, TIFFTAG_RESOLUTIONUNIT, &m.res_unit);
  m.pixel_scale = getArray<double>(tif, kModelPixelScale);
  m.tiepoint = getArray<double>(tif, kModelTiepoint);
  m.transformation = getArray<double>(tif, kModelTransformation);
  m.double_params = getArray<double>(tif, kGeoDoubleParams);
  m.key_directory = getArray<uint16_t>(tif, kGeoKeyDirectory);
  char* ascii = nullptr;
  if (TIFFGetField(tif, kGeoAsciiParams, &ascii) && ascii) m.ascii_params = ascii;
  return m;
}

TiffMetadata readMetadata(const std::string& path) {
  if (path.empty() || (!isRemoteInput(path) && !looksLikeTiff(path))) return {};
  installTiffHandlers();
  TIFF* tif = nullptr;
  try {
    tif = openTiffForReading(path);
  } catch (const Error&) {
    return {};
  }
  if (tif == nullptr) {
    takeTiffError();
    return {};
  }
  TiffMetadata m = readMetadata(tif);
  TIFFClose(tif);
  return m;
}

std::optional<double> micrometresPerPixel(const TiffMetadata& m) {
  if (m.pixel_scale.size() >= 2 && m.pixel_scale[0] > 0 && geoKey(m.key_directory, 1024) == uint16_t(1) &&
      geoKey(m.key_directory, 3076).value_or(9001) == 9001)
    return m.pixel_scale[0] * 1e6;
  if (!m.has_resolution || m.xres <= 0) return std::nullopt;
  // Under 1000 dpi in inches is a document's or a screen's setting (72, 96, 300 dpi: the default of many
  // writers), not a scan's: a microscope's pixel is a few micrometres at most (10000 dpi and more).
  if (m.res_unit == RESUNIT_INCH && m.xres < kLeastScanDpi) return std::nullopt;
  if (m.res_unit == RESUNIT_INCH) return 25400.0 / double(m.xres);
  if (m.res_unit == RESUNIT_CENTIMETER) return 10000.0 / double(m.xres);
  return std::nullopt;
}

void writeMetadata(TIFF* tif, TiffMetadata m, double s, std::optional<double> mpp) {
  const double res_scale = mpp && *mpp > 0 ? 1.0 : s;
  if (mpp && *mpp > 0) {
    m.has_resolution = true;
    m.xres = m.yres = float(10000.0 / *mpp);
    m.res_unit = RESUNIT_CENTIMETER;
  }
  if (m.has_resolution) {
    TIFFSetField(tif, TIFFTAG_XRESOLUTION, float(m.xres * res_scale));
    TIFFSetField(tif, TIFFTAG_YRESOLUTION, float(m.yres * res_scale));
    TIFFSetField(tif, TIFFTAG_RESOLUTIONUNIT, m.res_unit);
  }
  if (m.pixel_scale.size() >= 2) {
    m.pixel_scale[0] /= s;
    m.pixel_scale[1] /= s;
  }
  for (size_t i = 0; i + 5 < m.tiepoint.size(); i += 6) {
    m.tiepoint[i] *= s;
    m.tiepoint[i + 1] *= s;
  }
  if (m.transformation.size() == 16) {
    for (int row = 0; row < 4; ++row) {
      m.transformation[size_t(row * 4)] /= s;
      m.transformation[size_t(row * 4 + 1)] /= s;
    }
  }
  auto put = [tif](ttag_t tag, const auto& v) {
    if (!v.empty()) TIFFSetField(tif, tag, uint16_t(v.size()), v.data());
  };
  put(kModelPixelScale, m.pixel_scale);
  put(kModelTiepoint, m.tiepoint);
  put(kModelTransformation, m.transformation);
  put(kGeoKeyDirectory, m.key_directory);
  put(kGeoDoubleParams, m.double_params);
  if (!m.ascii_params.empty()) TIFFSetField(tif, kGeoAsciiParams, m.ascii_params.c_str());
}

// The most a codec can expand its bytes: a chunk that claims more decoded bytes than its stored bytes could
// ever give is corrupt or hostile, and is refused before its buffer is allocated (a 320-byte file claiming
// 30000x30000 in one deflate strip took 31 s and 1 GB to fail). Deflate tops out at 1032:1, PackBits at 64:1,
// LZW (4096-byte strings in 12-bit codes) near 2731:1; JPEG, zstd, LZMA and WebP get a bound far above what
// real tiles reach.
uint64_t maxExpansion(uint16_t compression) {
  switch (compression) {
    case COMPRESSION_NONE:
      return 1;
    case COMPRESSION_PACKBITS:
      return 64;
    case COMPRESSION_DEFLATE:
    case COMPRESSION_ADOBE_DEFLATE:
      return 1100;
    case COMPRESSION_LZW:
      return 4096;
    default:
      return uint64_t(1) << 16;
  }
}

std::string takeTiffCorruptionWarning() {
  return std::exchange(t_tiff_corruption, std::string());
}

void checkTiffChunkTables(const std::string& path) {
  installTiffHandlers();
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  TILER_CHECK(!ec, IoError, "'" << path << "': " << ec.message());
  clearTiffError();
  std::unique_ptr<TIFF, void (*)(TIFF*)> tif(TIFFOpen(path.c_str(), kTiffReadMode), TIFFClose);
  TILER_CHECK(tif, IoError, "'" << path << "': not a readable TIFF: " << takeTiffError());
  int page = 0;
  do {
    const bool tiled = TIFFIsTiled(tif.get()) != 0;
    const uint32_t chunks = tiled ? TIFFNumberOfTiles(tif.get()) : TIFFNumberOfStrips(tif.get());
    uint64_t *offsets = nullptr, *counts = nullptr;
    const bool have =
        TIFFGetField(tif.get(), tiled ? TIFFTAG_TILEOFFSETS : TIFFTAG_STRIPOFFSETS, &offsets) &&
        TIFFGetField(tif.get(), tiled ? TIFFTAG_TILEBYTECOUNTS : TIFFTAG_STRIPBYTECOUNTS, &counts) &&
        offsets != nullptr && counts != nullptr;
    TILER_CHECK(have, IoError,
                "'" << path << "': page " << page << " has no " << (tiled ? "tile" : "strip")
                    << " table: " << takeTiffError());
    for (uint32_t k = 0; k < chunks; ++k)
      TILER_CHECK(offsets[k] <= file_size && counts[k] <= file_size - offsets[k], IoError,
                  "'" << path << "': page " << page << ", " << (tiled ? "tile " : "strip ") << k << " claims "
                      << counts[k] << " bytes at offset " << offsets[k] << ", past the end of the "
                      << file_size << "-byte file: the file is corrupt");
    ++page;
  } while (TIFFReadDirectory(tif.get()) == 1);
  // The chain ends with no error, or at a page libtiff could not read.
  TILER_CHECK(t_tiff_error.empty(), IoError,
              "'" << path << "': page " << page << " cannot be read: " << takeTiffError());
}

void countDecodedChunk() {
  g_chunks_decoded.fetch_add(1, std::memory_order_relaxed);
}

int64_t tiffChunksDecoded() {
  return g_chunks_decoded.load(std::memory_order_relaxed);
}

}  // namespace tiler
