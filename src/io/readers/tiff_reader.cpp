// The TIFF backend of the reader registry (readers.hpp): libtiff, tile by tile, through a cache that the
// reading threads share, each on a libtiff handle of its own.
#include <spdlog/spdlog.h>
#include <tiffio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tiff_support.hpp"
#include "tiler/core/error.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/readers/handle_pool.hpp"
#include "tiler/io/readers/readers.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace tiler {
namespace {

// Where a TIFF level's pixels are: a page of the main IFD chain, or a SubIFD (by its offset).
struct TiffPage {
  tdir_t index = 0;
  uint64_t subifd_offset = 0;  // non-zero: a SubIFD of page 0
};

bool selectPage(TIFF* tif, const TiffPage& page) {
  return page.subifd_offset ? TIFFSetSubDirectory(tif, page.subifd_offset) != 0
                            : TIFFSetDirectory(tif, page.index) != 0;
}

// An Aperio SVS's first ImageDescription ("Aperio Image Library ...|AppMag = 40|MPP = 0.25|..."): its µm/px
// and magnification, as OpenSlide reads them, so that a slide read here (remotely, or in a build without
// OpenSlide) has the resolution it has there.
void readAperioDescription(const std::string& description, ImageInfo& info) {
  if (description.rfind("Aperio", 0) != 0) return;
  auto field = [&](const std::string& key) -> std::optional<double> {
    const size_t at = description.find("|" + key + " = ");
    if (at == std::string::npos) return std::nullopt;
    char* end = nullptr;
    const double value = std::strtod(description.c_str() + at + key.size() + 4, &end);
    return value > 0 && std::isfinite(value) ? std::optional<double>(value) : std::nullopt;
  };
  if (const auto mpp = field("MPP")) info.mpp = mpp;
  if (const auto magnification = field("AppMag")) info.objective_power = magnification;
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
    clearTiffError();
    tif_ = openTiffForReading(path);
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
    handles_.adopt(tif_);  // the header's handle decodes too
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

  // The first page's tags that the three steps of readHeader share.
  struct HeaderTags {
    uint32_t w = 0, h = 0;
    uint16_t spp = 1, bps = 1, comp = COMPRESSION_NONE, photometric = PHOTOMETRIC_MINISBLACK;
  };

  // Size, samples, sample type and metadata; then the photometric interpretation; then the tile or strip
  // layout, with the checks that a hostile file fails before any pixel is allocated.
  void readHeader() {
    const HeaderTags t = readSamples();
    readPhotometric(t);
    readChunkLayout(t);
  }

  HeaderTags readSamples() {
    HeaderTags t;
    uint32_t& w = t.w;
    uint32_t& h = t.h;
    uint16_t &spp = t.spp, &bps = t.bps, &comp = t.comp, &photometric = t.photometric;
    uint16_t fmt = SAMPLEFORMAT_UINT, planar = PLANARCONFIG_CONTIG;
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
    readAperioDescription(info_.description, info_);
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
    return t;
  }

  void readPhotometric(const HeaderTags& t) {
    const std::string& p = info_.path;
    const uint16_t spp = t.spp, bps = t.bps, comp = t.comp, photometric = t.photometric;
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
  }

  void readChunkLayout(const HeaderTags& t) {
    const std::string& p = info_.path;
    const uint32_t w = t.w, h = t.h;
    const uint16_t spp = t.spp, comp = t.comp;
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
    {
      const uint64_t last = chunks - 1, file_size = tiffFileSize(tif_);
      uint64_t off = TIFFGetStrileOffset(tif_, uint32_t(last));
      uint64_t cnt = TIFFGetStrileByteCount(tif_, uint32_t(last));
      TILER_CHECK(off + cnt <= file_size && (comp != COMPRESSION_NONE || cnt > 0), IoError,
                  "'" << p << "': truncated: the image data ends at byte " << off + cnt
                      << " but the file has " << file_size << " bytes");
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
  struct HandleLease : HandlePool<TIFF>::Lease {
    explicit HandleLease(TiffReader& reader)
        : HandlePool<TIFF>::Lease(reader.handles_, [&reader] { return reader.openHandle(); }) {}
  };

  TIFF* openHandle() {
    clearTiffError();
    TIFF* tif = openTiffForReading(info_.path);
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

  void readScanlines(const Rect& r, cv::Mat& out) {
    const HandleLease tif(*this);
    const size_t px = bytesPerSample(info_.type) * size_t(stored_channels_);
    std::vector<uint8_t> line(size_t(TIFFScanlineSize64(tif.get())));
    clearTiffError();
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
    clearTiffError();
    tmsize_t got = info_.tiled ? TIFFReadEncodedTile(tif.get(), index, data->data(), tmsize_t(data->size()))
                               : TIFFReadEncodedStrip(tif.get(), index, data->data(), tmsize_t(data->size()));
    if (got < 0) {
      TILER_THROW(IoError, "'" << info_.path << "': " << (info_.tiled ? "TIFFReadTile" : "TIFFReadStrip")
                               << " failed at " << (info_.tiled ? "tile (" : "strip (") << cx << "," << cy
                               << "): " << takeTiffError());
    }
    const std::string corruption = takeTiffCorruptionWarning();
    TILER_CHECK(corruption.empty(), IoError,
                "'" << info_.path << "': " << (info_.tiled ? "tile (" : "strip (") << cx << "," << cy
                    << ") is corrupt: " << corruption);
    countDecodedChunk();
    return data;
  }

  struct CacheEntry {
    Chunk data;  // null while a thread decodes it
    std::list<uint32_t>::iterator lru_pos;
  };

  ImageInfo info_;
  TiffPage page_;
  TIFF* tif_ = nullptr;  // the header's handle (constructor only; then one of handles_)
  bool ycbcr_jpeg_ = false;
  bool cmyk_ = false;        // PHOTOMETRIC_SEPARATED with CMYK inks: handed out as RGB(A)
  int stored_channels_ = 0;  // samples per pixel in the file (info_.channels is what readRegion returns)
  uint16_t compression_ = COMPRESSION_NONE;
  int64_t chunk_w_ = 0, chunk_h_ = 0, chunks_across_ = 0, chunks_down_ = 0;
  bool huge_uncompressed_strips_ = false;
  HandlePool<TIFF> handles_{TIFFClose};
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

}  // namespace

bool identifyTiff(const FileHead& head) {
  return isTiffMagic(head.bytes);
}

std::unique_ptr<ImageReader> openTiff(const std::string& path) {
  // The row claims a .tif/.tiff whatever its bytes, so that one that is no TIFF is refused here, not read as
  // whatever it is (a remote input's bytes were asked already).
  TILER_CHECK(isRemoteInput(path) || looksLikeTiff(path), IoError,
              "'" << path << "': not a TIFF (the file does not start with a TIFF header)");
  return std::make_unique<TiffReader>(path);
}

}  // namespace tiler
