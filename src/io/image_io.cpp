#include "tiler/io/image_io.hpp"

#include <spdlog/spdlog.h>
#include <tiffio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>
#include <thread>

#include "readers/tiff_support.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/fault.hpp"
#include "tiler/core/platform.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// The codec, its level and the predictor; throws ConfigError when this libtiff refuses one of them.
void setCompressionFields(TIFF* tif, const Compression& c, bool floats) {
  static const uint16_t kCodes[] = {COMPRESSION_ADOBE_DEFLATE, COMPRESSION_ZSTD, COMPRESSION_LZW,
                                    COMPRESSION_NONE};
  const uint16_t code = kCodes[int(c.codec)];
  TILER_CHECK(TIFFIsCODECConfigured(code), ConfigError,
              "this libtiff cannot write --compression " << compressionName(c));
  TIFFSetField(tif, TIFFTAG_COMPRESSION, code);
  if (c.level > 0) {
    clearTiffError();
    const int ok =
        TIFFSetField(tif, c.codec == Codec::kZstd ? TIFFTAG_ZSTD_LEVEL : TIFFTAG_ZIPQUALITY, c.level);
    TILER_CHECK(ok == 1, ConfigError,
                "this libtiff cannot write --compression " << compressionName(c) << ": " << takeTiffError());
  }
  if (c.codec != Codec::kNone && c.predictor)
    TIFFSetField(tif, TIFFTAG_PREDICTOR, floats ? PREDICTOR_FLOATINGPOINT : PREDICTOR_HORIZONTAL);
}

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
  setCompressionFields(tif, *o.compression, floats);
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

// A TIFF in memory over `file`, for writing; throws IoError when libtiff cannot open one.
TIFF* openTiffInMemory(MemoryFile& file, const char* name) {
  clearTiffError();
  TIFF* tif = TIFFClientOpen(name, "w", &file, memoryRead, memoryWrite, memorySeek, memoryClose, memorySize,
                             memoryMap, memoryUnmap);
  TILER_CHECK(tif != nullptr, IoError, "cannot open a TIFF in memory: " << takeTiffError());
  return tif;
}

// How a writer's tiles are encoded; shared by the pool's tasks of one writer.
struct TileEncoding {
  int channels = 1;
  SampleType type = SampleType::kU8;
  WriterOptions options;  // without the pool: a queued task must not keep its own pool alive
};

// A one-tile TIFF in memory that a thread keeps from tile to tile while the encoding stays the same: opening
// one per tile set up the codec's context (zstd's is over a megabyte) and libtiff's buffers every time, and
// the page faults of those fresh buffers took a sixth of a write-bound job's time. libtiff starts its codec
// afresh on each tile (PreEncode), so the bytes do not depend on what the handle encoded before.
struct TileEncoder {
  int channels = 0, tile = 0;
  SampleType type = SampleType::kU8;
  Compression compression;
  MemoryFile file;
  size_t header_bytes = 0;  // what TIFFClientOpen wrote; each tile is written right after it
  TIFF* tif = nullptr;
  ~TileEncoder() {
    if (tif != nullptr) TIFFCleanup(tif);  // frees it without writing a directory nobody reads
  }
  bool encodes(int c, int t, SampleType s, const Compression& codec) const {
    return tif != nullptr && channels == c && tile == t && type == s && compression == codec;
  }
};

// libtiff's floating-point predictor (Predictor 3, tif_predict.c's fpDiff) on each row of a tile, in place:
// the row's bytes regrouped by significance (the most significant byte of every sample first, as libtiff
// orders them on this host), then each byte less the one `stride` (samples a pixel) before it. libtiff's own
// copies the tile, allocates a buffer a row and moves one byte at a time (docs/performance.md: the predictor
// then cost as much as zstd); the bytes are the same (ImageWriter.PooledCompressionStoresWhatLibtiffStores).
template <int kBytes>
void floatingPointDifference(uint8_t* tile, size_t rows, size_t row_bytes, size_t stride,
                             std::vector<uint8_t>& planes) {
  // 16 bytes at a time where the compiler has vectors (SSE2, NEON), else as many scalar subtractions.
  typedef uint8_t Bytes16 __attribute__((vector_size(16)));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  constexpr bool kBig = true;
#else
  constexpr bool kBig = false;
#endif
  const size_t samples = row_bytes / kBytes;
  planes.resize(row_bytes);
  for (size_t r = 0; r < rows; ++r) {
    uint8_t* row = tile + r * row_bytes;
    // toM: where byte M of each sample in memory goes (libtiff: the most significant plane first).
    uint8_t* const to0 = planes.data() + size_t(kBig ? 0 : kBytes - 1) * samples;
    uint8_t* const to1 = planes.data() + size_t(kBig ? 1 : kBytes - 2) * samples;
    if constexpr (kBytes == 4) {
      uint8_t* const to2 = planes.data() + size_t(kBig ? 2 : 1) * samples;
      uint8_t* const to3 = planes.data() + size_t(kBig ? 3 : 0) * samples;
      size_t i = 0;
      // 16 samples at a time: three rounds of byte interleaving take 4 x 16 bytes to their 4 planes (what
      // SSE2's punpck and NEON's zips do, whichever the compiler has).
      for (; i + 16 <= samples; i += 16) {
        Bytes16 a, b, c, d;
        std::memcpy(&a, row + i * 4, 16);
        std::memcpy(&b, row + i * 4 + 16, 16);
        std::memcpy(&c, row + i * 4 + 32, 16);
        std::memcpy(&d, row + i * 4 + 48, 16);
        const auto low = [](Bytes16 x, Bytes16 y) {
          return __builtin_shufflevector(x, y, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        };
        const auto high = [](Bytes16 x, Bytes16 y) {
          return __builtin_shufflevector(x, y, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        };
        const Bytes16 t0 = low(a, b), t1 = high(a, b), t2 = low(c, d), t3 = high(c, d);
        const Bytes16 u0 = low(t0, t1), u1 = high(t0, t1), u2 = low(t2, t3), u3 = high(t2, t3);
        const Bytes16 v0 = low(u0, u1), v1 = high(u0, u1), v2 = low(u2, u3), v3 = high(u2, u3);
        // v0: byte 0 of samples 0-7, then byte 1; v1: bytes 2 and 3; v2, v3: the same of samples 8-15.
        const Bytes16 m0 =
            __builtin_shufflevector(v0, v2, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
        const Bytes16 m1 =
            __builtin_shufflevector(v0, v2, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
        const Bytes16 m2 =
            __builtin_shufflevector(v1, v3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
        const Bytes16 m3 =
            __builtin_shufflevector(v1, v3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
        std::memcpy(to0 + i, &m0, 16);
        std::memcpy(to1 + i, &m1, 16);
        std::memcpy(to2 + i, &m2, 16);
        std::memcpy(to3 + i, &m3, 16);
      }
      for (; i < samples; ++i) {
        to0[i] = row[i * 4];
        to1[i] = row[i * 4 + 1];
        to2[i] = row[i * 4 + 2];
        to3[i] = row[i * 4 + 3];
      }
    } else {
      for (size_t i = 0; i < samples; ++i) {
        to0[i] = row[i * 2];
        to1[i] = row[i * 2 + 1];
      }
    }
    const uint8_t* p = planes.data();
    const size_t head = std::min(stride, row_bytes);
    std::memcpy(row, p, head);
    size_t j = head;
    for (; j + 16 <= row_bytes; j += 16) {
      Bytes16 now, before;
      std::memcpy(&now, p + j, 16);
      std::memcpy(&before, p + j - stride, 16);
      now -= before;
      std::memcpy(row + j, &now, 16);
    }
    for (; j < row_bytes; ++j) row[j] = uint8_t(p[j] - p[j - stride]);
  }
}

// One tile (tile x tile samples, zero padded) compressed exactly as TIFFWriteEncodedTile would into the
// output: the same fields, codec and predictor, written as tile 0 of a one-tile TIFF in memory and cut out.
// Floats' predictor is applied here (floatingPointDifference) and the codec given the result.
std::vector<uint8_t> encodeTile(std::vector<uint8_t>& samples, const TileEncoding& e) {
  thread_local std::unique_ptr<TileEncoder> encoder;
  thread_local std::vector<uint8_t> planes;
  Compression codec = *e.options.compression;
  const bool floats = e.type == SampleType::kF32 || e.type == SampleType::kF16;
  if (floats && codec.predictor && codec.codec != Codec::kNone) {
    const size_t tile = size_t(e.options.tile), bytes = bytesPerSample(e.type);
    const size_t row_bytes = tile * size_t(e.channels) * bytes;
    if (bytes == 4)
      floatingPointDifference<4>(samples.data(), tile, row_bytes, size_t(e.channels), planes);
    else
      floatingPointDifference<2>(samples.data(), tile, row_bytes, size_t(e.channels), planes);
    codec.predictor = false;
  }
  if (!encoder || !encoder->encodes(e.channels, e.options.tile, e.type, codec)) {
    auto fresh = std::make_unique<TileEncoder>();
    fresh->tif = openTiffInMemory(fresh->file, "tile");
    WriterOptions o = e.options;
    o.compression = codec;
    setTiffFields(fresh->tif, o.tile, o.tile, e.channels, e.type, o, false);
    fresh->channels = e.channels;
    fresh->tile = e.options.tile;
    fresh->type = e.type;
    fresh->compression = codec;
    fresh->header_bytes = fresh->file.bytes.size();
    encoder = std::move(fresh);
  }
  // A tile written before has a byte count, so libtiff appends this one at the end of the file: cut the file
  // back to its header first, and it lands where the last one did, in memory the thread already has.
  encoder->file.bytes.resize(encoder->header_bytes);
  encoder->file.pos = encoder->header_bytes;
  TIFF* tif = encoder->tif;
  const std::vector<uint8_t>& bytes = encoder->file.bytes;
  uint64_t* offsets = nullptr;
  uint64_t* counts = nullptr;
  clearTiffError();
  const bool ok = TIFFWriteEncodedTile(tif, 0, samples.data(), tmsize_t(samples.size())) >= 0 &&
                  TIFFGetField(tif, TIFFTAG_TILEOFFSETS, &offsets) &&
                  TIFFGetField(tif, TIFFTAG_TILEBYTECOUNTS, &counts) && offsets != nullptr &&
                  counts != nullptr && offsets[0] + counts[0] <= bytes.size();
  if (!ok) {
    encoder.reset();  // a codec that failed may have left its state half way
    TILER_THROW(IoError, "compressing a tile failed: " << takeTiffError());
  }
  return std::vector<uint8_t>(bytes.begin() + std::ptrdiff_t(offsets[0]),
                              bytes.begin() + std::ptrdiff_t(offsets[0] + counts[0]));
}

// Tile `x0` of a row of tiles (`edge` rows of an image `width` wide) into `samples`, zero padded past the
// image's right edge: what libtiff's encoder takes (and what its predictor overwrites).
void cutTile(const cv::Mat& row, int64_t x0, int64_t width, int edge, std::vector<uint8_t>& samples) {
  const size_t pixel = row.elemSize();
  const size_t w = size_t(std::min<int64_t>(edge, width - x0)), row_bytes = size_t(edge) * pixel;
  samples.resize(size_t(edge) * row_bytes);
  for (int y = 0; y < edge; ++y) {
    uint8_t* to = samples.data() + size_t(y) * row_bytes;
    std::memcpy(to, row.ptr<uint8_t>(y) + size_t(x0) * pixel, w * pixel);
    std::memset(to + w * pixel, 0, row_bytes - w * pixel);
  }
}

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

const char* const kTilerSoftware = "tiler " TILER_VERSION;

bool isTilerOutputFile(const std::string& path) {
  if (!looksLikeTiff(path)) return false;
  installTiffHandlers();
  TIFF* tif = TIFFOpen(path.c_str(), "r");  // reads the first directory only
  if (tif == nullptr) return false;
  char* software = nullptr;
  const bool ours = TIFFGetField(tif, TIFFTAG_SOFTWARE, &software) && software != nullptr &&
                    std::string(software).rfind("tiler ", 0) == 0;
  TIFFClose(tif);
  return ours;
}

Compression parseCompression(const std::string& text) {
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  Compression c;
  int max_level = 0;
  if (name == "deflate" || name == "zip") {
    c.codec = Codec::kDeflate;
    max_level = 12;
  } else if (name == "zstd") {
    c.codec = Codec::kZstd;
    max_level = 22;
  } else if (name == "lzw") {
    c.codec = Codec::kLzw;
  } else if (name == "none") {
    c.codec = Codec::kNone;
  } else {
    TILER_THROW(ConfigError,
                "--compression must be deflate[:LEVEL], zstd[:LEVEL], lzw or none; got '" << text << "'");
  }
  if (colon == std::string::npos) return c;
  const std::string level = text.substr(colon + 1);
  TILER_CHECK(max_level > 0, ConfigError,
              "--compression " << name << " takes no level; got '" << text << "'");
  const bool digits = !level.empty() && level.size() <= 2 &&
                      std::all_of(level.begin(), level.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  c.level = digits ? std::stoi(level) : 0;
  TILER_CHECK(
      c.level >= 1 && c.level <= max_level, ConfigError,
      "--compression " << name << " takes a level from 1 to " << max_level << "; got '" << text << "'");
  return c;
}

std::string compressionName(const Compression& c) {
  static const char* kNames[] = {"deflate", "zstd", "lzw", "none"};
  std::string name = kNames[int(c.codec)];
  if (c.level > 0) name += ":" + std::to_string(c.level);
  if (!c.predictor && c.codec != Codec::kNone) name += " without predictor";
  return name;
}

void checkCompression(const Compression& c) {
  MemoryFile file;
  const std::unique_ptr<TIFF, void (*)(TIFF*)> tif(openTiffInMemory(file, "check"), TIFFCleanup);
  setCompressionFields(tif.get(), c, false);
}

// The trade scripts/bench.sh codecs measures (docs/performance.md, "Output codecs"): floats compress much
// faster as zstd level 1 with the floating-point predictor than as deflate at its default level, to files of
// about its size (the predictor matters on smooth outputs); u8 and u16 probabilities go with them (whoever
// reads the f32 file reads zstd), without differencing, several times deflate's pace and smaller. Labels stay
// deflate (every TIFF reader has it, Debian's tifffile without imagecodecs included), at level 1 and without
// differencing (categories), faster than level 6 with it and about as small.
Compression defaultCompression(SampleType type, RasterValues values) {
  const bool floats = type == SampleType::kF32 || type == SampleType::kF16;
  if (!floats && values == RasterValues::kCategories) return {Codec::kDeflate, 1, false};
  if (TIFFIsCODECConfigured(COMPRESSION_ZSTD)) return {Codec::kZstd, 1, floats};
  return {Codec::kDeflate, 1, floats};  // a libtiff without zstd
}

size_t compressorBytes(const Compression& c) {
  // ZSTD_estimateCStreamSize(level) of libzstd 1.5.4, in MB rounded up: the parameters of each level for an
  // unknown source size (ZSTD_initCStream's, which libtiff calls) are zstd's fixed table; 0 is libtiff's 9.
  static const int kZstdMegabytes[] = {18, 2,  3,  4,  5,  6,  6,  10, 10,  18,  31, 31,
                                       56, 56, 56, 73, 73, 73, 73, 94, 203, 405, 816};
  if (c.codec != Codec::kZstd) return size_t(1) << 20;  // deflate's and lzw's state are under a megabyte
  return size_t(kZstdMegabytes[std::clamp(c.level, 0, 22)]) << 20;
}

int compressionThreads(const Compression& c, int requested) {
  const size_t fit = std::max<size_t>(1, kCompressorBudgetBytes / compressorBytes(c));
  if (size_t(requested) <= fit) return requested;
  spdlog::warn("--compression {}: {} compressing threads instead of {} (each holds {} MB for its codec)",
               compressionName(c), fit, requested, compressorBytes(c) >> 20);
  return int(fit);
}

bool keepsPredictor(size_t with, size_t without, size_t raw) {
  const bool background = without * 64 <= raw, smaller = with * 102 < without * 100;
  const bool compressible = without * 3 <= raw && with * 3 <= raw, cheap = with * 4 <= without * 5;
  return background || smaller || (compressible && cheap);
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
  const bool tiff = options_.format == "tif" || options_.format == "tiff";
  const WriteTarget target = writeTargetOf(path);
  TILER_CHECK(target.refused.empty(), IoError, target.refused);
  stream_ = target.stream;
  TILER_CHECK(!(stream_ && tiff), IoError,
              "'" << path << "' is a character device or FIFO; a TIFF is written to a file (it seeks back)");
  if (!options_.compression) {
    options_.compression = defaultCompression(type, options_.values);
    // Floats: the predictor only where it pays, decided on the first row of tiles (choosePredictor).
    choose_predictor_ =
        tiff && options_.compression->predictor && (type == SampleType::kF32 || type == SampleType::kF16);
    if (choose_predictor_) options_.compression->predictor = false;  // until chosen
  }
  if (tiff) {
    openTiff();
    openLevels();
    startThreads();
  } else if (options_.format == "png") {
    openPng();
  } else {
    TILER_THROW(ConfigError, "unknown output format '" << options_.format << "' (tif or png)");
  }
}

// The TIFF under its partial name, its fields and metadata, and the buffer of one row of tiles.
void ImageWriter::openTiff() {
  TILER_CHECK(type_ != SampleType::kI16, IoError,
              "'" << path_ << "': writer takes u8, u16, u32, f16 or f32 samples");
  TILER_CHECK(options_.tile % 16 == 0 && options_.tile > 0, ConfigError,
              "TIFF tile must be a multiple of 16");
  installTiffHandlers();
  TILER_CHECK(
      options_.colormap.empty() || (channels_ == 1 && type_ != SampleType::kF32 && type_ != SampleType::kF16),
      ConfigError, "'" << path_ << "': a colour map needs one integer channel");
  const uint64_t raw = uint64_t(width_) * uint64_t(height_) * uint64_t(channels_) * bytesPerSample(type_);
  // Reduced levels add at most a third.
  const bool big = (options_.pyramid ? raw + raw / 3 : raw) > (uint64_t(1) << 31);
  clearTiffError();
  const int fd = createFileExclusively(partialPath());
  TILER_CHECK(fd >= 0, IoError, "'" << partialPath() << "': cannot create: " << std::strerror(errno));
  TIFF* tif = TIFFFdOpen(fd, partialPath().c_str(), big ? "w8" : "w");
  if (tif == nullptr) {
    // TIFFFdOpen writes the header at once: on a full disk the file exists, empty. Nothing is left behind.
    const std::string why = takeTiffError();
    ::close(fd);
    ::unlink(partialPath().c_str());
    TILER_THROW(IoError, "'" << partialPath() << "': cannot create: " << why);
  }
  tiff_ = tif;
  setTiffFields(tif, width_, height_, channels_, type_, options_, false);
  if (!options_.description.empty())
    TIFFSetField(tif, TIFFTAG_IMAGEDESCRIPTION, options_.description.c_str());
  if (!options_.software.empty()) TIFFSetField(tif, TIFFTAG_SOFTWARE, options_.software.c_str());
  if (options_.value_scale) {
    std::ostringstream items;
    items.precision(17);
    items << "<GDALMetadata>";
    for (int band = 0; band < channels_; ++band)
      items << "<Item name=\"SCALE\" sample=\"" << band << "\" role=\"scale\">" << *options_.value_scale
            << "</Item><Item name=\"OFFSET\" sample=\"" << band << "\" role=\"offset\">0</Item>";
    items << "</GDALMetadata>";
    TIFFSetField(tif, kGdalMetadata, items.str().c_str());
  }
  if (options_.nodata) {
    std::ostringstream text;
    text.precision(17);
    text << *options_.nodata;
    TIFFSetField(tif, kGdalNodata, std::isnan(*options_.nodata) ? "nan" : text.str().c_str());
  }
  writeMetadata(tif, readMetadata(options_.metadata_from), options_.metadata_scale, options_.mpp);
  buffer_ = cv::Mat(options_.tile, int(width_), cv_type_);
}

// The reduced levels (--pyramid), each an ImageWriter of its own, fed by the level thread.
void ImageWriter::openLevels() {
  if (options_.pyramid) {
    WriterOptions lo = options_;
    lo.pyramid = false;
    lo.background = false;  // the level thread writes them
    lo.metadata_from.clear();
    lo.description.clear();
    if (choose_predictor_) lo.compression.reset();  // each level chooses on its own first row
    for (int64_t w = width_, h = height_; std::max(w, h) > options_.tile;) {
      w = (w + 1) / 2;
      h = (h + 1) / 2;
      const std::string level_path = path_ + ".level" + std::to_string(levels_.size() + 1);
      levels_.push_back(Level{std::make_unique<ImageWriter>(level_path, w, h, channels_, type_, lo), {}});
    }
  }
}

// The tile thread (background compression) and the level thread, where they are asked for.
void ImageWriter::startThreads() {
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
}

// A PNG is encoded whole at the end: its buffer, and its name claimed now.
void ImageWriter::openPng() {
  TILER_CHECK(width_ * height_ <= kMaxInMemoryPixels && width_ < 65536 && height_ < 65536, IoError,
              "'" << path_ << "': " << width_ << "x" << height_ << " is too large for " << options_.format
                  << " output (at most " << kMaxInMemoryPixels << " pixels, 65535 a side); use --format tif");
  TILER_CHECK((type_ != SampleType::kF32 && type_ != SampleType::kF16) || options_.format != "png", IoError,
              "'" << path_ << "': PNG cannot hold float samples; use --format tif");
  buffer_ = cv::Mat(int(height_), int(width_), cv_type_);
  // Claim the name early so that an unwritable directory fails before any work.
  const int fd = createFileExclusively(partialPath());
  TILER_CHECK(fd >= 0, IoError, "'" << partialPath() << "': cannot create: " << std::strerror(errno));
  ::close(fd);
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
    clearTiffError();
  }
  if (!stream_) std::remove(partialPath().c_str());
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
  if (choose_predictor_) choosePredictor(buffer, rows);
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
        throw std::runtime_error(injectedFailure("failure while compressing a tile of '" + path + "'"));
      // The thread's own buffer, as the encoder (the predictor differences it in place).
      thread_local std::vector<uint8_t> samples;
      cutTile(buffer, x0, width, encoding->options.tile, samples);
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

void ImageWriter::choosePredictor(const cv::Mat& row, int64_t rows) {
  choose_predictor_ = false;
  const int tile = options_.tile;
  const int64_t tiles = (width_ + tile - 1) / tile, sampled = std::min<int64_t>(tiles, kPredictorSampleTiles);
  // Each way in turn (an encoder per thread is kept while its encoding stays the same).
  auto bytesOf = [&](bool predictor) {
    TileEncoding e{channels_, type_, options_};
    e.options.pool.reset();
    e.options.compression->predictor = predictor;
    std::vector<uint8_t> samples;
    size_t bytes = 0;
    for (int64_t k = 0; k < sampled; ++k) {
      cutTile(row, k * tiles / sampled * tile, width_, tile, samples);
      bytes += encodeTile(samples, e).size();
    }
    return bytes;
  };
  // The image's own samples in those tiles: their zero padding would make noise look compressible.
  size_t raw = 0;
  for (int64_t k = 0; k < sampled; ++k)
    raw += size_t(std::min<int64_t>(tile, width_ - k * tiles / sampled * tile) * rows) * row.elemSize();
  const size_t with = bytesOf(true), without = bytesOf(false);
  const bool predictor = keepsPredictor(with, without, raw);
  spdlog::debug("'{}': {} bytes with the floating-point predictor, {} without, of {} ({} tiles): {}", path_,
                with, without, raw, sampled, predictor ? "with" : "without");
  options_.compression->predictor = predictor;
  if (predictor) TIFFSetField(static_cast<TIFF*>(tiff_), TIFFTAG_PREDICTOR, PREDICTOR_FLOATINGPOINT);
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
    clearTiffError();
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

// OpenCV's resize takes no half floats, so f16 is halved in f32 and rounded back.
cv::Mat halve(const cv::Mat& rows, cv::Size size, int interpolation) {
  cv::Mat out;
  if (rows.depth() != CV_16F) {
    cv::resize(rows, out, size, 0, 0, interpolation);
    return out;
  }
  cv::Mat wide;
  rows.convertTo(wide, CV_32F);
  cv::resize(wide, wide, size, 0, 0, interpolation);
  wide.convertTo(out, CV_16F);
  return out;
}

void ImageWriter::feedLevel(size_t li, const cv::Mat& rows) {
  Level& level = levels_[li];
  const int half = (rows.cols + 1) / 2;
  const int interpolation = options_.nearest ? cv::INTER_NEAREST : cv::INTER_AREA;
  std::vector<cv::Mat> made;
  int y = 0;
  if (!level.pending.empty() && rows.rows > 0) {
    cv::Mat pair;
    cv::vconcat(level.pending, rows.row(0), pair);
    made.push_back(halve(pair, cv::Size(half, 1), interpolation));
    level.pending.release();
    y = 1;
  }
  // Whole pairs in one call (halving 2k rows to k is the same pair by pair); an odd row waits for its pair.
  const int pairs = (rows.rows - y) / 2;
  if (pairs > 0) {
    made.push_back(halve(rows.rowRange(y, y + 2 * pairs), cv::Size(half, pairs), interpolation));
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
      const cv::Mat reduced = halve(level.pending, cv::Size((level.pending.cols + 1) / 2, 1),
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
    // The level's own settings (its predictor is its own choice): its tiles are copied as they are.
    setTiffFields(tif, w, h, channels_, type_, level.writer->options_, true);
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
    clearTiffError();
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
      // Created anew, not reopened: the claimed name may have been replaced by a link meanwhile. A device or
      // FIFO (--mask_preview /dev/null) is written as it is, never replaced.
      const int fd = stream_ ? openStreamTarget(path_) : createFileExclusively(partialPath());
      const SigpipeHeld held;  // a FIFO's reader that leaves is a write error, not the process's end
      ok = fd >= 0 && writeAll(fd, bytes.data(), bytes.size());
      if (fd >= 0 && ::close(fd) != 0) ok = false;
    }
    if (!ok) {
      int err = errno;
      abandon();
      TILER_THROW(IoError, "'" << path_ << "': writing " << options_.format
                               << " failed: " << (stream_ ? streamOpenError(err) : std::strerror(err)));
    }
  }
  finished_ = true;
}

void ImageWriter::commit() {
  TILER_CHECK(finished_ && !done_, IoError, "'" << path_ << "': commit before finish, or twice");
  if (!stream_ && std::rename(partialPath().c_str(), path_.c_str()) != 0) {
    int err = errno;
    abandon();
    TILER_THROW(IoError, "'" << path_ << "': rename from .partial failed: " << std::strerror(err));
  }
  done_ = true;
}

}  // namespace tiler
