#include "tiler/image_io.hpp"
#include "tiler/slide.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <tiffio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "tiler/error.hpp"
#include "tiler/platform.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// ---- libtiff's handlers become exceptions (errors) and debug lines (warnings) ----------------------------

thread_local std::string t_tiff_error;
std::atomic<int64_t> g_chunks_decoded{0};  // tiffChunksDecoded()

void tiffErrorHandler(const char* module, const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (!t_tiff_error.empty()) t_tiff_error += "; ";
  t_tiff_error += module ? std::string(module) + ": " + buf : std::string(buf);
}

void tiffWarningHandler(const char* module, const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  spdlog::debug("libtiff warning: {}: {}", module ? module : "", buf);
}

// GeoTIFF tags are unknown to libtiff; registering them lets us read and write them as ordinary fields.
constexpr ttag_t kModelPixelScale = 33550, kModelTiepoint = 33922, kModelTransformation = 34264,
                 kGeoKeyDirectory = 34735, kGeoDoubleParams = 34736, kGeoAsciiParams = 34737,
                 kGdalMetadata = 42112, kGdalNodata = 42113;

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

void installTiffHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    TIFFSetErrorHandler(tiffErrorHandler);
    TIFFSetWarningHandler(tiffWarningHandler);
    g_parent_extender = TIFFSetTagExtender(geoTagExtender);
  });
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
void setTiffFields(TIFF* tif, int64_t width, int64_t height, int channels, SampleType type,
                   const WriterOptions& o, bool reduced) {
  if (reduced) TIFFSetField(tif, TIFFTAG_SUBFILETYPE, FILETYPE_REDUCEDIMAGE);
  TIFFSetField(tif, TIFFTAG_IMAGEWIDTH, uint32_t(width));
  TIFFSetField(tif, TIFFTAG_IMAGELENGTH, uint32_t(height));
  TIFFSetField(tif, TIFFTAG_SAMPLESPERPIXEL, uint16_t(channels));
  const uint16_t bits = uint16_t(8 * bytesPerSample(type));
  TIFFSetField(tif, TIFFTAG_BITSPERSAMPLE, bits);
  const bool floats = type == SampleType::kF32 || type == SampleType::kF16;
  TIFFSetField(tif, TIFFTAG_SAMPLEFORMAT, floats ? SAMPLEFORMAT_IEEEFP : SAMPLEFORMAT_UINT);
  TIFFSetField(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  if (!o.colormap.empty()) {
    TIFFSetField(tif, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_PALETTE);
    const size_t n = size_t(1) << bits;
    std::vector<uint16_t> r(n, 0), g(n, 0), b(n, 0);
    for (size_t k = 0; k < o.colormap.size() && k < n; ++k) {
      r[k] = uint16_t(o.colormap[k][0] * 257);
      g[k] = uint16_t(o.colormap[k][1] * 257);
      b[k] = uint16_t(o.colormap[k][2] * 257);
    }
    TIFFSetField(tif, TIFFTAG_COLORMAP, r.data(), g.data(), b.data());
  } else {
    TIFFSetField(tif, TIFFTAG_PHOTOMETRIC,
                 channels == 3 && type == SampleType::kU8 ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK);
  }
  if (channels > 1 && !(channels == 3 && type == SampleType::kU8)) {
    std::vector<uint16_t> extra(size_t(channels - 1), EXTRASAMPLE_UNSPECIFIED);
    TIFFSetField(tif, TIFFTAG_EXTRASAMPLES, uint16_t(extra.size()), extra.data());
  }
  TIFFSetField(tif, TIFFTAG_TILEWIDTH, uint32_t(o.tile));
  TIFFSetField(tif, TIFFTAG_TILELENGTH, uint32_t(o.tile));
  uint16_t comp = COMPRESSION_ADOBE_DEFLATE;
  if (o.compression == Compression::kZstd) comp = COMPRESSION_ZSTD;
  if (o.compression == Compression::kLzw) comp = COMPRESSION_LZW;
  if (o.compression == Compression::kNone) comp = COMPRESSION_NONE;
  TILER_CHECK(TIFFIsCODECConfigured(comp), ConfigError,
              "this libtiff cannot write the requested compression");
  TIFFSetField(tif, TIFFTAG_COMPRESSION, comp);
  if (comp != COMPRESSION_NONE)
    TIFFSetField(tif, TIFFTAG_PREDICTOR, floats ? PREDICTOR_FLOATINGPOINT : PREDICTOR_HORIZONTAL);
}

// A TIFF in memory, the tile encoder's scratch file: libtiff's client procedures over a byte vector.
struct MemoryFile {
  std::vector<uint8_t> bytes;
  uint64_t pos = 0;
};

tmsize_t memoryRead(thandle_t h, void* buf, tmsize_t n) {
  auto* f = static_cast<MemoryFile*>(h);
  const uint64_t take =
      f->pos >= f->bytes.size() ? 0 : std::min<uint64_t>(uint64_t(n), f->bytes.size() - f->pos);
  std::memcpy(buf, f->bytes.data() + f->pos, size_t(take));
  f->pos += take;
  return tmsize_t(take);
}

tmsize_t memoryWrite(thandle_t h, void* buf, tmsize_t n) {
  auto* f = static_cast<MemoryFile*>(h);
  if (f->pos + uint64_t(n) > f->bytes.size()) f->bytes.resize(size_t(f->pos + uint64_t(n)));
  std::memcpy(f->bytes.data() + f->pos, buf, size_t(n));
  f->pos += uint64_t(n);
  return n;
}

toff_t memorySeek(thandle_t h, toff_t off, int whence) {
  auto* f = static_cast<MemoryFile*>(h);
  if (whence == SEEK_CUR) off += f->pos;
  if (whence == SEEK_END) off += f->bytes.size();
  f->pos = off;
  return off;
}

int memoryClose(thandle_t) {
  return 0;
}

toff_t memorySize(thandle_t h) {
  return static_cast<MemoryFile*>(h)->bytes.size();
}

int memoryMap(thandle_t, void**, toff_t*) {
  return 0;
}

void memoryUnmap(thandle_t, void*, toff_t) {}

// How a writer's tiles are encoded; shared by the pool's tasks of one writer.
struct TileEncoding {
  int channels = 1;
  SampleType type = SampleType::kU8;
  WriterOptions options;  // without the pool: a queued task must not keep its own pool alive
};

// One tile (tile x tile samples, zero padded) compressed exactly as TIFFWriteEncodedTile would into the
// output: the same fields, codec and predictor, written into a one-tile TIFF in memory and cut out of it.
std::vector<uint8_t> encodeTile(std::vector<uint8_t>& samples, const TileEncoding& e) {
  MemoryFile file;
  t_tiff_error.clear();
  TIFF* tif = TIFFClientOpen("tile", "w", &file, memoryRead, memoryWrite, memorySeek, memoryClose, memorySize,
                             memoryMap, memoryUnmap);
  TILER_CHECK(tif != nullptr, IoError, "cannot open a TIFF in memory: " << takeTiffError());
  setTiffFields(tif, e.options.tile, e.options.tile, e.channels, e.type, e.options, false);
  uint64_t* offsets = nullptr;
  uint64_t* counts = nullptr;
  const bool ok = TIFFWriteEncodedTile(tif, 0, samples.data(), tmsize_t(samples.size())) >= 0 &&
                  TIFFGetField(tif, TIFFTAG_TILEOFFSETS, &offsets) &&
                  TIFFGetField(tif, TIFFTAG_TILEBYTECOUNTS, &counts) && offsets != nullptr &&
                  counts != nullptr && offsets[0] + counts[0] <= file.bytes.size();
  const uint64_t offset = ok ? offsets[0] : 0, count = ok ? counts[0] : 0;
  TIFFCleanup(tif);  // frees it without writing a directory nobody reads
  TILER_CHECK(ok, IoError, "compressing a tile failed: " << takeTiffError());
  return std::vector<uint8_t>(file.bytes.begin() + std::ptrdiff_t(offset),
                              file.bytes.begin() + std::ptrdiff_t(offset + count));
}

bool looksLikeTiff(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char magic[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(magic), 4);
  if (in.gcount() < 4) return false;
  return (magic[0] == 'I' && magic[1] == 'I' && (magic[2] == 42 || magic[2] == 43) && magic[3] == 0) ||
         (magic[0] == 'M' && magic[1] == 'M' && magic[2] == 0 && (magic[3] == 42 || magic[3] == 43));
}

// ---- metadata -------------------------------------------------------------------------------------------

struct TiffMetadata {
  bool has_resolution = false;
  float xres = 0, yres = 0;
  uint16_t res_unit = RESUNIT_NONE;
  std::vector<double> pixel_scale, tiepoint, transformation, double_params;
  std::vector<uint16_t> key_directory;
  std::string ascii_params;
};

template <typename T>
std::vector<T> getArray(TIFF* tif, ttag_t tag) {
  uint16_t count = 0;
  T* data = nullptr;
  if (TIFFGetField(tif, tag, &count, &data) && data != nullptr) return std::vector<T>(data, data + count);
  return {};
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

// Inputs are read with read(2), not memory-mapped ("m"): mapped pages of the input count in the process's
// resident memory (time -v, top, Slurm's accounting) though they are the file's, and each tile is read once.
constexpr const char* kTiffReadMode = "rm";

TiffMetadata readMetadata(const std::string& path) {
  if (path.empty() || !looksLikeTiff(path)) return {};
  installTiffHandlers();
  TIFF* tif = TIFFOpen(path.c_str(), kTiffReadMode);
  if (tif == nullptr) {
    takeTiffError();
    return {};
  }
  TiffMetadata m = readMetadata(tif);
  TIFFClose(tif);
  return m;
}

// GeoKeys: GTModelTypeGeoKey 1024 (1 = projected), ProjLinearUnitsGeoKey 3076 (9001 = metre).
std::optional<uint16_t> geoKey(const std::vector<uint16_t>& directory, uint16_t key) {
  for (size_t i = 4; i + 3 < directory.size(); i += 4)
    if (directory[i] == key && directory[i + 1] == 0) return directory[i + 3];
  return std::nullopt;
}

// Micrometres per pixel (x) that the tags state: a projected GeoTIFF in metres first, then X/YResolution
// in inches or centimetres.
std::optional<double> micrometresPerPixel(const TiffMetadata& m) {
  if (m.pixel_scale.size() >= 2 && m.pixel_scale[0] > 0 && geoKey(m.key_directory, 1024) == uint16_t(1) &&
      geoKey(m.key_directory, 3076).value_or(9001) == 9001)
    return m.pixel_scale[0] * 1e6;
  if (!m.has_resolution || m.xres <= 0) return std::nullopt;
  if (m.res_unit == RESUNIT_INCH) return 25400.0 / double(m.xres);
  if (m.res_unit == RESUNIT_CENTIMETER) return 10000.0 / double(m.xres);
  return std::nullopt;
}

// Output pixels are 1/s input pixels: resolution scales up by s, ground size per pixel down by s.
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

// Largest decoded tile or strip we agree to hold; a header claiming more is absurd or needs re-saving.
constexpr uint64_t kMaxChunkBytes = uint64_t(1) << 30;

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

// Where a TIFF level's pixels are: a page of the main IFD chain, or a SubIFD (by its offset).
struct TiffPage {
  tdir_t index = 0;
  uint64_t subifd_offset = 0;  // non-zero: a SubIFD of page 0
};

bool selectPage(TIFF* tif, const TiffPage& page) {
  return page.subifd_offset ? TIFFSetSubDirectory(tif, page.subifd_offset) != 0
                            : TIFFSetDirectory(tif, page.index) != 0;
}

// Reads tiles and strips through a cache of decoded chunks that every reading thread shares: a chunk is
// decoded once, by the first thread that wants it, on a libtiff handle of that thread's own for the time
// (a handle's codec state is not shareable); threads that want it meanwhile wait for it. So a rank's
// read threads decode in parallel and never decode a tile twice while it is cached.
class TiffReader final : public ImageReader {
 public:
  explicit TiffReader(const std::string& path, TiffPage page = {}) : page_(page) {
    installTiffHandlers();
    info_.path = path;
    info_.format = "tiff";
    info_.reader = "tiff";
    t_tiff_error.clear();
    tif_ = TIFFOpen(path.c_str(), kTiffReadMode);
    if (tif_ == nullptr) TILER_THROW(IoError, "'" << path << "': not a readable TIFF: " << takeTiffError());
    try {
      const bool level0 = page.index == 0 && page.subifd_offset == 0;
      if (level0) findLevels();
      TILER_CHECK(selectPage(tif_, page), IoError,
                  "'" << path << "': cannot read page " << page.index << ": " << takeTiffError());
      readHeader();
      if (level0) info_.levels.insert(info_.levels.begin(), ImageInfo::Level{info_.width, info_.height, 1.0});
    } catch (...) {
      TIFFClose(tif_);
      throw;
    }
    idle_handles_.push_back(tif_);  // the header's handle decodes too
  }
  ~TiffReader() override {
    for (TIFF* tif : idle_handles_) TIFFClose(tif);
  }

  const ImageInfo& info() const override { return info_; }

  size_t cachedBytes() const override {
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      bytes = cache_bytes_;
    }
    std::lock_guard<std::mutex> lock(levels_mutex_);
    for (const auto& level : level_readers_)
      if (level) bytes += level->cachedBytes();
    return bytes;
  }

  cv::Mat readRegion(const Rect& r, int level) override {
    if (level != 0) return levelReader(level).readRegion(r, 0);
    cv::Mat stored = readStored(r);
    return cmyk_ ? cmykToRgb(stored) : stored;
  }

 private:
  // The samples as the file stores them (CMYK too).
  cv::Mat readStored(const Rect& r) {
    TILER_CHECK(
        r.x >= 0 && r.y >= 0 && r.w > 0 && r.h > 0 && r.right() <= info_.width && r.bottom() <= info_.height,
        IoError,
        "'" << info_.path << "': region " << r.x << "," << r.y << " " << r.w << "x" << r.h
            << " outside the image " << info_.width << "x" << info_.height);
    cv::Mat out(int(r.h), int(r.w), CV_MAKETYPE(cvDepthOf(info_.type), stored_channels_));
    const size_t px = bytesPerSample(info_.type) * size_t(stored_channels_);
    const size_t sample = bytesPerSample(info_.type);
    if (huge_uncompressed_strips_) {
      readScanlines(r, out);
      return out;
    }
    const int64_t cw = chunk_w_, ch = chunk_h_;
    const int planes = info_.planar_separate ? stored_channels_ : 1;
    for (int64_t cy = r.y / ch; cy * ch < r.bottom(); ++cy) {
      for (int64_t cx = r.x / cw; cx * cw < r.right(); ++cx) {
        const int64_t x0 = std::max(r.x, cx * cw), x1 = std::min(r.right(), (cx + 1) * cw);
        const int64_t y0 = std::max(r.y, cy * ch), y1 = std::min(r.bottom(), (cy + 1) * ch);
        for (int plane = 0; plane < planes; ++plane) {
          const Chunk chunk = decodedChunk(cx, cy, plane);  // held: the cache may evict it meanwhile
          const size_t chunk_px = info_.planar_separate ? sample : px;
          for (int64_t y = y0; y < y1; ++y) {
            const uint8_t* src =
                chunk->data() + (size_t(y - cy * ch) * size_t(cw) + size_t(x0 - cx * cw)) * chunk_px;
            uint8_t* dst = out.ptr<uint8_t>(int(y - r.y)) + size_t(x0 - r.x) * px;
            if (!info_.planar_separate) {
              std::memcpy(dst, src, size_t(x1 - x0) * px);
            } else {
              dst += size_t(plane) * sample;
              for (int64_t x = x0; x < x1; ++x, src += sample, dst += px) std::memcpy(dst, src, sample);
            }
          }
        }
      }
    }
    return out;
  }

  // Ink to light: R = (1 - C)(1 - K), G = (1 - M)(1 - K), B = (1 - Y)(1 - K), as libtiff's RGBA interface
  // converts; samples after the four inks (alpha) are kept.
  cv::Mat cmykToRgb(const cv::Mat& cmyk) const {
    cv::Mat rgb(cmyk.rows, cmyk.cols, CV_MAKETYPE(cmyk.depth(), info_.channels));
    auto convert = [&](auto sample) {
      using T = decltype(sample);
      const uint32_t full = std::numeric_limits<T>::max();
      const int in = stored_channels_, out = info_.channels;
      for (int y = 0; y < cmyk.rows; ++y) {
        const T* src = cmyk.ptr<T>(y);
        T* dst = rgb.ptr<T>(y);
        for (int x = 0; x < cmyk.cols; ++x, src += in, dst += out) {
          const uint32_t light = full - src[3];
          for (int c = 0; c < 3; ++c) dst[c] = T(((full - src[c]) * uint64_t(light) + full / 2) / full);
          for (int c = 3; c < out; ++c) dst[c] = src[c + 1];
        }
      }
    };
    if (info_.type == SampleType::kU8)
      convert(uint8_t{});
    else
      convert(uint16_t{});
    return rgb;
  }

  void readHeader() {
    uint32_t w = 0, h = 0;
    uint16_t spp = 1, bps = 1, fmt = SAMPLEFORMAT_UINT, planar = PLANARCONFIG_CONTIG, comp = COMPRESSION_NONE,
             photometric = PHOTOMETRIC_MINISBLACK;
    TIFFGetField(tif_, TIFFTAG_IMAGEWIDTH, &w);
    TIFFGetField(tif_, TIFFTAG_IMAGELENGTH, &h);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLESPERPIXEL, &spp);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_BITSPERSAMPLE, &bps);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLEFORMAT, &fmt);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_PLANARCONFIG, &planar);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_COMPRESSION, &comp);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_PHOTOMETRIC, &photometric);
    const std::string& p = info_.path;
    TILER_CHECK(w > 0 && h > 0, IoError, "'" << p << "': zero image size " << w << "x" << h);
    TILER_CHECK(spp >= 1 && spp <= 512, IoError, "'" << p << "': unsupported samples per pixel " << spp);
    info_.width = w;
    info_.height = h;
    info_.channels = spp;
    stored_channels_ = spp;
    compression_ = comp;
    info_.planar_separate = planar == PLANARCONFIG_SEPARATE && spp > 1;
    info_.compression = compressionName(comp);
    info_.bigtiff = (TIFFIsBigTIFF(tif_) != 0);
    info_.pages = int(TIFFNumberOfDirectories(tif_));
    info_.mpp = micrometresPerPixel(readMetadata(tif_));
    char* description = nullptr;
    if (TIFFGetField(tif_, TIFFTAG_IMAGEDESCRIPTION, &description) && description != nullptr)
      info_.description = description;
    char* nodata = nullptr;
    if (TIFFGetField(tif_, kGdalNodata, &nodata) && nodata != nullptr) {
      try {
        info_.nodata = std::stod(nodata);
      } catch (const std::exception&) {
        spdlog::warn("'{}': GDAL_NODATA '{}' is not a number; ignored", info_.path, nodata);
      }
    }
    TILER_CHECK(TIFFIsCODECConfigured(comp), IoError,
                "'" << p << "': compression " << info_.compression << " is not supported by this libtiff");
    if (fmt == SAMPLEFORMAT_UINT && bps == 8)
      info_.type = SampleType::kU8;
    else if (fmt == SAMPLEFORMAT_UINT && bps == 16)
      info_.type = SampleType::kU16;
    else if (fmt == SAMPLEFORMAT_INT && bps == 16)
      info_.type = SampleType::kI16;
    else if (fmt == SAMPLEFORMAT_UINT && bps == 32)
      info_.type = SampleType::kU32;
    else if (fmt == SAMPLEFORMAT_IEEEFP && bps == 16)
      info_.type = SampleType::kF16;
    else if (fmt == SAMPLEFORMAT_IEEEFP && bps == 32)
      info_.type = SampleType::kF32;
    else
      TILER_THROW(IoError, "'" << p << "': unsupported sample format (" << bps << " bits, "
                               << (fmt == SAMPLEFORMAT_IEEEFP ? "float"
                                   : fmt == SAMPLEFORMAT_INT  ? "signed"
                                                              : "unsigned")
                               << "); tiler reads 8/16/32-bit unsigned, 16-bit signed and 16/32-bit float");
    // A palette image is read as its indices (a labels output of tiler is one, and so is a mask); its colour
    // map goes with it, so that a model that takes RGB gets the colours (channelAdaptation).
    if (photometric == PHOTOMETRIC_PALETTE) {
      TILER_CHECK(spp == 1 && (bps == 8 || bps == 16), IoError,
                  "'" << p << "': palette TIFFs other than 8- or 16-bit indices are not supported");
      uint16_t *red = nullptr, *green = nullptr, *blue = nullptr;
      TILER_CHECK(TIFFGetField(tif_, TIFFTAG_COLORMAP, &red, &green, &blue) && red && green && blue, IoError,
                  "'" << p << "': a palette TIFF without a colour map");
      auto map = std::make_shared<std::vector<std::array<uint16_t, 3>>>(size_t(1) << bps);
      for (size_t i = 0; i < map->size(); ++i) (*map)[i] = {red[i], green[i], blue[i]};
      info_.colormap = std::move(map);
    }
    if (photometric == PHOTOMETRIC_SEPARATED) {
      uint16_t inkset = INKSET_CMYK;
      TIFFGetFieldDefaulted(tif_, TIFFTAG_INKSET, &inkset);
      TILER_CHECK(inkset == INKSET_CMYK && (spp == 4 || spp == 5) &&
                      (info_.type == SampleType::kU8 || info_.type == SampleType::kU16),
                  IoError,
                  "'" << p << "': a separated (ink) TIFF other than 8- or 16-bit CMYK (" << spp
                      << " samples) is not supported; convert it to RGB first");
      cmyk_ = true;
      info_.channels = spp - 1;  // CMYK -> RGB, CMYK + alpha -> RGBA
    }
    TILER_CHECK(photometric != PHOTOMETRIC_CIELAB && photometric != PHOTOMETRIC_ICCLAB &&
                    photometric != PHOTOMETRIC_ITULAB && photometric != PHOTOMETRIC_LOGL &&
                    photometric != PHOTOMETRIC_LOGLUV,
                IoError,
                "'" << p << "': Lab and LogLuv TIFFs are not supported (photometric " << photometric
                    << "); convert the image to RGB first");
    if (photometric == PHOTOMETRIC_YCBCR) {
      TILER_CHECK(comp == COMPRESSION_JPEG, IoError,
                  "'" << p << "': YCbCr TIFF without JPEG compression is not supported");
      ycbcr_jpeg_ = true;
      TIFFSetField(tif_, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
    }
    const uint64_t px = bytesPerSample(info_.type) * (info_.planar_separate ? 1 : spp);
    info_.tiled = TIFFIsTiled(tif_) != 0;
    if (info_.tiled) {
      uint32_t tw = 0, th = 0;
      TIFFGetField(tif_, TIFFTAG_TILEWIDTH, &tw);
      TIFFGetField(tif_, TIFFTAG_TILELENGTH, &th);
      TILER_CHECK(tw > 0 && th > 0, IoError, "'" << p << "': tiled TIFF with zero tile size");
      info_.tile_width = tw;
      info_.tile_height = th;
      chunk_w_ = tw;
      chunk_h_ = th;
    } else {
      uint32_t rps = h;
      TIFFGetFieldDefaulted(tif_, TIFFTAG_ROWSPERSTRIP, &rps);
      TILER_CHECK(rps > 0, IoError, "'" << p << "': zero rows per strip");
      info_.rows_per_strip = std::min<uint32_t>(rps, h);
      chunk_w_ = w;
      chunk_h_ = info_.rows_per_strip;
    }
    const uint64_t chunk_bytes = uint64_t(chunk_w_) * uint64_t(chunk_h_) * px;
    if (chunk_bytes > kMaxChunkBytes) {
      // One strip holding a huge image: uncompressed, rows can be read one at a time; compressed cannot.
      TILER_CHECK(!info_.tiled && comp == COMPRESSION_NONE && !info_.planar_separate, IoError,
                  "'" << p << "': a " << (info_.tiled ? "tile" : "strip") << " of " << chunk_bytes
                      << " bytes (" << chunk_w_ << "x" << chunk_h_
                      << ") is too large to decode; re-save the image"
                      << " as a tiled TIFF (e.g. tiffcp -t -w 256 -l 256)");
      huge_uncompressed_strips_ = true;
    }
    // Cheap plausibility check before anything is decoded: the chunk tables must exist and lie in the file.
    const uint32_t chunks = info_.tiled ? TIFFNumberOfTiles(tif_) : TIFFNumberOfStrips(tif_);
    TILER_CHECK(chunks > 0, IoError, "'" << p << "': no image data (no strips or tiles)");
    struct stat st {};
    if (stat(p.c_str(), &st) == 0) {
      const uint64_t last = chunks - 1;
      uint64_t off = TIFFGetStrileOffset(tif_, uint32_t(last));
      uint64_t cnt = TIFFGetStrileByteCount(tif_, uint32_t(last));
      TILER_CHECK(off + cnt <= uint64_t(st.st_size) && (comp != COMPRESSION_NONE || cnt > 0), IoError,
                  "'" << p << "': truncated: the image data ends at byte " << off + cnt
                      << " but the file has " << st.st_size << " bytes");
    }
    chunks_across_ = (int64_t(w) + chunk_w_ - 1) / chunk_w_;
    chunks_down_ = (int64_t(h) + chunk_h_ - 1) / chunk_h_;
    if (!huge_uncompressed_strips_) {
      checkExpansion(tif_, 0, 0, 0);
      checkExpansion(tif_, chunks - 1, chunks_across_ - 1, chunks_down_ - 1);
    }
    TILER_CHECK(uint64_t(chunks_across_ * chunks_down_ * (info_.planar_separate ? spp : 1)) == chunks,
                IoError,
                "'" << p << "': " << chunks << " " << (info_.tiled ? "tiles" : "strips") << " for a " << w
                    << "x" << h << " image of " << chunk_w_ << "x" << chunk_h_ << " chunks");
    const uint64_t row_bytes = uint64_t(chunks_across_) * chunk_bytes * (info_.planar_separate ? spp : 1);
    cache_budget_ = size_t(std::clamp<uint64_t>(row_bytes * 5 / 2, uint64_t(16) << 20, uint64_t(512) << 20));
  }

  // Levels 1..: page 0's SubIFDs (OME-TIFF, libvips --subifd) if it has any, else the reduced-resolution
  // pages of the main chain (NewSubfileType bit 0: GDAL COG overviews, libvips --pyramid, tiler --pyramid),
  // each smaller than the one before and with page 0's samples. Anything else (thumbnails, masks) is not a
  // level. Leaves no page selected.
  void findLevels() {
    auto describe = [this](TiffPage page) -> std::optional<std::pair<int64_t, int64_t>> {
      if (!selectPage(tif_, page)) return std::nullopt;
      uint32_t w = 0, h = 0;
      uint16_t spp = 1, bps = 1;
      TIFFGetField(tif_, TIFFTAG_IMAGEWIDTH, &w);
      TIFFGetField(tif_, TIFFTAG_IMAGELENGTH, &h);
      TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLESPERPIXEL, &spp);
      TIFFGetFieldDefaulted(tif_, TIFFTAG_BITSPERSAMPLE, &bps);
      if (w == 0 || h == 0 || spp != level0_spp_ || bps != level0_bps_) return std::nullopt;
      return std::make_pair(int64_t(w), int64_t(h));
    };
    uint32_t w0 = 0, h0 = 0;
    TIFFGetField(tif_, TIFFTAG_IMAGEWIDTH, &w0);
    TIFFGetField(tif_, TIFFTAG_IMAGELENGTH, &h0);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLESPERPIXEL, &level0_spp_);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_BITSPERSAMPLE, &level0_bps_);
    std::vector<TiffPage> candidates;
    uint16_t subifds = 0;
    uint64_t* offsets = nullptr;
    if (TIFFGetField(tif_, TIFFTAG_SUBIFD, &subifds, &offsets) && subifds > 0 && offsets != nullptr) {
      for (uint16_t i = 0; i < subifds; ++i) candidates.push_back({0, offsets[i]});
    } else {
      const tdir_t pages = TIFFNumberOfDirectories(tif_);
      for (tdir_t d = 1; d < pages; ++d) {
        if (!TIFFSetDirectory(tif_, d)) break;
        uint32_t subfile = 0;
        TIFFGetFieldDefaulted(tif_, TIFFTAG_SUBFILETYPE, &subfile);
        if (subfile & FILETYPE_REDUCEDIMAGE) candidates.push_back({d, 0});
      }
    }
    int64_t prev_w = w0, prev_h = h0;
    for (const TiffPage& page : candidates) {
      const auto size = describe(page);
      if (!size || size->first >= prev_w || size->second > prev_h) continue;
      prev_w = size->first;
      prev_h = size->second;
      const double downsample = (double(w0) / double(prev_w) + double(h0) / double(prev_h)) / 2.0;
      info_.levels.push_back({prev_w, prev_h, downsample});
      level_pages_.push_back(page);
    }
    level_readers_.resize(level_pages_.size());
    takeTiffError();
  }

  TiffReader& levelReader(int level) {
    TILER_CHECK(level > 0 && size_t(level) <= level_pages_.size(), IoError,
                "'" << info_.path << "': no resolution level " << level << " (it has "
                    << level_pages_.size() + 1 << ")");
    std::lock_guard<std::mutex> lock(levels_mutex_);
    auto& reader = level_readers_[size_t(level - 1)];
    if (!reader) reader = std::make_unique<TiffReader>(info_.path, level_pages_[size_t(level - 1)]);
    return *reader;
  }

  // A libtiff handle of the calling thread's own until the lease ends: an idle one, or a new one.
  class HandleLease {
   public:
    explicit HandleLease(TiffReader& reader) : reader_(reader), tif_(reader.acquireHandle()) {}
    ~HandleLease() { reader_.releaseHandle(tif_); }
    HandleLease(const HandleLease&) = delete;
    HandleLease& operator=(const HandleLease&) = delete;
    TIFF* get() const { return tif_; }

   private:
    TiffReader& reader_;
    TIFF* tif_;
  };

  TIFF* acquireHandle() {
    {
      std::lock_guard<std::mutex> lock(handles_mutex_);
      if (!idle_handles_.empty()) {
        TIFF* tif = idle_handles_.back();
        idle_handles_.pop_back();
        return tif;
      }
    }
    t_tiff_error.clear();
    TIFF* tif = TIFFOpen(info_.path.c_str(), kTiffReadMode);
    if (tif == nullptr)
      TILER_THROW(IoError, "'" << info_.path << "': cannot open it again for reading: " << takeTiffError());
    if (!selectPage(tif, page_)) {
      const std::string error = takeTiffError();
      TIFFClose(tif);
      TILER_THROW(IoError, "'" << info_.path << "': cannot read page " << page_.index << ": " << error);
    }
    if (ycbcr_jpeg_) TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
    return tif;
  }

  void releaseHandle(TIFF* tif) {
    std::lock_guard<std::mutex> lock(handles_mutex_);
    idle_handles_.push_back(tif);
  }

  void readScanlines(const Rect& r, cv::Mat& out) {
    const HandleLease tif(*this);
    const size_t px = bytesPerSample(info_.type) * size_t(stored_channels_);
    std::vector<uint8_t> line(size_t(TIFFScanlineSize64(tif.get())));
    for (int64_t y = r.y; y < r.bottom(); ++y) {
      if (TIFFReadScanline(tif.get(), line.data(), uint32_t(y), 0) < 0)
        TILER_THROW(IoError, "'" << info_.path << "': TIFFReadScanline failed at row " << y << ": "
                                 << takeTiffError());
      std::memcpy(out.ptr<uint8_t>(int(y - r.y)), line.data() + size_t(r.x) * px, size_t(r.w) * px);
    }
  }

  using Chunk = std::shared_ptr<const std::vector<uint8_t>>;

  // The decoded tile/strip (cx, cy) of `plane`, through the shared cache.
  Chunk decodedChunk(int64_t cx, int64_t cy, int plane) {
    // libtiff's TIFFComputeTile / TIFFComputeStrip for 2-D images, without touching a handle.
    const auto index = uint32_t((int64_t(plane) * chunks_down_ + cy) * chunks_across_ + cx);
    {
      std::unique_lock<std::mutex> lock(cache_mutex_);
      for (;;) {
        auto it = cache_.find(index);
        if (it == cache_.end()) {
          cache_[index];  // claimed: this thread decodes it
          break;
        }
        if (it->second.data) {
          lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
          return it->second.data;
        }
        chunk_decoded_.wait(lock);  // another thread is decoding it
      }
    }
    Chunk data;
    try {
      data = decodeChunk(index, cx, cy);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        cache_.erase(index);  // a waiting thread tries for itself
      }
      chunk_decoded_.notify_all();
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      // Each reading thread walks its own part of the image (a batch's windows are split in runs): the budget
      // is per thread, or two threads evict each other's tiles and decode nearly every tile twice.
      const auto self = std::this_thread::get_id();
      if (reading_threads_.size() < kMaxBudgetThreads &&
          std::find(reading_threads_.begin(), reading_threads_.end(), self) == reading_threads_.end())
        reading_threads_.push_back(self);
      const size_t budget = cache_budget_ * std::max<size_t>(1, reading_threads_.size());
      while (cache_bytes_ + data->size() > budget && !lru_.empty()) {
        auto victim = cache_.find(lru_.back());
        cache_bytes_ -= victim->second.data->size();
        cache_.erase(victim);
        lru_.pop_back();
      }
      lru_.push_front(index);
      cache_bytes_ += data->size();
      CacheEntry& entry = cache_[index];
      entry.data = data;
      entry.lru_pos = lru_.begin();
    }
    chunk_decoded_.notify_all();
    return data;
  }

  // Throws IoError when chunk `index` (at cx, cy) claims more decoded bytes than its codec can give.
  void checkExpansion(TIFF* tif, uint32_t index, int64_t cx, int64_t cy) const {
    const uint64_t stored = TIFFGetStrileByteCount(tif, index);
    if (stored == 0) return;  // a sparse chunk (GDAL's SPARSE_OK): libtiff decides
    const size_t px = bytesPerSample(info_.type) * (info_.planar_separate ? 1 : size_t(stored_channels_));
    // A strip image's last strip holds only the rows left; tiles are always whole.
    const int64_t rows = info_.tiled ? chunk_h_ : std::min(chunk_h_, info_.height - cy * chunk_h_);
    const uint64_t decoded = uint64_t(chunk_w_) * uint64_t(rows) * px;
    TILER_CHECK(decoded <= stored * maxExpansion(compression_), IoError,
                "'" << info_.path << "': " << (info_.tiled ? "tile (" : "strip (") << cx << "," << cy
                    << ") claims " << decoded << " decoded bytes from " << stored << " stored, more than "
                    << info_.compression << " can expand (" << maxExpansion(compression_)
                    << ":1): the file is corrupt");
  }

  Chunk decodeChunk(uint32_t index, int64_t cx, int64_t cy) {
    const size_t px = bytesPerSample(info_.type) * (info_.planar_separate ? 1 : size_t(stored_channels_));
    const HandleLease tif(*this);
    checkExpansion(tif.get(), index, cx, cy);
    auto data = std::make_shared<std::vector<uint8_t>>(size_t(chunk_w_) * size_t(chunk_h_) * px);
    t_tiff_error.clear();
    tmsize_t got = info_.tiled ? TIFFReadEncodedTile(tif.get(), index, data->data(), tmsize_t(data->size()))
                               : TIFFReadEncodedStrip(tif.get(), index, data->data(), tmsize_t(data->size()));
    if (got < 0) {
      TILER_THROW(IoError, "'" << info_.path << "': " << (info_.tiled ? "TIFFReadTile" : "TIFFReadStrip")
                               << " failed at " << (info_.tiled ? "tile (" : "strip (") << cx << "," << cy
                               << "): " << takeTiffError());
    }
    g_chunks_decoded.fetch_add(1, std::memory_order_relaxed);
    return data;
  }

  struct CacheEntry {
    Chunk data;  // null while a thread decodes it
    std::list<uint32_t>::iterator lru_pos;
  };

  ImageInfo info_;
  TiffPage page_;
  TIFF* tif_ = nullptr;  // the header's handle (constructor only; then one of idle_handles_)
  bool ycbcr_jpeg_ = false;
  bool cmyk_ = false;        // PHOTOMETRIC_SEPARATED with CMYK inks: handed out as RGB(A)
  int stored_channels_ = 0;  // samples per pixel in the file (info_.channels is what readRegion returns)
  uint16_t compression_ = COMPRESSION_NONE;
  int64_t chunk_w_ = 0, chunk_h_ = 0, chunks_across_ = 0, chunks_down_ = 0;
  bool huge_uncompressed_strips_ = false;
  std::mutex handles_mutex_;
  std::vector<TIFF*> idle_handles_;  // owned; guarded by handles_mutex_
  mutable std::mutex cache_mutex_;
  std::condition_variable chunk_decoded_;
  size_t cache_budget_ = 16 << 20;                  // per reading thread
  size_t cache_bytes_ = 0;                          // guarded by cache_mutex_
  std::unordered_map<uint32_t, CacheEntry> cache_;  // guarded by cache_mutex_
  std::list<uint32_t> lru_;  // decoded chunks, most recent first; guarded by cache_mutex_
  static constexpr size_t kMaxBudgetThreads = 8;
  std::vector<std::thread::id> reading_threads_;  // the first kMaxBudgetThreads; guarded by cache_mutex_
  uint16_t level0_spp_ = 1, level0_bps_ = 1;
  std::vector<TiffPage> level_pages_;  // levels 1.. (level 0 reader only)
  mutable std::mutex levels_mutex_;
  std::vector<std::unique_ptr<TiffReader>> level_readers_;  // opened on first read; guarded by levels_mutex_
};

class OpenCvReader final : public ImageReader {
 public:
  explicit OpenCvReader(const std::string& path) {
    info_.path = path;
    std::string ext = fs::path(path).extension().string();
    info_.format = ext.empty() ? "unknown" : ext.substr(1);
    std::transform(info_.format.begin(), info_.format.end(), info_.format.begin(), ::tolower);
    errno = 0;
    std::ifstream probe(path, std::ios::binary);
    TILER_CHECK(probe.good(), IoError,
                "'" << path << "': cannot open: " << std::strerror(errno ? errno : ENOENT));
    probe.seekg(0, std::ios::end);
    TILER_CHECK(probe.tellg() > 0, IoError, "'" << path << "': empty file (0 bytes)");
    try {
      image_ = cv::imread(path, cv::IMREAD_UNCHANGED);
    } catch (const cv::Exception& e) {
      TILER_THROW(IoError, "'" << path << "': OpenCV cannot decode it: " << e.what());
    }
    TILER_CHECK(!image_.empty(), IoError,
                "'" << path
                    << "': OpenCV cannot decode it (not an image, corrupt, or larger than OpenCV's limit of "
                    << "2^30 pixels; convert large images to tiled TIFF)");
    if (image_.channels() == 3) cv::cvtColor(image_, image_, cv::COLOR_BGR2RGB);
    if (image_.channels() == 4) cv::cvtColor(image_, image_, cv::COLOR_BGRA2RGBA);
    info_.width = image_.cols;
    info_.height = image_.rows;
    info_.channels = image_.channels();
    switch (image_.depth()) {
      case CV_8U:
        info_.type = SampleType::kU8;
        break;
      case CV_16U:
        info_.type = SampleType::kU16;
        break;
      case CV_16S:
        info_.type = SampleType::kI16;
        break;
      case CV_32F:
        info_.type = SampleType::kF32;
        break;
      default:
        TILER_THROW(IoError, "'" << path << "': unsupported pixel depth " << image_.depth());
    }
    info_.compression = info_.format;
    info_.reader = "opencv";
    info_.levels = {{info_.width, info_.height, 1.0}};
  }
  const ImageInfo& info() const override { return info_; }
  size_t cachedBytes() const override { return image_.total() * image_.elemSize(); }
  cv::Mat readRegion(const Rect& r, int level) override {
    TILER_CHECK(level == 0, IoError,
                "'" << info_.path << "': no resolution level " << level << " (it has 1)");
    TILER_CHECK(
        r.x >= 0 && r.y >= 0 && r.w > 0 && r.h > 0 && r.right() <= info_.width && r.bottom() <= info_.height,
        IoError, "'" << info_.path << "': region outside the image");
    return image_(cv::Rect(int(r.x), int(r.y), int(r.w), int(r.h))).clone();
  }

 private:
  ImageInfo info_;
  cv::Mat image_;  // decoded once, read-only afterwards: concurrent reads need no lock
};

}  // namespace

const char* sampleTypeName(SampleType type) {
  switch (type) {
    case SampleType::kU8:
      return "u8";
    case SampleType::kU16:
      return "u16";
    case SampleType::kI16:
      return "i16";
    case SampleType::kU32:
      return "u32";
    case SampleType::kF16:
      return "f16";
    case SampleType::kF32:
      return "f32";
  }
  return "?";
}

int cvDepthOf(SampleType type) {
  switch (type) {
    case SampleType::kU8:
      return CV_8U;
    case SampleType::kU16:
      return CV_16U;
    case SampleType::kI16:
      return CV_16S;
    case SampleType::kU32:
      return CV_32S;  // same bytes; tiler converts to float before use
    case SampleType::kF16:
      return CV_16F;
    case SampleType::kF32:
      return CV_32F;
  }
  return CV_8U;
}

size_t bytesPerSample(SampleType type) {
  switch (type) {
    case SampleType::kU8:
      return 1;
    case SampleType::kU16:
    case SampleType::kI16:
    case SampleType::kF16:
      return 2;
    case SampleType::kU32:
    case SampleType::kF32:
      return 4;
  }
  return 1;
}

std::string lowerExtension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  return ext;
}

int64_t tiffChunksDecoded() {
  return g_chunks_decoded.load(std::memory_order_relaxed);
}

bool hasImageExtension(const std::string& path) {
  static const char* kExts[] = {".tif", ".tiff", ".png", ".jpg", ".jpeg", ".bmp", ".webp", ".jp2", ".pbm",
                                ".pgm", ".ppm",  ".pnm", ".exr", ".hdr",  ".pic", ".sr",   ".ras", ".pxm"};
  std::string ext = lowerExtension(path);
  return isWholeSlideExtension(path) ||
         std::any_of(std::begin(kExts), std::end(kExts), [&](const char* e) { return ext == e; });
}

bool isWholeSlideExtension(const std::string& path) {
  static const char* kExts[] = {".svs", ".ndpi", ".mrxs", ".scn", ".vms", ".vmu", ".bif", ".svslide"};
  std::string ext = lowerExtension(path);
  return std::any_of(std::begin(kExts), std::end(kExts), [&](const char* e) { return ext == e; });
}

std::unique_ptr<ImageReader> ImageReader::open(const std::string& path) {
  std::error_code ec;
  TILER_CHECK(fs::exists(path, ec), IoError, "'" << path << "': no such file");
  TILER_CHECK(!fs::is_directory(path, ec), IoError, "'" << path << "': is a directory");
  TILER_CHECK(access(path.c_str(), R_OK) == 0, IoError,
              "'" << path << "': cannot read: " << std::strerror(errno));
  std::string ext = lowerExtension(path);
  // OpenSlide for vendor formats (whatever the extension); a plain TIFF, even named .svs, stays with libtiff.
  const bool tiff = looksLikeTiff(path);
  if ((tiff || isWholeSlideExtension(path)) && !slideVendor(path).empty()) return openWholeSlide(path);
  if (tiff) return std::make_unique<TiffReader>(path);
  if (isWholeSlideExtension(path)) return openWholeSlide(path);  // fails, naming the file
  TILER_CHECK(ext != ".tif" && ext != ".tiff", IoError,
              "'" << path << "': not a TIFF (the file does not start with a TIFF header)");
  return std::make_unique<OpenCvReader>(path);
}

Compression parseCompression(const std::string& name) {
  if (name == "deflate" || name == "zip") return Compression::kDeflate;
  if (name == "zstd") return Compression::kZstd;
  if (name == "lzw") return Compression::kLzw;
  if (name == "none") return Compression::kNone;
  TILER_THROW(ConfigError, "compression must be deflate, zstd, lzw or none; got '" << name << "'");
}

// ---- writer ---------------------------------------------------------------------------------------------

ImageWriter::ImageWriter(const std::string& path, int64_t width, int64_t height, int channels,
                         SampleType type, WriterOptions options)
    : path_(path),
      width_(width),
      height_(height),
      channels_(channels),
      type_(type),
      options_(std::move(options)) {
  TILER_CHECK(width > 0 && height > 0 && channels >= 1, IoError,
              "'" << path << "': cannot write an image of " << width << "x" << height << "x" << channels);
  const int cv_type = CV_MAKETYPE(cvDepthOf(type), channels);
  cv_type_ = cv_type;
  if (options_.format == "tif" || options_.format == "tiff") {
    TILER_CHECK(type != SampleType::kI16 && type != SampleType::kU32, IoError,
                "'" << path << "': writer takes u8, u16, f16 or f32 samples");
    TILER_CHECK(options_.tile % 16 == 0 && options_.tile > 0, ConfigError,
                "TIFF tile must be a multiple of 16");
    installTiffHandlers();
    TILER_CHECK(
        options_.colormap.empty() || (channels == 1 && type != SampleType::kF32 && type != SampleType::kF16),
        ConfigError, "'" << path << "': a colour map needs one integer channel");
    const uint64_t raw = uint64_t(width) * uint64_t(height) * uint64_t(channels) * bytesPerSample(type);
    // Reduced levels add at most a third.
    const bool big = (options_.pyramid ? raw + raw / 3 : raw) > (uint64_t(1) << 31);
    t_tiff_error.clear();
    const int fd = createFileExclusively(partialPath());
    TILER_CHECK(fd >= 0, IoError, "'" << partialPath() << "': cannot create: " << std::strerror(errno));
    TIFF* tif = TIFFFdOpen(fd, partialPath().c_str(), big ? "w8" : "w");
    if (tif == nullptr) {
      ::close(fd);
      TILER_THROW(IoError, "'" << partialPath() << "': cannot create: " << takeTiffError());
    }
    tiff_ = tif;
    setTiffFields(tif, width, height, channels, type, options_, false);
    if (!options_.description.empty())
      TIFFSetField(tif, TIFFTAG_IMAGEDESCRIPTION, options_.description.c_str());
    if (options_.value_scale) {
      std::ostringstream items;
      items.precision(17);
      items << "<GDALMetadata>";
      for (int band = 0; band < channels; ++band)
        items << "<Item name=\"SCALE\" sample=\"" << band << "\" role=\"scale\">" << *options_.value_scale
              << "</Item><Item name=\"OFFSET\" sample=\"" << band << "\" role=\"offset\">0</Item>";
      items << "</GDALMetadata>";
      TIFFSetField(tif, kGdalMetadata, items.str().c_str());
    }
    writeMetadata(tif, readMetadata(options_.metadata_from), options_.metadata_scale, options_.mpp);
    buffer_ = cv::Mat(options_.tile, int(width), cv_type);
    if (options_.background) {
      if (!options_.pool) options_.pool = std::make_shared<WorkPool>(1);
      // One row queued while the tile thread writes the one before: both rows' tiles are in the pool, a row
      // of tiles each (32 at 8192 px), which keeps the pool's threads busy without holding more rows.
      tile_queue_ = std::make_unique<BoundedQueue<TileRow>>(1);
      tile_thread_ = std::thread([this] {
        while (auto row = tile_queue_->pop()) {
          if (tileError()) continue;  // keep draining: the caller must never block on a dead thread
          try {
            writeTileRow(*row);
          } catch (...) {
            std::lock_guard<std::mutex> lock(tile_error_mutex_);
            tile_error_ = std::current_exception();
          }
        }
      });
    }
    if (options_.pyramid) {
      WriterOptions lo = options_;
      lo.pyramid = false;
      lo.background = false;  // the level thread writes them
      lo.metadata_from.clear();
      lo.description.clear();
      for (int64_t w = width, h = height; std::max(w, h) > options_.tile;) {
        w = (w + 1) / 2;
        h = (h + 1) / 2;
        const std::string level_path = path + ".level" + std::to_string(levels_.size() + 1);
        levels_.push_back(Level{std::make_unique<ImageWriter>(level_path, w, h, channels, type, lo), {}});
      }
    }
    if (!levels_.empty()) {
      level_queue_ = std::make_unique<BoundedQueue<cv::Mat>>(2);
      level_thread_ = std::thread([this] {
        while (auto band = level_queue_->pop()) {
          if (level_error_) continue;  // keep draining: the writer must never block on a dead thread
          try {
            feedLevel(0, *band);
          } catch (...) {
            level_error_ = std::current_exception();
          }
        }
      });
    }
  } else if (options_.format == "png" || options_.format == "jpg" || options_.format == "jpeg") {
    TILER_CHECK(width * height <= kMaxInMemoryPixels && width < 65536 && height < 65536, IoError,
                "'" << path << "': " << width << "x" << height << " is too large for " << options_.format
                    << " output (at most " << kMaxInMemoryPixels
                    << " pixels, 65535 a side); use --format tif");
    TILER_CHECK((type != SampleType::kF32 && type != SampleType::kF16) || options_.format != "png", IoError,
                "'" << path << "': PNG cannot hold float samples; use --format tif");
    buffer_ = cv::Mat(int(height), int(width), cv_type);
    // Claim the name early so that an unwritable directory fails before any work.
    const int fd = createFileExclusively(partialPath());
    TILER_CHECK(fd >= 0, IoError, "'" << partialPath() << "': cannot create: " << std::strerror(errno));
    ::close(fd);
  } else {
    TILER_THROW(ConfigError, "unknown output format '" << options_.format << "' (tif or png)");
  }
}

ImageWriter::~ImageWriter() {
  stopLevelThread();
  if (!done_) abandon();
}

void ImageWriter::stopLevelThread() noexcept {
  if (level_queue_) level_queue_->close();
  if (level_thread_.joinable()) level_thread_.join();
}

void ImageWriter::abandon() noexcept {
  stopTileThread();  // it writes through tiff_
  if (tiff_) {
    TIFFClose(static_cast<TIFF*>(tiff_));
    tiff_ = nullptr;
    t_tiff_error.clear();
  }
  std::remove(partialPath().c_str());
  done_ = true;
}

size_t ImageWriter::bufferedBytes() const {
  // The row being filled, the rows queued, and the one the tile thread writes.
  const size_t rows = tile_queue_ ? 3 : 1;
  return buffer_.total() * buffer_.elemSize() * rows;
}

void ImageWriter::writeRows(const cv::Mat& band) {
  TILER_CHECK(!done_ && !finished_, IoError, "'" << path_ << "': write after close");
  TILER_CHECK(band.cols == width_ && band.type() == buffer_.type(), IoError,
              "'" << path_ << "': band of " << band.cols << " columns / type " << band.type() << ", expected "
                  << width_ << " / " << buffer_.type());
  TILER_CHECK(rows_written_ + buffered_rows_ + band.rows <= height_, IoError,
              "'" << path_ << "': more rows than the image's " << height_);
  if (tiff_ == nullptr) {
    band.copyTo(buffer_.rowRange(int(rows_written_), int(rows_written_ + band.rows)));
    rows_written_ += band.rows;
    return;
  }
  if (level_queue_) level_queue_->push(band.clone());
  int consumed = 0;
  while (consumed < band.rows) {
    int take = std::min(band.rows - consumed, int(options_.tile - buffered_rows_));
    band.rowRange(consumed, consumed + take)
        .copyTo(buffer_.rowRange(int(buffered_rows_), int(buffered_rows_ + take)));
    buffered_rows_ += take;
    consumed += take;
    if (buffered_rows_ == options_.tile) flushTileRow(buffered_rows_);
  }
}

void ImageWriter::flushTileRow(int64_t rows) {
  TileRow row = encodeTileRow(buffer_, rows_written_, rows);
  buffer_ = spareRow();  // the pool's tasks hold the last one
  if (tile_queue_) {
    if (!tile_queue_->push(std::move(row)) || tileError()) failOnTileError();
  } else {
    try {
      writeTileRow(row);
    } catch (...) {
      abandon();
      throw;
    }
  }
  rows_written_ += rows;
  buffered_rows_ = 0;
}

ImageWriter::TileRow ImageWriter::encodeTileRow(cv::Mat buffer, int64_t first_row, int64_t rows) {
  const int tile = options_.tile;
  const size_t px = buffer.elemSize();
  for (int y = int(rows); y < tile; ++y) std::memset(buffer.ptr(y), 0, size_t(width_) * px);
  auto encoding = std::make_shared<TileEncoding>();
  encoding->channels = channels_;
  encoding->type = type_;
  encoding->options = options_;
  encoding->options.pool.reset();
  TileRow row;
  row.first_row = first_row;
  row.buffer = buffer;
  for (int64_t x0 = 0; x0 < width_; x0 += tile) {
    auto task = [buffer, x0, encoding, width = width_, fault = tile_fault_, path = path_] {
      if (fault->load())
        throw std::runtime_error("TILER_FAULT: injected failure while compressing a tile of '" + path + "'");
      const int edge = encoding->options.tile;
      const size_t pixel = buffer.elemSize();
      std::vector<uint8_t> samples(size_t(edge) * size_t(edge) * pixel, 0);
      const int64_t w = std::min<int64_t>(edge, width - x0);
      for (int y = 0; y < edge; ++y)
        std::memcpy(samples.data() + size_t(y) * size_t(edge) * pixel,
                    buffer.ptr<uint8_t>(y) + size_t(x0) * pixel, size_t(w) * pixel);
      return encodeTile(samples, *encoding);
    };
    if (options_.pool) {
      row.tiles.push_back(options_.pool->submit(std::move(task)));
    } else {
      std::packaged_task<std::vector<uint8_t>()> now(std::move(task));
      row.tiles.push_back(now.get_future());
      now();
    }
  }
  return row;
}

cv::Mat ImageWriter::spareRow() {
  std::lock_guard<std::mutex> lock(spare_mutex_);
  if (spare_rows_.empty()) return cv::Mat(options_.tile, int(width_), cv_type_);
  cv::Mat row = spare_rows_.back();
  spare_rows_.pop_back();
  return row;
}

void ImageWriter::writeTileRow(TileRow& row) {
  TIFF* tif = static_cast<TIFF*>(tiff_);
  for (size_t k = 0; k < row.tiles.size(); ++k) {
    std::vector<uint8_t> bytes;
    try {
      bytes = row.tiles[k].get();
    } catch (const Error& e) {
      TILER_THROW(IoError, "'" << path_ << "': tile at row " << row.first_row << ": " << e.message());
    }
    const uint32_t index =
        TIFFComputeTile(tif, uint32_t(k) * uint32_t(options_.tile), uint32_t(row.first_row), 0, 0);
    t_tiff_error.clear();
    errno = 0;
    if (TIFFWriteRawTile(tif, index, bytes.data(), tmsize_t(bytes.size())) != tmsize_t(bytes.size())) {
      const int write_errno = errno;
      std::string err = takeTiffError();
      TILER_THROW(IoError, "'" << path_ << "': writing tile at row " << row.first_row << " failed: "
                               << (write_errno ? std::strerror(write_errno) : err) << " (" << err << ")");
    }
  }
  // Every tile was taken from its future, so no task refers to the buffer any more.
  std::lock_guard<std::mutex> lock(spare_mutex_);
  spare_rows_.push_back(std::move(row.buffer));
}

void ImageWriter::stopTileThread() noexcept {
  if (tile_queue_) tile_queue_->close();
  if (tile_thread_.joinable()) tile_thread_.join();
}

std::exception_ptr ImageWriter::tileError() {
  std::lock_guard<std::mutex> lock(tile_error_mutex_);
  return tile_error_;
}

void ImageWriter::failOnTileError() {
  stopTileThread();
  const std::exception_ptr error = tileError();
  abandon();
  if (error) std::rethrow_exception(error);
  TILER_THROW(IoError, "'" << path_ << "': the tile thread stopped");
}

SampleType labelSampleType(int classes) {
  return classes > 256 ? SampleType::kU16 : SampleType::kU8;
}

void ImageWriter::close() {
  finish();
  commit();
}

void ImageWriter::feedLevel(size_t li, const cv::Mat& rows) {
  Level& level = levels_[li];
  const int half = (rows.cols + 1) / 2;
  const int interpolation = options_.nearest ? cv::INTER_NEAREST : cv::INTER_AREA;
  std::vector<cv::Mat> made;
  int y = 0;
  if (!level.pending.empty() && rows.rows > 0) {
    cv::Mat pair, reduced;
    cv::vconcat(level.pending, rows.row(0), pair);
    cv::resize(pair, reduced, cv::Size(half, 1), 0, 0, interpolation);
    made.push_back(reduced);
    level.pending.release();
    y = 1;
  }
  // Whole pairs in one call (halving 2k rows to k is the same pair by pair); an odd row waits for its pair.
  const int pairs = (rows.rows - y) / 2;
  if (pairs > 0) {
    cv::Mat reduced;
    cv::resize(rows.rowRange(y, y + 2 * pairs), reduced, cv::Size(half, pairs), 0, 0, interpolation);
    made.push_back(reduced);
    y += 2 * pairs;
  }
  if (y < rows.rows) level.pending = rows.row(y).clone();
  if (made.empty()) return;
  cv::Mat out;
  cv::vconcat(made, out);
  level.writer->writeRows(out);
  if (li + 1 < levels_.size()) feedLevel(li + 1, out);
}

void ImageWriter::finishLevels() {
  stopLevelThread();
  if (level_error_) std::rethrow_exception(level_error_);
  // An odd last row of a level halves alone; then every level's file is closed (still temporary).
  for (size_t li = 0; li < levels_.size(); ++li) {
    Level& level = levels_[li];
    if (!level.pending.empty()) {
      cv::Mat reduced;
      cv::resize(level.pending, reduced, cv::Size((level.pending.cols + 1) / 2, 1), 0, 0,
                 options_.nearest ? cv::INTER_NEAREST : cv::INTER_AREA);
      level.pending.release();
      level.writer->writeRows(reduced);
      if (li + 1 < levels_.size()) feedLevel(li + 1, reduced);
    }
    level.writer->finish();
  }
}

bool ImageWriter::appendLevels(void* handle) {
  TIFF* tif = static_cast<TIFF*>(handle);
  for (auto& level : levels_) {
    TIFF* src = TIFFOpen(level.writer->partialPath().c_str(), "r");
    if (src == nullptr) return false;
    uint32_t w = 0, h = 0;
    TIFFGetField(src, TIFFTAG_IMAGEWIDTH, &w);
    TIFFGetField(src, TIFFTAG_IMAGELENGTH, &h);
    setTiffFields(tif, w, h, channels_, type_, options_, true);
    // The level's tiles are already compressed with the same settings: copied as they are.
    std::vector<uint8_t> raw;
    uint64_t* counts = nullptr;
    bool ok = TIFFGetField(src, TIFFTAG_TILEBYTECOUNTS, &counts) && counts != nullptr;
    for (ttile_t t = 0; ok && t < TIFFNumberOfTiles(src); ++t) {
      raw.resize(size_t(counts[t]));
      const tmsize_t n = TIFFReadRawTile(src, t, raw.data(), tmsize_t(raw.size()));
      ok = n >= 0 && TIFFWriteRawTile(tif, t, raw.data(), n) == n;
    }
    TIFFClose(src);
    if (!ok || !TIFFWriteDirectory(tif)) return false;
  }
  levels_.clear();  // their writers remove the temporary files
  return true;
}

void ImageWriter::finish() {
  TILER_CHECK(!done_ && !finished_, IoError, "'" << path_ << "': closed twice");
  if (tiff_ != nullptr) {
    if (buffered_rows_ > 0) flushTileRow(buffered_rows_);
    stopTileThread();
    if (tileError()) failOnTileError();
    TILER_CHECK(rows_written_ == height_, IoError,
                "'" << path_ << "': closed after " << rows_written_ << " of " << height_ << " rows");
    TIFF* tif = static_cast<TIFF*>(tiff_);
    t_tiff_error.clear();
    errno = 0;
    finishLevels();
    bool ok = TIFFWriteDirectory(tif) && appendLevels(tif) && TIFFFlush(tif);
    std::string err = ok ? "" : (errno ? std::string(std::strerror(errno)) + ": " : "") + takeTiffError();
    TIFFClose(tif);
    tiff_ = nullptr;
    if (!ok) {
      abandon();
      TILER_THROW(IoError, "'" << path_ << "': finishing the TIFF failed: " << err);
    }
  } else {
    TILER_CHECK(rows_written_ == height_, IoError,
                "'" << path_ << "': closed after " << rows_written_ << " of " << height_ << " rows");
    cv::Mat out = buffer_;
    if (channels_ == 3) cv::cvtColor(buffer_, out, cv::COLOR_RGB2BGR);
    if (channels_ == 4) cv::cvtColor(buffer_, out, cv::COLOR_RGBA2BGRA);
    std::vector<uchar> bytes;
    bool ok = cv::imencode("." + options_.format, out, bytes);
    if (ok) {
      // Created anew, not reopened: the claimed name may have been replaced by a link meanwhile.
      const int fd = createFileExclusively(partialPath());
      ok = fd >= 0 && writeAll(fd, bytes.data(), bytes.size());
      if (fd >= 0 && ::close(fd) != 0) ok = false;
    }
    if (!ok) {
      int err = errno;
      abandon();
      TILER_THROW(IoError,
                  "'" << path_ << "': writing " << options_.format << " failed: " << std::strerror(err));
    }
  }
  finished_ = true;
}

void ImageWriter::commit() {
  TILER_CHECK(finished_ && !done_, IoError, "'" << path_ << "': commit before finish, or twice");
  if (std::rename(partialPath().c_str(), path_.c_str()) != 0) {
    int err = errno;
    abandon();
    TILER_THROW(IoError, "'" << path_ << "': rename from .partial failed: " << std::strerror(err));
  }
  done_ = true;
}

}  // namespace tiler
