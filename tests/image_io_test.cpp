#include "tiler/io/image_io.hpp"

#include <gtest/gtest.h>
#include <tiffio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <future>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <thread>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

std::string tempPath(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("image_io_" + std::to_string(getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

cv::Mat randomImage(int h, int w, int type, uint64_t seed) {
  cv::Mat m(h, w, type);
  cv::RNG rng(seed);
  if (CV_MAT_DEPTH(type) == CV_32F)
    rng.fill(m, cv::RNG::UNIFORM, -1000.0, 1000.0);
  else if (CV_MAT_DEPTH(type) == CV_16F)  // RNG fills no halves: floats in [0, 1], converted
    randomImage(h, w, CV_MAKETYPE(CV_32F, CV_MAT_CN(type)), seed).convertTo(m, type, 1.0 / 2000, 0.5);
  else
    rng.fill(m, cv::RNG::UNIFORM, 0, CV_MAT_DEPTH(type) == CV_8U ? 256 : 65536);
  return m;
}

bool equalMats(const cv::Mat& a, const cv::Mat& b) {
  if (a.size() != b.size() || a.type() != b.type()) return false;
  for (int y = 0; y < a.rows; ++y)
    if (std::memcmp(a.ptr(y), b.ptr(y), a.cols * a.elemSize()) != 0) return false;
  return true;
}

void writeWithWriter(const std::string& path, const cv::Mat& img, SampleType type, WriterOptions o,
                     int band = 37) {
  ImageWriter w(path, img.cols, img.rows, img.channels(), type, o);
  for (int y = 0; y < img.rows; y += band) w.writeRows(img.rowRange(y, std::min(img.rows, y + band)));
  w.close();
}

// A TIFF written directly with libtiff, for layouts our writer does not produce.
void writeTiff(const std::string& path, const cv::Mat& img, bool tiled, uint16_t compression,
               bool planar_separate, bool bigtiff = false, int chunk = 32) {
  TIFF* t = TIFFOpen(path.c_str(), bigtiff ? "w8" : "w");
  ASSERT_NE(t, nullptr);
  const int c = img.channels();
  const int bytes = int(img.elemSize1());
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, img.cols);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, img.rows);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, c);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, bytes * 8);
  TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, img.depth() == CV_32F ? SAMPLEFORMAT_IEEEFP : SAMPLEFORMAT_UINT);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, c == 3 ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK);
  TIFFSetField(t, TIFFTAG_PLANARCONFIG, planar_separate ? PLANARCONFIG_SEPARATE : PLANARCONFIG_CONTIG);
  TIFFSetField(t, TIFFTAG_COMPRESSION, compression);
  if (compression == COMPRESSION_JPEG) TIFFSetField(t, TIFFTAG_JPEGQUALITY, 100);
  const int planes = planar_separate ? c : 1;
  const int pc = planar_separate ? 1 : c;
  std::vector<cv::Mat> split;
  cv::split(img, split);
  auto plane = [&](int p) {
    if (!planar_separate) return img;
    return split[size_t(p)];
  };
  if (tiled) {
    TIFFSetField(t, TIFFTAG_TILEWIDTH, chunk);
    TIFFSetField(t, TIFFTAG_TILELENGTH, chunk);
    std::vector<uint8_t> buf(size_t(chunk * chunk * pc * bytes));
    for (int p = 0; p < planes; ++p) {
      cv::Mat src = plane(p);
      for (int y = 0; y < img.rows; y += chunk)
        for (int x = 0; x < img.cols; x += chunk) {
          std::fill(buf.begin(), buf.end(), 0);
          for (int r = 0; r < chunk && y + r < img.rows; ++r)
            std::memcpy(buf.data() + size_t(r * chunk * pc * bytes), src.ptr(y + r) + size_t(x * pc * bytes),
                        size_t(std::min(chunk, img.cols - x) * pc * bytes));
          ASSERT_GE(TIFFWriteTile(t, buf.data(), uint32_t(x), uint32_t(y), 0, uint16_t(p)), 0);
        }
    }
  } else {
    TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, chunk);
    for (int p = 0; p < planes; ++p) {
      cv::Mat src = plane(p).clone();
      for (int y = 0; y < img.rows; ++y)
        ASSERT_GE(TIFFWriteScanline(t, src.ptr(y), uint32_t(y), uint16_t(p)), 0);
    }
  }
  TIFFClose(t);
}

void expectRegionsMatch(ImageReader& reader, const cv::Mat& full, uint64_t seed, int tries = 40) {
  std::mt19937_64 rng(seed);
  const int w = full.cols, h = full.rows;
  std::vector<Rect> rects = {
      {0, 0, w, h}, {0, 0, 1, 1}, {w - 1, h - 1, 1, 1}, {w - 17, 0, 17, h}, {0, h - 5, w, 5}};
  for (int i = 0; i < tries; ++i) {
    int64_t x = int64_t(rng() % uint64_t(w)), y = int64_t(rng() % uint64_t(h));
    rects.push_back({x, y, 1 + int64_t(rng() % uint64_t(w - x)), 1 + int64_t(rng() % uint64_t(h - y))});
  }
  for (const Rect& r : rects) {
    cv::Mat got = reader.readRegion(r);
    cv::Mat want = full(cv::Rect(int(r.x), int(r.y), int(r.w), int(r.h)));
    ASSERT_TRUE(equalMats(got, want))
        << reader.info().path << " region " << r.x << "," << r.y << " " << r.w << "x" << r.h;
  }
}

struct RoundTrip {
  int cv_type;
  SampleType type;
  Compression compression;
};

class WriterRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

TEST_P(WriterRoundTrip, TiledTiffReadsBackExactly) {
  const auto p = GetParam();
  cv::Mat img = randomImage(301, 517, p.cv_type, 11);
  auto path = tempPath("rt_" + std::to_string(p.cv_type) + "_" + std::to_string(int(p.compression.codec)) +
                       "_" + std::to_string(p.compression.level) + ".tif");
  WriterOptions o;
  o.compression = p.compression;
  writeWithWriter(path, img, p.type, o);
  auto reader = ImageReader::open(path);
  EXPECT_EQ(reader->info().width, 517);
  EXPECT_EQ(reader->info().height, 301);
  EXPECT_EQ(reader->info().channels, img.channels());
  EXPECT_EQ(reader->info().type, p.type);
  EXPECT_TRUE(reader->info().tiled);
  expectRegionsMatch(*reader, img, 5, 10);
}

std::string roundTripName(const ::testing::TestParamInfo<RoundTrip>& info) {
  std::string codec = compressionName(info.param.compression);
  std::replace_if(
      codec.begin(), codec.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return std::string(sampleTypeName(info.param.type)) + "x" + std::to_string(CV_MAT_CN(info.param.cv_type)) +
         "_" + codec;
}

INSTANTIATE_TEST_SUITE_P(TypesChannelsCompressions, WriterRoundTrip,
                         ::testing::Values(RoundTrip{CV_8UC1, SampleType::kU8, {Codec::kDeflate}},
                                           RoundTrip{CV_8UC3, SampleType::kU8, {Codec::kZstd}},
                                           RoundTrip{CV_8UC(5), SampleType::kU8, {Codec::kNone}},
                                           RoundTrip{CV_16UC1, SampleType::kU16, {Codec::kDeflate, 12}},
                                           RoundTrip{CV_16UC3, SampleType::kU16, {Codec::kLzw}},
                                           RoundTrip{CV_32FC1, SampleType::kF32, {Codec::kDeflate, 1}},
                                           RoundTrip{CV_32FC(4), SampleType::kF32, {Codec::kZstd, 1}},
                                           RoundTrip{CV_32FC2, SampleType::kF32, {Codec::kNone}},
                                           RoundTrip{CV_16FC2, SampleType::kF16, {Codec::kDeflate, 3, false}},
                                           RoundTrip{CV_16FC1, SampleType::kF16, {Codec::kZstd, 19}}),
                         roundTripName);

struct Layout {
  bool tiled;
  uint16_t compression;
  bool planar_separate;
  bool bigtiff;
  int cv_type;
};

class ReaderLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(ReaderLayouts, RandomRegionsEqualTheSameCropOfTheImage) {
  const auto p = GetParam();
  cv::Mat img = randomImage(211, 333, p.cv_type, 3);
  auto path = tempPath("layout_" + std::to_string(p.tiled) + std::to_string(p.compression) +
                       std::to_string(p.planar_separate) + std::to_string(p.bigtiff) +
                       std::to_string(p.cv_type) + ".tif");
  writeTiff(path, img, p.tiled, p.compression, p.planar_separate, p.bigtiff);
  auto reader = ImageReader::open(path);
  EXPECT_EQ(reader->info().tiled, p.tiled);
  EXPECT_EQ(reader->info().bigtiff, p.bigtiff);
  EXPECT_EQ(reader->info().planar_separate, p.planar_separate);
  expectRegionsMatch(*reader, img, 9);
}

std::string layoutName(const ::testing::TestParamInfo<Layout>& info) {
  const Layout& l = info.param;
  return std::string(l.tiled ? "tiled" : "striped") + "_codec" + std::to_string(l.compression) +
         (l.planar_separate ? "_planar" : "") + (l.bigtiff ? "_bigtiff" : "") + "_" +
         std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(TiledStripedPlanarBigtiff, ReaderLayouts,
                         ::testing::Values(Layout{true, COMPRESSION_ADOBE_DEFLATE, false, false, CV_8UC3},
                                           Layout{false, COMPRESSION_LZW, false, false, CV_8UC3},
                                           Layout{false, COMPRESSION_PACKBITS, false, false, CV_8UC1},
                                           Layout{true, COMPRESSION_ZSTD, true, false, CV_16UC3},
                                           Layout{false, COMPRESSION_NONE, true, false, CV_8UC(4)},
                                           Layout{true, COMPRESSION_NONE, false, true, CV_32FC1},
                                           Layout{false, COMPRESSION_ADOBE_DEFLATE, false, true, CV_16UC1}),
                         layoutName);

TEST(ImageReader, JpegTiledTiffDecodesCloseToTheSource) {
  cv::Mat img(128, 160, CV_8UC3);
  for (int y = 0; y < img.rows; ++y)
    for (int x = 0; x < img.cols; ++x) img.at<cv::Vec3b>(y, x) = cv::Vec3b(uchar(x), uchar(y), uchar(x + y));
  auto path = tempPath("jpeg.tif");
  writeTiff(path, img, true, COMPRESSION_JPEG, false, false, 64);
  auto reader = ImageReader::open(path);
  EXPECT_EQ(reader->info().compression, "jpeg");
  cv::Mat full = reader->readRegion({0, 0, 160, 128});
  EXPECT_LT(cv::norm(full, img, cv::NORM_INF), 12.0);
  expectRegionsMatch(*reader, full, 1, 10);
}

TEST(ImageReader, PngAndJpegRegionsAndRgbOrder) {
  cv::Mat rgb = randomImage(97, 131, CV_8UC3, 21);
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  auto png = tempPath("a.png");
  cv::imwrite(png, bgr);
  auto reader = ImageReader::open(png);
  EXPECT_EQ(reader->info().format, "png");
  expectRegionsMatch(*reader, rgb, 2);
  auto jpg = tempPath("a.jpg");
  cv::imwrite(jpg, bgr);
  auto jr = ImageReader::open(jpg);
  cv::Mat decoded = jr->readRegion({0, 0, 131, 97});
  expectRegionsMatch(*jr, decoded, 4);
  cv::Mat png16 = randomImage(40, 50, CV_16UC1, 8);
  auto p16 = tempPath("b16.png");
  cv::imwrite(p16, png16);
  auto r16 = ImageReader::open(p16);
  EXPECT_EQ(r16->info().type, SampleType::kU16);
  expectRegionsMatch(*r16, png16, 3);
}

TEST(ImageReader, ConcurrentReadsFromSeveralThreads) {
  cv::Mat img = randomImage(512, 512, CV_8UC3, 99);
  auto path = tempPath("concurrent.tif");
  writeTiff(path, img, true, COMPRESSION_ADOBE_DEFLATE, false, false, 64);
  auto reader = ImageReader::open(path);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 200; ++i) {
        Rect r{int64_t(rng() % 400), int64_t(rng() % 400), 100, 100};
        if (!equalMats(reader->readRegion(r), img(cv::Rect(int(r.x), int(r.y), 100, 100)))) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ImageReader, TileCacheIsBoundedAndReused) {
  cv::Mat img = randomImage(1024, 1024, CV_8UC1, 5);
  auto path = tempPath("cache.tif");
  writeTiff(path, img, true, COMPRESSION_ADOBE_DEFLATE, false, false, 64);
  auto reader = ImageReader::open(path);
  reader->readRegion({0, 0, 1024, 1024});
  EXPECT_EQ(reader->cachedBytes(), size_t(1024 * 1024)) << "every tile decoded once and kept (under 16 MiB)";
  // A wide image: the cache keeps 2.5 rows of tiles, so it evicts rather than grow with the image.
  cv::Mat wide = randomImage(64 * 40, 4096, CV_8UC3, 6);
  auto wide_path = tempPath("cache_wide.tif");
  writeTiff(wide_path, wide, true, COMPRESSION_NONE, false, false, 64);
  auto wr = ImageReader::open(wide_path);
  for (int64_t y = 0; y < wide.rows; y += 64) wr->readRegion({0, y, 4096, 64});
  EXPECT_LE(wr->cachedBytes(), size_t(16) << 20);
  EXPECT_GE(wr->cachedBytes(), size_t(2 * 64 * 4096 * 3)) << "at least two rows of tiles stay";
}

// Two threads each walking their own half of an image (as a batch's read threads do) keep their own rows
// of tiles: with one budget for both, each evicted the other's tiles and nearly every tile was decoded twice.
TEST(ImageReader, EachReadingThreadKeepsItsOwnRowsOfTiles) {
  // 2.5 rows of 64 px tiles of a 65536 px wide u8 image: 10 MiB, below the 16 MiB floor of a budget; one
  // thread's budget is 16 MiB = 4 rows.
  const int width = 65536, tile = 64;
  const size_t row = size_t(width) * tile;
  cv::Mat img(tile * 8, width, CV_8UC1, cv::Scalar(7));
  auto path = tempPath("budget_threads.tif");
  writeTiff(path, img, true, COMPRESSION_ADOBE_DEFLATE, false, false, tile);
  auto reader = ImageReader::open(path);
  auto walk = [&](int first_row) {
    for (int y = first_row; y < first_row + 4; ++y) reader->readRegion({0, int64_t(y) * tile, width, tile});
  };
  // The first thread stays alive while the second reads (a finished thread's id may be reused).
  std::promise<void> walked, release;
  std::thread first([&] {
    walk(0);
    walked.set_value();
    release.get_future().wait();
  });
  walked.get_future().wait();
  EXPECT_LE(reader->cachedBytes(), size_t(16) << 20) << "one thread: one budget";
  std::thread(walk, 4).join();
  release.set_value();
  first.join();
  EXPECT_EQ(reader->cachedBytes(), 8 * row) << "two threads: both halves stay";
}

// Inputs are read, not memory-mapped: no page of the file is in the process's address space while a reader
// holds it (mapped input pages would count in its resident memory).
TEST(ImageReader, TiffInputsAreNotMemoryMapped) {
  cv::Mat img = randomImage(512, 512, CV_8UC3, 7);
  auto path = tempPath("unmapped.tif");
  writeTiff(path, img, true, COMPRESSION_NONE, false, false, 64);
  auto reader = ImageReader::open(path);
  cv::Mat region = reader->readRegion({0, 0, 512, 512});
  EXPECT_EQ(cv::norm(region, img, cv::NORM_INF), 0);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const std::string name = fs::path(path).filename().string();
  while (std::getline(maps, line)) EXPECT_EQ(line.find(name), std::string::npos) << line;
}

void expectIoError(const std::string& path, const std::string& needle) {
  try {
    auto r = ImageReader::open(path);
    r->readRegion({0, 0, r->info().width, std::min<int64_t>(r->info().height, 64)});
    r->readRegion({0, r->info().height - 1, r->info().width, 1});
    FAIL() << path << ": no error";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
  }
}

TEST(ImageReader, ErrorsNameTheFileAndTheReason) {
  expectIoError(tempPath("missing.tif"), "no such file");
  auto text = tempPath("text.tif");
  std::ofstream(text) << "this is not an image\n";
  expectIoError(text, "not a TIFF");
  auto empty = tempPath("empty.png");
  std::ofstream(empty).close();
  expectIoError(empty, "empty file");
  auto garbage = tempPath("garbage.png");
  std::ofstream(garbage) << "\x89PNG garbage garbage";
  expectIoError(garbage, "OpenCV cannot decode");
  expectIoError(fs::path(text).parent_path().string(), "is a directory");
}

TEST(ImageReader, TruncatedTiffFailsClearly) {
  cv::Mat img = randomImage(256, 256, CV_8UC3, 1);
  auto path = tempPath("full.tif");
  writeTiff(path, img, true, COMPRESSION_ADOBE_DEFLATE, false, false, 64);
  auto cut = tempPath("truncated.tif");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // libtiff writes the directory at the end: cutting the file in half loses it.
  std::ofstream(cut, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size() / 2));
  expectIoError(cut, "not a readable TIFF");
}

// A 128 px deflate TIFF of 64 px tiles whose tile (0,0) is overwritten with junk.
std::string writeCorruptTiff(const std::string& name, const cv::Mat& img) {
  auto path = tempPath(name);
  writeTiff(path, img, true, COMPRESSION_ADOBE_DEFLATE, false, false, 64);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(16);
  std::string junk(200, '\xAB');
  f.write(junk.data(), std::streamsize(junk.size()));
  return path;
}

TEST(ImageReader, CorruptTileIsAnIoErrorNotACrash) {
  expectIoError(writeCorruptTiff("corrupt.tif", randomImage(128, 128, CV_8UC1, 2)), "failed at tile (0,0)");
}

// Threads that want the same corrupt tile at once each get the error (none waits for ever on the thread
// that tried first), and the file's good tiles still read on every thread.
TEST(ImageReader, ACorruptTileFailsEveryThreadThatWantsItAndTheRestStillRead) {
  cv::Mat img = randomImage(128, 128, CV_8UC1, 2);
  auto reader = ImageReader::open(writeCorruptTiff("corrupt_threads.tif", img));
  std::atomic<int> failed{0}, good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        try {
          reader->readRegion({0, 0, 70, 70});  // tiles (0,0) to (1,1)
        } catch (const IoError& e) {
          if (std::string(e.what()).find("failed at tile (0,0)") != std::string::npos) ++failed;
        }
        if (equalMats(reader->readRegion({64, 64, 64, 64}), img(cv::Rect(64, 64, 64, 64)))) ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 6 * 20);
  EXPECT_EQ(good.load(), 6 * 20);
}

TEST(ImageReader, AbsurdHeaderFailsFastWithoutAllocating) {
  auto path = tempPath("absurd.tif");
  test::writeAbsurdTiff(path);
  auto t0 = std::chrono::steady_clock::now();
  expectIoError(path, "too large to decode");
  // A no-hang guard (allocating and decoding it took 31 s): the error itself is the claim.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

// 320 bytes claiming 30000 x 30000 in one deflate strip (under the 1 GiB chunk bound) took 31 s and 1 GB to
// fail; no codec expands a stored byte that far, so the header alone refuses it.
TEST(ImageReader, AChunkClaimingMoreThanItsCodecCanExpandFailsAtTheHeader) {
  auto path = tempPath("bomb.tif");
  test::writeAbsurdTiff(path, 1, 30000);
  auto t0 = std::chrono::steady_clock::now();
  expectIoError(path,
                "strip (0,0) claims 900000000 decoded bytes from 16 stored, more than deflate can expand");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0) << "no hang";
}

// The same bound on every chunk as it is decoded: a middle strip the header check does not look at.
TEST(ImageReader, AMiddleChunkThatCannotHoldItsPixelsFailsBeforeItIsDecoded) {
  auto path = tempPath("bomb_middle.tif");
  const int w = 2000, rows = 1000;
  cv::Mat band(rows, w, CV_8UC1);
  cv::RNG(7).fill(band, cv::RNG::UNIFORM, 0, 256);
  TIFF* t = TIFFOpen(path.c_str(), "w");
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, w);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, 3 * rows);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, 1);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
  TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, rows);
  TIFFSetField(t, TIFFTAG_COMPRESSION, COMPRESSION_ADOBE_DEFLATE);
  ASSERT_GT(TIFFWriteEncodedStrip(t, 0, band.data, tmsize_t(band.total())), 0);
  uint8_t data[16] = {0};
  TIFFWriteRawStrip(t, 1, data, sizeof data);
  ASSERT_GT(TIFFWriteEncodedStrip(t, 2, band.data, tmsize_t(band.total())), 0);
  TIFFClose(t);
  auto reader = ImageReader::open(path);
  cv::Mat top = reader->readRegion({0, 0, w, 10});
  EXPECT_EQ(cv::countNonZero(top != band.rowRange(0, 10)), 0);
  try {
    reader->readRegion({0, rows + 5, w, 10});
    FAIL() << "decoded";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("strip (0,1) claims 2000000 decoded bytes from 16 stored"), std::string::npos)
        << e.message();
  }
}

TEST(ImageReader, CmykIsReadAsRgbAndOtherInksAreRefused) {
  auto write = [](const std::string& path, uint16_t spp, uint16_t inkset, const std::vector<uint8_t>& px) {
    TIFF* t = TIFFOpen(path.c_str(), "w");
    TIFFSetField(t, TIFFTAG_IMAGEWIDTH, 4);
    TIFFSetField(t, TIFFTAG_IMAGELENGTH, 1);
    TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, spp);
    TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 8);
    TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_SEPARATED);
    TIFFSetField(t, TIFFTAG_INKSET, inkset);
    TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
    if (spp == 5) {
      const uint16_t extra = EXTRASAMPLE_UNASSALPHA;
      TIFFSetField(t, TIFFTAG_EXTRASAMPLES, 1, &extra);
    }
    std::vector<uint8_t> row = px;
    TIFFWriteScanline(t, row.data(), 0, 0);
    TIFFClose(t);
  };
  // Cyan, black (K), white (no ink), 50% K.
  const std::vector<uint8_t> cmyk = {255, 0, 0, 0, 0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0, 128};
  write(tempPath("cmyk.tif"), 4, INKSET_CMYK, cmyk);
  auto reader = ImageReader::open(tempPath("cmyk.tif"));
  EXPECT_EQ(reader->info().channels, 3);
  cv::Mat rgb = reader->readRegion({0, 0, 4, 1});
  ASSERT_EQ(rgb.channels(), 3);
  EXPECT_EQ(rgb.at<cv::Vec3b>(0, 0), cv::Vec3b(0, 255, 255));
  EXPECT_EQ(rgb.at<cv::Vec3b>(0, 1), cv::Vec3b(0, 0, 0));
  EXPECT_EQ(rgb.at<cv::Vec3b>(0, 2), cv::Vec3b(255, 255, 255));
  EXPECT_EQ(rgb.at<cv::Vec3b>(0, 3), cv::Vec3b(127, 127, 127));
  // CMYK + alpha reads as RGBA with the alpha kept.
  std::vector<uint8_t> cmyka;
  for (int i = 0; i < 4; ++i) {
    cmyka.insert(cmyka.end(), cmyk.begin() + 4 * i, cmyk.begin() + 4 * i + 4);
    cmyka.push_back(uint8_t(60 * i));
  }
  write(tempPath("cmyka.tif"), 5, INKSET_CMYK, cmyka);
  cv::Mat rgba = ImageReader::open(tempPath("cmyka.tif"))->readRegion({0, 0, 4, 1});
  ASSERT_EQ(rgba.channels(), 4);
  EXPECT_EQ(rgba.at<cv::Vec4b>(0, 0), cv::Vec4b(0, 255, 255, 0));
  EXPECT_EQ(rgba.at<cv::Vec4b>(0, 3), cv::Vec4b(127, 127, 127, 180));
  write(tempPath("inks.tif"), 4, INKSET_MULTIINK, cmyk);
  expectIoError(tempPath("inks.tif"), "other than 8- or 16-bit CMYK");
}

TEST(ImageReader, UnsupportedSampleFormatIsNamed) {
  auto path = tempPath("f64.tif");
  TIFF* t = TIFFOpen(path.c_str(), "w");
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, 4);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, 4);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, 1);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 64);
  TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, SAMPLEFORMAT_IEEEFP);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
  double row[4] = {0};
  for (int y = 0; y < 4; ++y) TIFFWriteScanline(t, row, uint32_t(y), 0);
  TIFFClose(t);
  expectIoError(path, "unsupported sample format (64 bits, float)");
}

// The image as plain libtiff writes it (TIFFWriteEncodedTile on each zero-padded tile): the yardstick for
// the writer's own tile compression.
void writeWithLibtiff(const std::string& path, const cv::Mat& img, const Compression& compression) {
  TIFF* t = TIFFOpen(path.c_str(), "w");
  ASSERT_NE(t, nullptr);
  const int depth = img.depth(), channels = img.channels();
  const bool floats = depth == CV_32F || depth == CV_16F;
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, uint32_t(img.cols));
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, uint32_t(img.rows));
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, uint16_t(channels));
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, uint16_t(8 * img.elemSize1()));
  TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, floats ? SAMPLEFORMAT_IEEEFP : SAMPLEFORMAT_UINT);
  TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  const bool rgb = channels == 3 && depth == CV_8U;
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, rgb ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK);
  if (channels > 1 && !rgb) {
    std::vector<uint16_t> extra(size_t(channels - 1), EXTRASAMPLE_UNSPECIFIED);
    TIFFSetField(t, TIFFTAG_EXTRASAMPLES, uint16_t(extra.size()), extra.data());
  }
  TIFFSetField(t, TIFFTAG_TILEWIDTH, 256u);
  TIFFSetField(t, TIFFTAG_TILELENGTH, 256u);
  const uint16_t codes[] = {COMPRESSION_ADOBE_DEFLATE, COMPRESSION_ZSTD, COMPRESSION_LZW, COMPRESSION_NONE};
  TIFFSetField(t, TIFFTAG_COMPRESSION, codes[int(compression.codec)]);
  if (compression.level > 0)
    TIFFSetField(t, compression.codec == Codec::kZstd ? TIFFTAG_ZSTD_LEVEL : TIFFTAG_ZIPQUALITY,
                 compression.level);
  if (compression.codec != Codec::kNone && compression.predictor)
    TIFFSetField(t, TIFFTAG_PREDICTOR, floats ? PREDICTOR_FLOATINGPOINT : PREDICTOR_HORIZONTAL);
  for (int y = 0; y < img.rows; y += 256) {
    for (int x = 0; x < img.cols; x += 256) {
      cv::Mat tile = cv::Mat::zeros(256, 256, img.type());
      const cv::Rect part(x, y, std::min(256, img.cols - x), std::min(256, img.rows - y));
      img(part).copyTo(tile(cv::Rect(0, 0, part.width, part.height)));
      ASSERT_GE(TIFFWriteEncodedTile(t, TIFFComputeTile(t, uint32_t(x), uint32_t(y), 0, 0), tile.data,
                                     tmsize_t(tile.total() * tile.elemSize())),
                0);
    }
  }
  TIFFClose(t);
}

// Every tile's stored bytes, in tile order (the first page).
std::vector<std::vector<uint8_t>> rawTiles(const std::string& path) {
  TIFF* t = TIFFOpen(path.c_str(), "r");
  std::vector<std::vector<uint8_t>> tiles;
  if (t == nullptr) return tiles;
  uint64_t* counts = nullptr;
  TIFFGetField(t, TIFFTAG_TILEBYTECOUNTS, &counts);
  for (ttile_t k = 0; counts != nullptr && k < TIFFNumberOfTiles(t); ++k) {
    std::vector<uint8_t> raw(size_t(counts[k]));
    TIFFReadRawTile(t, k, raw.data(), tmsize_t(raw.size()));
    tiles.push_back(std::move(raw));
  }
  TIFFClose(t);
  return tiles;
}

// Tiles compressed by a pool of threads (each through libtiff's codec and predictor in a TIFF in memory,
// copied in raw) are, byte for byte, what libtiff's TIFFWriteEncodedTile stores; the file is the same
// whether the caller's thread compresses, the writer's own thread, or a pool shared by two writers at once
// (odd sizes, bands that straddle rows of tiles, pyramids, every codec, u8/u16/f16/f32; levels and the
// predictor off on two of the cases).
TEST(ImageWriter, PooledCompressionStoresWhatLibtiffStores) {
  struct Case {
    int width, height, type;
    SampleType sample;
    bool pyramid;
  };
  auto pool = std::make_shared<WorkPool>(3);
  const std::vector<Case> cases = {
      Case{700, 530, CV_8UC1, SampleType::kU8, false}, Case{613, 401, CV_32FC2, SampleType::kF32, true},
      Case{517, 301, CV_8UC3, SampleType::kU8, false}, Case{300, 260, CV_16UC1, SampleType::kU16, false},
      Case{520, 300, CV_16FC2, SampleType::kF16, false}};
  const Compression codecs[] = {
      {Codec::kDeflate},    {Codec::kZstd},        {Codec::kLzw},      {Codec::kNone},
      {Codec::kDeflate, 1}, {Codec::kDeflate, 12}, {Codec::kZstd, 19}, {Codec::kDeflate, 0, false}};
  for (const Compression& compression : codecs) {
    const bool codec_default = compression.level == 0 && compression.predictor;
    for (const Case& c : std::vector<Case>(cases.begin(), cases.begin() + (codec_default ? 5 : 2))) {
      const std::string name = std::string(sampleTypeName(c.sample)) + "x" +
                               std::to_string(CV_MAT_CN(c.type)) + " compression " +
                               compressionName(compression);
      cv::Mat img = randomImage(c.height, c.width, c.type, 11);
      const std::string reference = tempPath("pooled_libtiff.tif");
      writeWithLibtiff(reference, img, compression);
      std::string files[3];
      for (int mode = 0; mode < 3; ++mode) {  // the caller's thread, the writer's thread, a shared pool
        WriterOptions o;
        o.compression = compression;
        o.background = mode > 0;
        if (mode == 2) o.pool = pool;
        o.pyramid = c.pyramid;
        files[mode] = tempPath("pooled" + std::to_string(mode) + ".tif");
        ImageWriter w(files[mode], c.width, c.height, img.channels(), c.sample, o);
        // A second writer on the same pool at the same time.
        ImageWriter other(tempPath("pooled_other.tif"), c.width, c.height, img.channels(), c.sample, o);
        const size_t rows = mode == 0 ? 1 : 3;
        EXPECT_EQ(w.bufferedBytes(), size_t(256) * size_t(c.width) * img.elemSize() * rows);
        for (int y = 0; y < img.rows; y += 97) {
          w.writeRows(img.rowRange(y, std::min(img.rows, y + 97)));
          other.writeRows(img.rowRange(y, std::min(img.rows, y + 97)));
        }
        w.close();
        other.close();
        EXPECT_TRUE(test::slurp(files[mode]) == test::slurp(tempPath("pooled_other.tif"))) << name;
      }
      EXPECT_TRUE(test::slurp(files[0]) == test::slurp(files[1])) << name;
      EXPECT_TRUE(test::slurp(files[0]) == test::slurp(files[2])) << name;
      const auto want = rawTiles(reference), got = rawTiles(files[2]);
      ASSERT_EQ(got.size(), want.size()) << name;
      for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(got[k] == want[k]) << name << ", tile " << k;
      EXPECT_TRUE(equalMats(ImageReader::open(files[2])->readRegion({0, 0, c.width, c.height}), img)) << name;
    }
  }
}

TEST(ImageWriter, PartialFileIsNeverVisibleUnderTheFinalName) {
  auto path = tempPath("atomic.tif");
  fs::remove(path);
  {
    ImageWriter w(path, 100, 100, 1, SampleType::kU8);
    w.writeRows(cv::Mat(50, 100, CV_8UC1, cv::Scalar(7)));
    EXPECT_FALSE(fs::exists(path));
    EXPECT_TRUE(fs::exists(path + ".partial"));
  }
  EXPECT_FALSE(fs::exists(path)) << "destroyed without close()";
  EXPECT_FALSE(fs::exists(path + ".partial"));
  ImageWriter w(path, 100, 100, 1, SampleType::kU8);
  w.writeRows(cv::Mat(100, 100, CV_8UC1, cv::Scalar(7)));
  w.close();
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

TEST(ImageWriter, RefusesBadUseClearly) {
  auto path = tempPath("short.tif");
  ImageWriter w(path, 10, 10, 1, SampleType::kU8);
  w.writeRows(cv::Mat(5, 10, CV_8UC1));
  EXPECT_THROW(w.writeRows(cv::Mat(6, 10, CV_8UC1)), IoError);
  EXPECT_THROW(w.close(), IoError);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THROW(ImageWriter(tempPath("big.png"), 70000, 70000, 1, SampleType::kU8,
                           [] {
                             WriterOptions o;
                             o.format = "png";
                             return o;
                           }()),
               IoError);
  EXPECT_THROW(ImageWriter("/nonexistent-dir/x.tif", 10, 10, 1, SampleType::kU8), IoError);
}

TEST(ImageWriter, OutputsAreReadableByTiffinfoAndOpenCv) {
  TILER_SKIP_WITHOUT_TOOL("tiffinfo");
  cv::Mat img = randomImage(300, 700, CV_8UC3, 4);
  auto path = tempPath("tools.tif");
  writeWithWriter(path, img, SampleType::kU8, {});
  EXPECT_EQ(std::system(("tiffinfo " + path + " >/dev/null 2>&1").c_str()), 0);
  EXPECT_EQ(std::system(("tiffdump " + path + " >/dev/null 2>&1").c_str()), 0);
  cv::Mat cv_read = cv::imread(path, cv::IMREAD_UNCHANGED);
  cv::cvtColor(cv_read, cv_read, cv::COLOR_BGR2RGB);
  EXPECT_TRUE(equalMats(cv_read, img));
  auto png = tempPath("tools.png");
  WriterOptions po;
  po.format = "png";
  writeWithWriter(png, img, SampleType::kU8, po);
  cv::Mat back = cv::imread(png, cv::IMREAD_UNCHANGED);
  cv::cvtColor(back, back, cv::COLOR_BGR2RGB);
  EXPECT_TRUE(equalMats(back, img));
}

// --pyramid: reduced pages in the main IFD chain (NewSubfileType 1), halved down to one tile, 2x2 means for
// probabilities and the top-left pixel for labels, streamed (no temporary file left behind).
TEST(ImageWriter, PyramidPagesAreHalvedLevelsOfTheImage) {
  const int w = 1000, h = 700;
  cv::Mat probs(h, w, CV_32FC2), labels(h, w, CV_8UC1);
  cv::RNG rng(3);
  rng.fill(probs, cv::RNG::UNIFORM, 0.0, 1.0);
  rng.fill(labels, cv::RNG::UNIFORM, 0, 5);
  auto write = [&](const std::string& path, const cv::Mat& img, SampleType type, bool nearest) {
    WriterOptions o;
    o.pyramid = true;
    o.nearest = nearest;
    ImageWriter writer(path, w, h, img.channels(), type, o);
    for (int y = 0; y < h; y += 97) writer.writeRows(img.rowRange(y, std::min(h, y + 97)));  // odd bands
    writer.close();
  };
  const std::string p = tempPath("pyramid_probs.tif"), l = tempPath("pyramid_labels.tif");
  write(p, probs, SampleType::kF32, false);
  write(l, labels, SampleType::kU8, true);
  for (const auto& e : fs::directory_iterator(fs::path(p).parent_path()))
    EXPECT_EQ(e.path().string().find(".level"), std::string::npos) << e.path();
  TIFF* t = TIFFOpen(p.c_str(), "r");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(TIFFNumberOfDirectories(t), 3) << "1000x700 -> 500x350 -> 250x175 (fits one 256 px tile)";
  ASSERT_TRUE(TIFFSetDirectory(t, 1));
  uint32_t lw = 0, lh = 0, subfile = 0;
  TIFFGetField(t, TIFFTAG_IMAGEWIDTH, &lw);
  TIFFGetField(t, TIFFTAG_IMAGELENGTH, &lh);
  TIFFGetField(t, TIFFTAG_SUBFILETYPE, &subfile);
  EXPECT_EQ(lw, 500u);
  EXPECT_EQ(lh, 350u);
  EXPECT_EQ(subfile, uint32_t(FILETYPE_REDUCEDIMAGE));
  std::vector<float> tile(size_t(TIFFTileSize(t) / 4));
  ASSERT_GT(TIFFReadTile(t, tile.data(), 256, 0, 0, 0),
            0);  // level-1 pixel (256, 0): level 0's 512..513, 0..1
  const float mean = (probs.at<cv::Vec2f>(0, 512)[1] + probs.at<cv::Vec2f>(0, 513)[1] +
                      probs.at<cv::Vec2f>(1, 512)[1] + probs.at<cv::Vec2f>(1, 513)[1]) /
                     4;
  EXPECT_NEAR(tile[1], mean, 1e-6);
  TIFFClose(t);
  t = TIFFOpen(l.c_str(), "r");
  ASSERT_TRUE(TIFFSetDirectory(t, 2));
  std::vector<uint8_t> lt(size_t(TIFFTileSize(t)));
  ASSERT_GT(TIFFReadTile(t, lt.data(), 0, 0, 0, 0), 0);
  EXPECT_EQ(lt[size_t(3 * 256 + 5)], labels.at<uint8_t>(12, 20)) << "level 2 (3, 5) is level 0 (12, 20)";
  TIFFClose(t);
  // tiler's reader sees level 0.
  EXPECT_EQ(ImageReader::open(p)->info().width, 1000);
  // Half floats (--probs_dtype f16 --pyramid): halved in f32, rounded back.
  cv::Mat halves;
  probs.convertTo(halves, CV_16FC2);
  const std::string p16 = tempPath("pyramid_f16.tif");
  write(p16, halves, SampleType::kF16, false);
  auto level1 = ImageReader::open(p16);
  ASSERT_EQ(level1->info().levels.size(), 3u);
  const cv::Mat got = level1->readRegion({256, 0, 1, 1}, 1);
  ASSERT_EQ(got.depth(), CV_16F);
  cv::Mat got32;
  got.convertTo(got32, CV_32F);
  EXPECT_NEAR(got32.at<cv::Vec2f>(0, 0)[1], mean, 1e-3) << "level-1 pixel (256, 0)";
}

TEST(ImageWriter, LabelsCarryAPaletteAndReadBackAsIndices) {
  const std::string path = tempPath("palette.tif");
  cv::Mat labels(40, 50, CV_8UC1, cv::Scalar(0));
  labels(cv::Rect(10, 10, 20, 20)).setTo(2);
  WriterOptions o;
  o.colormap = {{0, 0, 0}, {255, 0, 0}, {10, 200, 30}};
  o.description = "{\"classes\": [\"a\", \"b\", \"c\"]}";
  ImageWriter writer(path, 50, 40, 1, SampleType::kU8, o);
  writer.writeRows(labels);
  writer.close();
  TIFF* t = TIFFOpen(path.c_str(), "r");
  uint16_t photometric = 0;
  uint16_t *r = nullptr, *g = nullptr, *b = nullptr;
  TIFFGetField(t, TIFFTAG_PHOTOMETRIC, &photometric);
  ASSERT_TRUE(TIFFGetField(t, TIFFTAG_COLORMAP, &r, &g, &b));
  EXPECT_EQ(photometric, PHOTOMETRIC_PALETTE);
  EXPECT_EQ(g[2], 200 * 257);
  EXPECT_EQ(r[0], 0);
  TIFFClose(t);
  auto reader = ImageReader::open(path);
  cv::Mat back = reader->readRegion({0, 0, 50, 40});
  EXPECT_EQ(cv::countNonZero(back != labels), 0) << "the indices, not the colours";
  // The colour map goes with the indices, for a model that takes RGB (ChannelAdapt::kPalette).
  ASSERT_NE(reader->info().colormap, nullptr);
  EXPECT_EQ(reader->info().colormap->size(), 256u);
  EXPECT_EQ((*reader->info().colormap)[2], (std::array<uint16_t, 3>{10 * 257, 200 * 257, 30 * 257}));
  WriterOptions bad;
  bad.colormap = {{0, 0, 0}};
  EXPECT_THROW(ImageWriter(tempPath("bad_palette.tif"), 4, 4, 3, SampleType::kU8, bad), Error);
}

TEST(ImageWriter, CopiesGeoTiffAndResolutionTagsAdjustedForScale) {
  auto src = tempPath("geo.tif");
  cv::Mat img = randomImage(64, 64, CV_8UC1, 1);
  writeTiff(src, img, true, COMPRESSION_NONE, false);
  {
    // Add georeferencing with a plain libtiff append (the reader registers the GeoTIFF tags).
    ImageReader::open(src);
    TIFF* t = TIFFOpen(src.c_str(), "r+");
    double scale[3] = {0.5, 0.5, 0};
    double tie[6] = {0, 0, 0, 1000, 2000, 0};
    uint16_t keys[4] = {1, 1, 0, 0};
    TIFFSetField(t, 33550, 3, scale);
    TIFFSetField(t, 33922, 6, tie);
    TIFFSetField(t, 34735, 4, keys);
    TIFFSetField(t, 34737, "WGS 84|");
    TIFFSetField(t, TIFFTAG_XRESOLUTION, 300.0f);
    TIFFSetField(t, TIFFTAG_YRESOLUTION, 300.0f);
    TIFFSetField(t, TIFFTAG_RESOLUTIONUNIT, RESUNIT_INCH);
    TIFFRewriteDirectory(t);
    TIFFClose(t);
  }
  auto out = tempPath("geo_out.tif");
  WriterOptions o;
  o.metadata_from = src;
  o.metadata_scale = 0.5;  // a model that halves the resolution
  writeWithWriter(out, cv::Mat(32, 32, CV_8UC1, cv::Scalar(1)), SampleType::kU8, o);
  TIFF* t = TIFFOpen(out.c_str(), "r");
  ASSERT_NE(t, nullptr);
  uint16_t n = 0;
  double* scale = nullptr;
  ASSERT_TRUE(TIFFGetField(t, 33550, &n, &scale));
  EXPECT_DOUBLE_EQ(scale[0], 1.0);
  double* tie = nullptr;
  ASSERT_TRUE(TIFFGetField(t, 33922, &n, &tie));
  EXPECT_DOUBLE_EQ(tie[3], 1000);
  uint16_t* keys = nullptr;
  ASSERT_TRUE(TIFFGetField(t, 34735, &n, &keys));
  EXPECT_EQ(n, 4);
  char* ascii = nullptr;
  ASSERT_TRUE(TIFFGetField(t, 34737, &ascii));
  EXPECT_STREQ(ascii, "WGS 84|");
  float xres = 0;
  ASSERT_TRUE(TIFFGetField(t, TIFFTAG_XRESOLUTION, &xres));
  EXPECT_FLOAT_EQ(xres, 150.0f);
  TIFFClose(t);
}

TEST(ImageReader, ADocumentsDpiIsNoPhysicalSizeButAScansIs) {
  // 72 dpi is what many writers put in every TIFF: 352.8 µm/px would drive --mpp to nonsense. A scanner's
  // 101600 dpi is 0.25 µm/px.
  for (const auto& [dpi, mpp] : {std::pair<float, double>{72.0f, 0.0}, {300.0f, 0.0}, {101600.0f, 0.25}}) {
    const auto path = tempPath("dpi.tif");
    writeTiff(path, randomImage(16, 16, CV_8UC1, 1), true, COMPRESSION_NONE, false);
    TIFF* t = TIFFOpen(path.c_str(), "r+");
    TIFFSetField(t, TIFFTAG_XRESOLUTION, dpi);
    TIFFSetField(t, TIFFTAG_YRESOLUTION, dpi);
    TIFFSetField(t, TIFFTAG_RESOLUTIONUNIT, RESUNIT_INCH);
    TIFFRewriteDirectory(t);
    TIFFClose(t);
    const auto info = ImageReader::open(path)->info();
    if (mpp == 0) {
      EXPECT_FALSE(info.mpp.has_value()) << dpi << " dpi read as " << *info.mpp << " µm/px";
    } else {
      ASSERT_TRUE(info.mpp.has_value()) << dpi;
      EXPECT_NEAR(*info.mpp, mpp, 1e-6);
    }
  }
}

TEST(ImageIo, CompressionTakesLibtiffsLevelsAndRefusesTheRest) {
  EXPECT_EQ(parseCompression("zstd"), (Compression{Codec::kZstd, 0}));
  EXPECT_EQ(parseCompression("deflate:1"), (Compression{Codec::kDeflate, 1}));
  EXPECT_EQ(parseCompression("zip:12"), (Compression{Codec::kDeflate, 12}));
  EXPECT_EQ(parseCompression("zstd:22"), (Compression{Codec::kZstd, 22}));
  EXPECT_EQ(parseCompression("none"), (Compression{Codec::kNone}));
  for (const char* bad : {"rar", "", "deflate:0", "deflate:13", "deflate:", "deflate:x", "deflate:-1",
                          "deflate:007", "zstd:23", "lzw:1", "none:0", "deflate:1:2"})
    EXPECT_THROW(parseCompression(bad), ConfigError) << bad;
  for (const char* text : {"deflate", "deflate:9", "zstd:3", "lzw", "none"})
    EXPECT_EQ(compressionName(parseCompression(text)), text);
  // Every level parseCompression takes, this libtiff (with libdeflate, as Debian's and the bundle's) writes.
  EXPECT_NO_THROW(checkCompression(parseCompression("deflate:12")));
  EXPECT_NO_THROW(checkCompression(parseCompression("zstd:22")));
}

TEST(ImageIo, CompressingThreadsFitTheCodecBudget) {
  EXPECT_EQ(compressionThreads(parseCompression("zstd:22"), 4), 1);
  EXPECT_EQ(compressionThreads(parseCompression("zstd:21"), 64), 2);
  EXPECT_EQ(compressionThreads(parseCompression("zstd:19"), 64), 10);
  EXPECT_EQ(compressionThreads(parseCompression("zstd:3"), 64), 64);
  EXPECT_EQ(compressionThreads(parseCompression("deflate:12"), 64), 64);
  // Rising with the level and ranked as zstd's own estimate (ZSTD_estimateCStreamSize) ranks them.
  for (int level = 2; level <= 22; ++level)
    EXPECT_GE(compressorBytes({Codec::kZstd, level}), compressorBytes({Codec::kZstd, level - 1})) << level;
  EXPECT_EQ(compressorBytes({Codec::kZstd, 0}), compressorBytes({Codec::kZstd, 9}));  // libtiff's default
}

// Without --compression each output gets the measured default of its sample type and values
// (docs/performance.md): integer categories deflate without a predictor, floats and integer measurements
// zstd (floats with the floating-point predictor where it pays: the next test); an asked codec wins.
TEST(ImageWriter, EachSampleTypeGetsTheMeasuredDefaultCodec) {
  struct Case {
    int cv_type;
    SampleType type;
    RasterValues values;
    uint16_t codec, predictor;
  };
  const auto categories = RasterValues::kCategories, measurements = RasterValues::kMeasurements;
  for (const Case& c :
       {Case{CV_8UC1, SampleType::kU8, categories, COMPRESSION_ADOBE_DEFLATE, PREDICTOR_NONE},
        Case{CV_16UC1, SampleType::kU16, categories, COMPRESSION_ADOBE_DEFLATE, PREDICTOR_NONE},
        Case{CV_8UC2, SampleType::kU8, measurements, COMPRESSION_ZSTD, PREDICTOR_NONE},
        Case{CV_16UC2, SampleType::kU16, measurements, COMPRESSION_ZSTD, PREDICTOR_NONE},
        Case{CV_16FC2, SampleType::kF16, categories, COMPRESSION_ZSTD, PREDICTOR_NONE},
        Case{CV_32FC2, SampleType::kF32, measurements, COMPRESSION_ZSTD, PREDICTOR_NONE}}) {
    for (bool asked : {false, true}) {
      const std::string path = tempPath("default_codec.tif");
      WriterOptions o;
      o.values = c.values;
      if (asked) o.compression = Compression{Codec::kLzw};
      const cv::Mat img = randomImage(40, 50, c.cv_type, 3);  // noise: no predictor pays
      writeWithWriter(path, img, c.type, o);
      TIFF* t = TIFFOpen(path.c_str(), "r");
      ASSERT_NE(t, nullptr);
      uint16_t codec = 0, predictor = 0;
      TIFFGetField(t, TIFFTAG_COMPRESSION, &codec);
      TIFFGetFieldDefaulted(t, TIFFTAG_PREDICTOR, &predictor);
      TIFFClose(t);
      EXPECT_EQ(codec, asked ? COMPRESSION_LZW : c.codec) << sampleTypeName(c.type);
      const bool floats = c.type == SampleType::kF32 || c.type == SampleType::kF16;
      EXPECT_EQ(predictor, asked ? (floats ? PREDICTOR_FLOATINGPOINT : PREDICTOR_HORIZONTAL) : c.predictor)
          << sampleTypeName(c.type);
      expectRegionsMatch(*ImageReader::open(path), img, 3, 5);
    }
  }
}

// The predictor's rule on the bytes of the sampled tiles (of 1000 raw): kept where it makes them smaller by
// more than 2%, on a background, and on tiles that compress 3x where it costs at most a quarter more bytes
// (zstd is then faster on its planes); not on noise, nor where it costs more than a quarter.
TEST(ImageWriter, KeepsThePredictorWhereItPaysInBytesOrInTime) {
  EXPECT_TRUE(keepsPredictor(580, 880, 1000));   // smooth: 1.5x smaller with it
  EXPECT_TRUE(keepsPredictor(30, 15, 1000));     // a background: 64x smaller without it
  EXPECT_TRUE(keepsPredictor(207, 177, 1000));   // textured: 17% larger with it, 4.8x smaller
  EXPECT_TRUE(keepsPredictor(250, 200, 1000));   // a quarter larger: still kept
  EXPECT_FALSE(keepsPredictor(251, 200, 1000));  // more than a quarter
  EXPECT_FALSE(keepsPredictor(227, 176, 1000));  // textured, 5 classes: 29% larger with it
  EXPECT_FALSE(keepsPredictor(893, 900, 1000));  // noise: under 2% smaller with it
  EXPECT_FALSE(keepsPredictor(340, 330, 1000));  // compresses under 3x with it
}

// The default float compression keeps the floating-point predictor where the first row of tiles says it pays:
// smooth values (model outputs over real images: much smaller with it), a first row of one value (a slide's
// background says nothing); not on noise (no smaller, 2.4x slower). Each pyramid level decides on its own
// first row. Every file reads back exactly, and a pool of threads writes the bytes of the caller's thread.
TEST(ImageWriter, DefaultFloatCompressionKeepsThePredictorWhereItPays) {
  const int w = 700, h = 600;
  cv::Mat smooth(h, w, CV_32FC2), noise = randomImage(h, w, CV_32FC2, 5), background = noise.clone();
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const float p = 0.5f + 0.5f * std::sin(float(x) / 40.0f) * std::cos(float(y) / 55.0f);
      smooth.at<cv::Vec2f>(y, x) = {p, 1.0f - p};
    }
  background.rowRange(0, 300).setTo(cv::Scalar(0.25, 0.75));
  auto pool = std::make_shared<WorkPool>(3);
  struct Case {
    const char* name;
    const cv::Mat* img;
    SampleType type;
    bool predictor, levels_predictor;
  };
  // The background's 300 rows fill level 0's first row of tiles, half of level 1's: noise decides there.
  for (const Case& c : {Case{"smooth f32", &smooth, SampleType::kF32, true, true},
                        Case{"noise f32", &noise, SampleType::kF32, false, false},
                        Case{"background then noise f32", &background, SampleType::kF32, true, false},
                        Case{"smooth f16", &smooth, SampleType::kF16, true, true},
                        Case{"noise f16", &noise, SampleType::kF16, false, false}}) {
    cv::Mat img;
    c.img->convertTo(img, c.type == SampleType::kF16 ? CV_16FC2 : CV_32FC2);
    std::string files[2];
    for (int pooled = 0; pooled < 2; ++pooled) {
      files[pooled] = tempPath("choose" + std::to_string(pooled) + ".tif");
      WriterOptions o;
      o.pyramid = true;
      o.background = pooled == 1;
      if (pooled) o.pool = pool;
      ImageWriter writer(files[pooled], w, h, 2, c.type, o);
      for (int y = 0; y < h; y += 113) writer.writeRows(img.rowRange(y, std::min(h, y + 113)));
      writer.close();
    }
    EXPECT_TRUE(test::slurp(files[0]) == test::slurp(files[1])) << c.name;
    TIFF* t = TIFFOpen(files[0].c_str(), "r");
    ASSERT_NE(t, nullptr);
    int pages = 0;
    do {
      uint16_t codec = 0, predictor = 0;
      TIFFGetField(t, TIFFTAG_COMPRESSION, &codec);
      TIFFGetFieldDefaulted(t, TIFFTAG_PREDICTOR, &predictor);
      EXPECT_EQ(codec, COMPRESSION_ZSTD) << c.name;
      const bool with = pages == 0 ? c.predictor : c.levels_predictor;
      EXPECT_EQ(predictor, with ? PREDICTOR_FLOATINGPOINT : PREDICTOR_NONE) << c.name << ", page " << pages;
      ++pages;
    } while (TIFFReadDirectory(t));
    TIFFClose(t);
    EXPECT_EQ(pages, 3) << c.name;
    EXPECT_TRUE(equalMats(ImageReader::open(files[0])->readRegion({0, 0, w, h}), img)) << c.name;
  }
}

}  // namespace
}  // namespace tiler

#include "fuzz/read_everything.hpp"

namespace tiler {
namespace {

// Every seed and every input the fuzzer ever crashed on (scripts/fuzz.sh) must now be read safely.
TEST(ImageReaderFuzz, CorpusAndRegressionsReadWithoutCrashing) {
  int files = 0;
  for (const char* dir : {"/tests/fuzz/corpus", "/tests/fuzz/regressions"}) {
    const fs::path path = std::string(TILER_TEST_SOURCE_DIR) + dir;
    if (!fs::exists(path)) continue;
    for (const auto& e : fs::directory_iterator(path)) {
      fuzz::readEverything(e.path().string());
      ++files;
    }
  }
  EXPECT_GE(files, 4);
}

}  // namespace
}  // namespace tiler
