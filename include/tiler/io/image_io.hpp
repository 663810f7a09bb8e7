// image_io: region reads of huge images and streaming, atomic writes. No LibTorch.
//
// ImageReader: the interface every backend implements (readers.hpp says which backend reads a file, each
// in a file of its own). TIFF through libtiff decodes only the tiles or strips a region touches; a bounded
// LRU cache of decoded tiles/strips (2.5 rows of tiles across the image, at least 16 MiB, at most 512 MiB)
// keeps neighbouring windows from decoding the same tile twice; reduced-resolution pages and SubIFDs are
// levels, each opened (its own handles and cache) on first read. Whole-slide files and TIFFs that OpenSlide
// knows as a vendor format go through OpenSlide. Other formats go through OpenCV, decoded once at open and
// shared by all regions. Thread safety: readRegion() may be called from several threads at once; each
// thread reads on a libtiff or OpenSlide handle of its own (handle_pool.hpp). Pixels are HWC in the file's
// native type (u8, u16, i16, u32, f32); colour is RGB(A), never BGR.
//
// ImageWriter: takes row bands top to bottom. TIFF output is tiled (256 px), compressed as WriterOptions ask
// (a Compression: codec, level, predictor) or by defaultCompression of its sample type, BigTIFF when the raw
// data exceeds 2 GiB; memory is one row of tiles (two, compressing on a thread of its own). PNG are
// assembled in memory and refused above kMaxInMemoryPixels. Files are written as "<name>.partial" and renamed
// by close() (or finish() then commit(), so that several outputs of one image appear together); a writer
// destroyed before commit removes its partial file; a partial file is created anew (platform.hpp), never
// opened through a link planted at its name. A PNG to a character device or FIFO (/dev/null) is written
// to it as it is, never replacing it; a TIFF there is refused. Every failure is an IoError naming the file.
//
// Hostile or corrupt TIFFs fail fast, before their pixels are allocated: a chunk over 1 GiB, chunk tables
// outside the file, and a chunk that claims more decoded bytes than its codec can expand its stored bytes to.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <opencv2/core.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/core/queue.hpp"

namespace tiler {

enum class SampleType { kU8, kU16, kI16, kU32, kF16, kF32 };
const char* sampleTypeName(SampleType type);
int cvDepthOf(SampleType type);
size_t bytesPerSample(SampleType type);

struct ImageInfo {
  std::string path;
  int64_t width = 0, height = 0;
  int channels = 0;
  SampleType type = SampleType::kU8;
  int pages = 1;
  std::string format;  // "tiff" or OpenCV's decoder ("png", "jpeg", ...)
  bool tiled = false;
  int64_t tile_width = 0, tile_height = 0;  // tiled TIFF
  int64_t rows_per_strip = 0;               // striped TIFF
  std::string compression;                  // "none", "lzw", "deflate", "jpeg", "zstd", "packbits", ...
  bool planar_separate = false;
  bool bigtiff = false;
  std::optional<double> nodata;  // TIFF GDAL_NODATA: a pixel whose every band equals it holds no data
  // Resolution levels, level 0 (this image's width x height) first: a TIFF's reduced-resolution pages or
  // SubIFDs of the same samples, a whole slide's levels; one level for everything else.
  struct Level {
    int64_t width = 0, height = 0;
    double downsample = 1.0;  // level-0 pixels per level pixel (mean of the two axes, as OpenSlide's)
  };
  std::vector<Level> levels;
  // Level 0's micrometres per pixel (x): OpenSlide's mpp-x, TIFF X/YResolution in inches or centimetres,
  // or a projected GeoTIFF's metres per pixel x 10^6. Unset when the file does not say.
  std::optional<double> mpp;
  std::optional<double> objective_power;  // whole slides: the scan's magnification (e.g. 40)
  std::string reader;                     // the row of readers.hpp that opened it: tiff, openslide, jpeg, ...
  // A palette TIFF's colour map (16-bit R, G, B per index); null for every other image. The reader hands out
  // the indices (a labels output reads back as its classes, a mask as its values); a model that takes RGB
  // gets the colours (ChannelAdapt::kPalette).
  std::shared_ptr<const std::vector<std::array<uint16_t, 3>>> colormap;
  std::string vendor;       // whole slides: OpenSlide's vendor (aperio, hamamatsu, ...)
  std::string description;  // TIFF: the first page's ImageDescription ("" when none)
};

// The Software tag of the TIFF outputs of a run ("tiler <version>"): how a later run knows its own outputs.
extern const char* const kTilerSoftware;
// True for a TIFF that tiler wrote (its first page's Software tag); reads the first directory only.
bool isTilerOutputFile(const std::string& path);

class ImageReader {
 public:
  // Opens and validates the header; throws IoError naming the file and the problem.
  static std::unique_ptr<ImageReader> open(const std::string& path);
  virtual ~ImageReader() = default;
  virtual const ImageInfo& info() const = 0;
  // Exactly the pixels of `region` of resolution level `level` (its own pixel coordinates), which must lie
  // inside that level. Thread safe.
  virtual cv::Mat readRegion(const Rect& region, int level) = 0;
  cv::Mat readRegion(const Rect& region) { return readRegion(region, 0); }
  // Decoded bytes held by the tile/strip cache or the whole-image buffer, for memory tests.
  virtual size_t cachedBytes() const = 0;
};

// Tiles or strips this process decoded from TIFF inputs, every reader together: what reading cost, apart
// from the machine's load (the report's per-rank tiles_decoded).
int64_t tiffChunksDecoded();

// The lower-case extension with its dot ("" when none).
std::string lowerExtension(const std::string& path);

// The sample type of a labels image for `classes` classes (a one-channel model has 2): u8 up to 256
// classes (ids 0..255), u16 above. The one place that decides it.
SampleType labelSampleType(int classes);
// Classes the labels of a model with `channels` output channels hold: a one-channel (thresholded) model
// has 2.
inline int labelClassCount(int channels) {
  return channels == 1 ? 2 : channels;
}

// A TIFF output's codec at one of libtiff's own levels, so that the bytes are what libtiff writes: deflate
// 1-12 (libdeflate's scale; 10-12 need a libtiff built with libdeflate), zstd 1-22, lzw, none.
enum class Codec { kDeflate, kZstd, kLzw, kNone };
struct Compression {
  Codec codec = Codec::kDeflate;
  int level = 0;          // 0: libtiff's default (deflate 6, zstd 9)
  bool predictor = true;  // horizontal differencing for integers, the floating-point predictor for floats
  bool operator==(const Compression& o) const {
    return codec == o.codec && level == o.level && predictor == o.predictor;
  }
};
// "deflate[:LEVEL]", "zstd[:LEVEL]", "lzw", "none" ("zip" is deflate). Throws ConfigError naming the ranges.
Compression parseCompression(const std::string& text);
// The same syntax back ("deflate:1"; "deflate" for libtiff's default level).
std::string compressionName(const Compression& compression);
// Throws ConfigError when this libtiff cannot write `compression` (a codec left out of it, a deflate level
// above 9 without libdeflate): checked on a TIFF in memory, so that a run refuses before any image.
void checkCompression(const Compression& compression);
// What a raster's samples are: categories (labels, ids: every TIFF reader's deflate) or measurements
// (probabilities of any sample type: compressed as the floats are).
enum class RasterValues { kCategories, kMeasurements };
// The codec of an output of sample type `type` holding `values` when none is asked for: the measured trade of
// file size for the write stage's pace (docs/performance.md, "Output codecs").
Compression defaultCompression(SampleType type, RasterValues values);
// What one thread compressing with `compression` holds for its codec, in bytes: zstd sizes its context by
// level alone (libtiff pledges no tile size), from 1.4 MB at level 1 to 815 MB at 22.
size_t compressorBytes(const Compression& compression);
// The compressing threads `requested` may become so that their codecs hold at most kCompressorBudgetBytes
// (one at least): zstd:22 would otherwise take 0.8 GB a thread, 50 GB on a 64-core node.
constexpr size_t kCompressorBudgetBytes = size_t(1) << 30;
int compressionThreads(const Compression& compression, int requested);
// Whether default float compression keeps the floating-point predictor, from the bytes of the same tiles
// (`raw`: the image's bytes in them, without padding) with it and without: where it makes them smaller; where
// they shrink 64x without it (a background, a constant: it says nothing of the rest); and where they compress
// 3x or more either way and it costs at most a quarter more bytes, since zstd then compresses the predictor's
// planes faster than the samples (docs/performance.md, "The predictor where it pays"). Not on noise: no
// smaller, and slower.
bool keepsPredictor(size_t with, size_t without, size_t raw);

// A pyramid level's rows from its parent's: `rows` resized to `size` (2x2 means with INTER_AREA, the top-left
// pixel with INTER_NEAREST), pairs of rows to one. ImageWriter's TIFF pyramid and the OME-Zarr writer both
// halve through it, so their levels are equal.
cv::Mat halve(const cv::Mat& rows, cv::Size size, int interpolation);

struct WriterOptions {
  std::string format = "tif";  // tif | png
  // Unset: defaultCompression(the writer's sample type, values).
  std::optional<Compression> compression;
  RasterValues values = RasterValues::kCategories;
  int tile = 256;               // TIFF tile edge (multiple of 16)
  std::string metadata_from;    // input TIFF whose resolution and GeoTIFF tags are copied
  double metadata_scale = 1.0;  // output pixels per input pixel, to adjust those tags
  // TIFF: reduced-resolution pages (each half the previous, down to one tile) in the main IFD chain
  // (NewSubfileType 1), made from the streamed rows: 2x2 means, or the top-left pixel with `nearest`.
  bool pyramid = false;
  bool nearest = false;
  // TIFF, one u8/u16 channel: a palette (Photometric 3); entry k is class k's RGB. Padded with black.
  std::vector<std::array<uint8_t, 3>> colormap;
  std::string description;  // TIFF ImageDescription (e.g. class names as JSON)
  std::string software;     // TIFF Software tag: kTilerSoftware on tiler's outputs, none on other files
  // TIFF: what a stored value means, as GDAL's per-band scale (GDAL_METADATA): value = stored x scale.
  std::optional<double> value_scale;
  // TIFF: the value of a pixel that holds no data (GDAL_NODATA; NaN allowed), for every band.
  std::optional<double> nodata;
  // TIFF: micrometres per output pixel, written as X/YResolution in centimetres (over those copied).
  std::optional<double> mpp;
  // TIFF: each tile is compressed by a task of `pool` (shared by every writer of a process; null: the
  // calling thread, or with `background` a thread of the writer's own) through libtiff's own codec and
  // predictor in a one-tile TIFF in memory, so its bytes are what TIFFWriteEncodedTile writes, then copied
  // into the file in order with TIFFWriteRawTile.
  std::shared_ptr<WorkPool> pool;
  // TIFF: full rows of tiles are handed to the pool and written on a thread of the writer's own (three rows
  // in memory: the one filled, one queued, the one written), so that writeRows() only copies rows in; errors
  // surface at the next writeRows() or finish().
  bool background = false;
};

class ImageWriter {
 public:
  static constexpr int64_t kMaxInMemoryPixels = int64_t(1) << 28;  // PNG: 268 Mpx

  ImageWriter(const std::string& path, int64_t width, int64_t height, int channels, SampleType type,
              WriterOptions options = {});
  ~ImageWriter();
  ImageWriter(const ImageWriter&) = delete;
  ImageWriter& operator=(const ImageWriter&) = delete;

  // Appends band.rows rows (HWC, width columns, the writer's type and channels).
  void writeRows(const cv::Mat& band);
  // finish() then commit().
  void close();
  // Flushes everything and closes the file, still under its partial name. Throws IoError on failure (then
  // the partial file is removed).
  void finish();
  // Renames the finished partial file to its final name. Throws IoError on failure.
  void commit();
  const std::string& path() const { return path_; }
  std::string partialPath() const { return path_ + ".partial"; }
  // Bytes this writer holds in memory (rows of tiles for TIFF; the image for PNG).
  size_t bufferedBytes() const;
  // Fault injection (TILER_FAULT stage:write): every tile compressed from now on throws in the pool.
  void injectTileFault() { tile_fault_->store(true); }

 private:
  // A row of tiles on its way to the file: each tile's compressed bytes, in column order.
  struct TileRow {
    std::vector<std::future<std::vector<uint8_t>>> tiles;
    int64_t first_row = 0;
    cv::Mat buffer;  // the rows the tiles are cut from: free again once every tile is written
  };
  void flushTileRow(int64_t rows);
  // Hands the tiles of `rows` rows of `buffer` (a row of tiles; the rest zeroed) to the pool.
  TileRow encodeTileRow(cv::Mat buffer, int64_t first_row, int64_t rows);
  // Default float compression: encodes up to kPredictorSampleTiles tiles of the first row of tiles with and
  // without the floating-point predictor and keeps it where it pays (keepsPredictor). The first row decides
  // for the whole file, so the bytes do not depend on ranks or threads.
  void choosePredictor(const cv::Mat& row, int64_t rows);  // `rows` of `row` are the image's
  static constexpr int64_t kPredictorSampleTiles = 8;
  // Writes a row's compressed tiles in order (waiting for each), then keeps its buffer for a later row.
  void writeTileRow(TileRow& row);
  cv::Mat spareRow();  // a written row's buffer, or a new one
  void stopTileThread() noexcept;
  [[noreturn]] void failOnTileError();  // abandons the file and throws the tile thread's error
  void abandon() noexcept;
  // The constructor's parts: a TIFF (openTiff, openLevels, startThreads) or a PNG (openPng).
  void openTiff();
  void openLevels();
  void startThreads();
  void openPng();
  // Pyramid: rows of level `li`'s parent, halved into level li (and on down).
  void feedLevel(size_t li, const cv::Mat& rows);
  void finishLevels();
  bool appendLevels(void* tif);

  struct Level {
    std::unique_ptr<ImageWriter> writer;  // a temporary TIFF of this level, copied in raw at finish()
    cv::Mat pending;                      // a parent row waiting for its pair
  };

  std::string path_;
  int64_t width_, height_;
  int channels_;
  SampleType type_;
  WriterOptions options_;
  void* tiff_ = nullptr;  // TIFF* (owned) for TIFF output
  int cv_type_ = 0;       // the rows' OpenCV type
  std::shared_ptr<std::atomic<bool>> tile_fault_ =
      std::make_shared<std::atomic<bool>>(false);  // shared with tasks
  cv::Mat buffer_;  // TIFF: tile_h rows (a new one per row: the pool's tasks hold the last); PNG:
                    // the whole image
  int64_t buffered_rows_ = 0;
  int64_t rows_written_ = 0;
  std::vector<Level> levels_;  // pyramid levels 1..L (owned; the level thread's while it runs)
  // The levels are made on a thread of their own, so their halving and compression overlap level 0's.
  std::unique_ptr<BoundedQueue<cv::Mat>> level_queue_;  // level-0 bands (owned copies)
  std::thread level_thread_;
  std::exception_ptr level_error_;  // set by the level thread, read after it joined
  void stopLevelThread() noexcept;
  // options_.background: rows of tiles being compressed, for the tile thread to write in order.
  std::unique_ptr<BoundedQueue<TileRow>> tile_queue_;
  std::thread tile_thread_;
  std::mutex spare_mutex_;
  std::vector<cv::Mat> spare_rows_;  // guarded by spare_mutex_; no task refers to them
  std::mutex tile_error_mutex_;
  std::exception_ptr tile_error_;  // the tile thread's first error, guarded by tile_error_mutex_
  std::exception_ptr tileError();
  bool choose_predictor_ = false;  // default float compression, before the first row of tiles
  bool finished_ = false;          // file closed under its partial name
  bool done_ = false;              // committed, or abandoned
  bool stream_ = false;            // path_ is a character device or FIFO: written as it is (writeTargetOf)
};

}  // namespace tiler
