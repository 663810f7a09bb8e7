// The window loader: padding, channel adaptation of every sample type, read-ahead that stops promptly and
// carries errors, and per-image failures that never stop the batch.
#include "tiler/dist/loader.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/writers/formats.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

void writeImage(const std::string& path, const cv::Mat& img, SampleType type) {
  ImageWriter w(path, img.cols, img.rows, img.channels(), type);
  w.writeRows(img);
  w.close();
}

TEST(Loader, ReadWindowPadsOutsideTheImage) {
  const std::string dir = test::scratchDir("pad");
  cv::Mat img(2, 3, CV_8UC1);
  for (int i = 0; i < 6; ++i) img.data[i] = uchar(10 * (i + 1));
  writeImage(dir + "/p.tif", img, SampleType::kU8);
  auto reader = ImageReader::open(dir + "/p.tif");
  WindowGrid g(3, 2, GridSpec{5, 4, 0.25, 0.25});
  cv::Mat c = readWindow(*reader, g, 0, PadMode::kConstant, 7);
  EXPECT_EQ(c.at<uint8_t>(0, 0), 7);
  EXPECT_EQ(c.at<uint8_t>(1, 1), 10);
  cv::Mat rep = readWindow(*reader, g, 0, PadMode::kReplicate, 0);
  EXPECT_EQ(rep.at<uint8_t>(0, 0), 10);
  cv::Mat ref = readWindow(*reader, g, 0, PadMode::kReflect, 0);
  EXPECT_EQ(ref.at<uint8_t>(0, 1), 40) << "reflect without repeating the edge, like torch";
  removeTree(dir);
}

// One file read at two resolutions is two readers; dropping the file closes both, and only its.
TEST(Loader, ReaderCacheKeepsOneReaderPerFileAndResolution) {
  const std::string dir = test::scratchDir("reader_cache");
  writeImage(dir + "/a.tif", cv::Mat(40, 60, CV_8UC1, cv::Scalar(9)), SampleType::kU8);
  writeImage(dir + "/b.tif", cv::Mat(10, 10, CV_8UC1, cv::Scalar(9)), SampleType::kU8);
  ProcessingResolution half;
  half.factor = half.downsample = 2;
  half.width = 30;
  half.height = 20;
  ReaderCache cache;
  ImageReader& full = cache.get(dir + "/a.tif");
  ImageReader& halved = cache.get(dir + "/a.tif", half);
  EXPECT_NE(&full, &halved);
  EXPECT_EQ(full.info().width, 60);
  EXPECT_EQ(halved.info().width, 30);
  EXPECT_EQ(&cache.get(dir + "/a.tif", half), &halved) << "asked again: the same reader";
  cache.get(dir + "/b.tif");
  EXPECT_EQ(cache.size(), 3u);
  cache.dropBefore(dir + "/b.tif");
  EXPECT_EQ(cache.size(), 1u) << "both of a.tif's readers are before b.tif";
  cache.get(dir + "/a.tif");
  cache.drop(dir + "/a.tif");
  EXPECT_EQ(cache.size(), 1u);
  removeTree(dir);
}

// OpenCV's cvtColor refuses i16 and u32: alpha must still be dropped (the RGBA int16 TIFF users hit).
TEST(Loader, ChannelAdaptationWorksForEverySampleType) {
  for (int depth : {CV_8U, CV_16U, CV_16S, CV_32S, CV_32F}) {
    cv::Mat rgba(2, 2, CV_MAKETYPE(depth, 4), cv::Scalar(1, 2, 3, 4));
    std::vector<float> out(2 * 2 * 3);
    windowToModelInput(rgba, ChannelAdapt::kDropAlpha, out.data());
    // Planes of 2x2: channel c of pixel p at out[c * 4 + p].
    EXPECT_EQ(out[0], 1.f) << depth;
    EXPECT_EQ(out[8], 3.f) << depth;
    EXPECT_EQ(out[1], 1.f) << "next pixel, depth " << depth;
    EXPECT_EQ(out[7], 2.f) << "last pixel, depth " << depth;
    cv::Mat gray(2, 2, CV_MAKETYPE(depth, 1), cv::Scalar(5));
    windowToModelInput(gray, ChannelAdapt::kRepeatGray, out.data());
    EXPECT_EQ(out[0], 5.f);
    EXPECT_EQ(out[8], 5.f);
    EXPECT_EQ(out[11], 5.f);
    // As bytes: the same values for 8-bit samples; any other depth would be cut, so it is refused.
    std::vector<uint8_t> bytes(out.size());
    if (depth != CV_8U) {
      EXPECT_THROW(windowToModelInput(rgba, ChannelAdapt::kDropAlpha, bytes.data()), IoError) << depth;
      continue;
    }
    cv::Mat noise(3, 5, CV_8UC3);
    cv::randu(noise, 0, 256);
    std::vector<float> floats(3 * 3 * 5);
    bytes.resize(floats.size());
    windowToModelInput(noise, ChannelAdapt::kNone, floats.data());
    windowToModelInput(noise, ChannelAdapt::kNone, bytes.data());
    EXPECT_EQ(floats, std::vector<float>(bytes.begin(), bytes.end()));
    windowToModelInput(gray, ChannelAdapt::kRepeatGray, bytes.data());
    EXPECT_EQ(bytes[0], 5);
    EXPECT_EQ(bytes[11], 5);
  }
}

// A palette TIFF's indices become their colours for an RGB model, in the indices' sample range.
TEST(Loader, PaletteIndicesBecomeTheirColours) {
  const std::vector<std::array<uint16_t, 3>> map = {
      {0, 0, 0}, {65535, 0, 0}, {10 * 257, 200 * 257, 30 * 257}};
  cv::Mat indices = (cv::Mat_<uint8_t>(1, 3) << 2, 0, 1);
  std::vector<float> out(3 * 3);
  windowToModelInput(indices, ChannelAdapt::kPalette, out.data(), &map);
  EXPECT_EQ(out, (std::vector<float>{10, 0, 255, 200, 0, 0, 30, 0, 0}));  // planes R, G, B
  cv::Mat wide = (cv::Mat_<uint16_t>(1, 3) << 2, 0, 1);
  windowToModelInput(wide, ChannelAdapt::kPalette, out.data(), &map);
  EXPECT_EQ(out, (std::vector<float>{2570, 0, 65535, 51400, 0, 0, 7710, 0, 0}));
  EXPECT_THROW(windowToModelInput(indices, ChannelAdapt::kPalette, out.data(), nullptr), IoError);
  std::vector<uint8_t> bytes(3 * 3);
  windowToModelInput(indices, ChannelAdapt::kPalette, bytes.data(), &map);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{10, 0, 255, 200, 0, 0, 30, 0, 0}));
  EXPECT_THROW(windowToModelInput(wide, ChannelAdapt::kPalette, bytes.data(), &map), IoError)
      << "16-bit indices are never read as bytes";
}

TEST(Loader, ReadAheadDeliversInOrderAndRethrows) {
  ReadAhead<int> ahead(5, 2, [](int64_t i) {
    if (i == 3) throw std::runtime_error("tile 3 is corrupt");
    return int(i * 10);
  });
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ahead.next(), i * 10);
  try {
    ahead.next();
    FAIL() << "the producer's error was lost";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "tile 3 is corrupt");
  }
}

TEST(Loader, ReadAheadStopsWithoutProducingTheRest) {
  std::atomic<int> produced{0};
  {
    ReadAhead<int> ahead(1000000, 2, [&](int64_t i) {
      ++produced;
      return int(i);
    });
    EXPECT_EQ(ahead.next(), 0);
    ahead.stop();
  }
  EXPECT_LT(produced.load(), 10) << "stop() left the producer running";
}

// The catalog of every image in `dir`, windows without overlap, and a slot for each of its windows.
std::pair<WindowCatalog, std::vector<SampleSlot>> catalogOf(const std::string& dir, const GridSpec& spec,
                                                            int channels) {
  InferCatalogOptions co;
  co.outputs = {{"labels", outputNaming("labels")}};
  co.inputs = {dir};
  co.output_dir = dir + "/out";
  WindowCatalog catalog =
      buildInferCatalog(co, CatalogSpec{spec, channels, Scale{}, 0.0, MaskSpec{}, ResolutionSpec{}});
  std::vector<SampleSlot> slots;
  for (int64_t i = 0; i < catalog.totalWindows(); ++i) slots.push_back({i, false});
  return {std::move(catalog), std::move(slots)};
}

// Read threads: 1 (the read-ahead thread alone) or 3 (two helpers); the batches must not differ.
class LoaderThreads : public ::testing::TestWithParam<int> {};

TEST_P(LoaderThreads, AFailingImageFailsItsSlotsOnly) {
  const std::string dir = test::scratchDir("loader");
  writeImage(dir + "/a.tif", cv::Mat(64, 64, CV_8UC3, cv::Scalar(10, 20, 30)), SampleType::kU8);
  writeImage(dir + "/b.tif", cv::Mat(64, 64, CV_8UC3, cv::Scalar(1, 2, 3)), SampleType::kU8);
  const GridSpec spec{32, 32, 0.0, 0.0};
  auto [catalog, slots] = catalogOf(dir, spec, 3);
  ASSERT_EQ(catalog.totalWindows(), 8);
  // a.tif disappears after planning: reading its windows fails; b.tif's still load.
  fs::remove(dir + "/a.tif");
  LoaderOptions lo;
  lo.batch_size = 8;
  lo.read_threads = GetParam();
  WindowLoader loader(catalog, spec, lo, slots, 1);
  auto batch = loader.next();
  ASSERT_TRUE(batch);
  const StepSlots& got = batch->slots;
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(got[0].status, SlotStatus::kFailed);
  for (int j = 1; j < 4; ++j)
    EXPECT_EQ(got[size_t(j)].status, SlotStatus::kSkipped) << "one failure per image, then skipped";
  for (int j = 4; j < 8; ++j) EXPECT_TRUE(got[size_t(j)].ok());
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(got[size_t(j)].window, j) << "the slot names its global window";
    EXPECT_EQ(got[size_t(j)].image, j / 4) << "and its image";
  }
  EXPECT_EQ(batch->valid, 4);
  ASSERT_EQ(batch->failures.size(), 1u);
  EXPECT_EQ(batch->failures[0].first, 0);
  EXPECT_NE(batch->failures[0].second.find("a.tif"), std::string::npos) << batch->failures[0].second;
  EXPECT_FLOAT_EQ(batch->pixels[4][2][0][0].item<float>(), 3.f);
  EXPECT_EQ(batch->pixels.slice(0, 1, 4).abs().sum().item<float>(), 0.f) << "skipped slots hold no pixels";
  removeTree(dir);
}

// Training's labels come with the pixels (one batch path for infer and finetune): read_labels fills each read
// slot's labels on the thread that read its pixels, in slots of any order; what it throws fails the slot and
// is kept as thrown (first_error).
TEST_P(LoaderThreads, LabelsAreReadBesideThePixelsAndTheirErrorsKeptAsThrown) {
  const std::string dir = test::scratchDir("loader_labels");
  writeImage(dir + "/a.tif", cv::Mat(64, 64, CV_8UC1, cv::Scalar(7)), SampleType::kU8);
  writeImage(dir + "/b.tif", cv::Mat(64, 64, CV_8UC1, cv::Scalar(9)), SampleType::kU8);
  const GridSpec spec{32, 32, 0.0, 0.0};
  auto [catalog, slots] = catalogOf(dir, spec, 1);
  std::reverse(slots.begin(), slots.end());  // shuffled: b's windows first
  LoaderOptions lo;
  lo.batch_size = 8;
  lo.input_channels = 1;
  lo.read_threads = GetParam();
  lo.in_order = false;
  lo.make_labels = [](int64_t B) { return std::vector<torch::Tensor>{torch::full({B}, -1.0f)}; };
  lo.read_labels = [](std::vector<torch::Tensor>& labels, int64_t j, int image_id, int64_t local) {
    labels[0][j] = float(image_id * 100 + local);
  };
  {
    WindowLoader loader(catalog, spec, lo, slots, 1);
    auto batch = loader.next();
    ASSERT_TRUE(batch);
    ASSERT_EQ(batch->labels.size(), 1u);
    for (int64_t j = 0; j < 8; ++j) {
      const auto [image, local] = catalog.locate(slots[size_t(j)].index);
      EXPECT_EQ(batch->labels[0][j].item<float>(), float(image * 100 + local)) << "slot " << j;
      EXPECT_EQ(batch->pixels[j][0][0][0].item<float>(), image == 0 ? 7.f : 9.f) << "slot " << j;
    }
    EXPECT_FALSE(batch->first_error);
  }
  lo.read_labels = [](std::vector<torch::Tensor>&, int64_t, int image_id, int64_t) {
    if (image_id == 0) throw IoError("no labels for a.tif");
  };
  WindowLoader loader(catalog, spec, lo, slots, 1);
  auto batch = loader.next();
  ASSERT_TRUE(batch);
  ASSERT_TRUE(batch->first_error);
  try {
    std::rethrow_exception(batch->first_error);
  } catch (const IoError& e) {
    EXPECT_EQ(e.message(), "no labels for a.tif");
  }
  EXPECT_EQ(batch->valid, 4) << "b's four; a's first window failed and its others were skipped";
  removeTree(dir);
}

// A batch that spans more images than the reader cache holds (8): readers the cache closes mid-batch stay
// open for the windows that still read them, and every window holds its own image's pixels.
TEST_P(LoaderThreads, ABatchOverMoreImagesThanTheReaderCacheHolds) {
  const std::string dir = test::scratchDir("loader_many");
  const int images = 13;
  for (int i = 0; i < images; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/im%02d.tif", i);
    writeImage(dir + name, cv::Mat(40, 40, CV_8UC1, cv::Scalar(i + 1)), SampleType::kU8);
  }
  const GridSpec spec{32, 32, 0.0, 0.0};
  auto [catalog, slots] = catalogOf(dir, spec, 1);
  const int64_t per_image = catalog.totalWindows() / images;
  LoaderOptions lo;
  lo.batch_size = catalog.totalWindows();
  lo.input_channels = 1;
  lo.read_threads = GetParam();
  WindowLoader loader(catalog, spec, lo, slots, 1);
  auto batch = loader.next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->valid, catalog.totalWindows());
  EXPECT_TRUE(batch->failures.empty());
  for (int64_t j = 0; j < catalog.totalWindows(); ++j) {
    const float want = float(j / per_image + 1);
    // The window's pixels inside the image (windows at the right and bottom edges are padded with 0).
    EXPECT_EQ(batch->pixels[j][0][0][0].item<float>(), want) << "slot " << j;
  }
  removeTree(dir);
}

// Images of 8-bit samples are read as bytes, padding included, holding the values a float batch holds; one
// image of another sample type keeps the whole catalog's batches in floats.
TEST_P(LoaderThreads, BatchesOfBytesHoldTheValuesOfFloatBatches) {
  const std::string dir = test::scratchDir("loader_bytes");
  cv::Mat noise(70, 90, CV_8UC3);
  cv::randu(noise, 0, 256);
  writeImage(dir + "/a.tif", noise, SampleType::kU8);
  const GridSpec spec{32, 32, 0.0, 0.0};  // windows past the right and bottom edges: padded
  auto [catalog, slots] = catalogOf(dir, spec, 3);
  ASSERT_TRUE(inputAsBytes(catalog));
  LoaderOptions lo;
  lo.batch_size = catalog.totalWindows() + 2;  // and two slots of no window
  lo.read_threads = GetParam();
  lo.pad = PadMode::kReflect;
  // One loader after the other, as a job has them: a read-ahead thread opens the readers (OpenSlide's vendor
  // detection through glib, whose slice allocator ThreadSanitizer does not see synchronised across threads).
  auto firstBatch = [&](bool as_bytes) {
    lo.bytes = as_bytes;
    WindowLoader loader(catalog, spec, lo, slots, 1);
    return loader.next();
  };
  auto f = firstBatch(false), b = firstBatch(true);
  ASSERT_TRUE(f && b);
  EXPECT_EQ(f->pixels.scalar_type(), torch::kFloat32);
  ASSERT_EQ(b->pixels.scalar_type(), torch::kUInt8);
  EXPECT_EQ(b->valid, catalog.totalWindows());
  EXPECT_TRUE(torch::equal(f->pixels, b->pixels.to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(f->scales, b->scales));
  EXPECT_GT(b->pixels.to(torch::kFloat32).sum().item<double>(), 0.0);
  writeImage(dir + "/b.tif", cv::Mat(8, 8, CV_16UC3, cv::Scalar(300, 2, 1)), SampleType::kU16);
  EXPECT_FALSE(inputAsBytes(catalogOf(dir, spec, 3).first)) << "a 16-bit image keeps floats";
  removeTree(dir);
}

INSTANTIATE_TEST_SUITE_P(Threads, LoaderThreads, ::testing::Values(1, 3),
                         [](const auto& info) { return std::to_string(info.param) + "_read_threads"; });

// Every index once, on several threads, job after job; a pool of one runs on the caller alone.
TEST(Loader, ParallelForRunsEveryIndexOnceOnItsThreads) {
  for (int threads : {1, 3}) {
    ParallelFor pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int job = 0; job < 50; ++job) {
      const int64_t count = job % 7;
      std::vector<std::atomic<int>> hits(size_t(count) + 1);
      std::mutex mutex;
      std::set<std::thread::id> ran_on;
      pool.run(count, [&](int64_t i) {
        hits[size_t(i)]++;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::lock_guard<std::mutex> lock(mutex);
        ran_on.insert(std::this_thread::get_id());
      });
      for (int64_t i = 0; i < count; ++i)
        EXPECT_EQ(hits[size_t(i)].load(), 1) << "job " << job << " index " << i;
      EXPECT_LE(int(ran_on.size()), threads);
      if (threads == 1 && count > 0) {
        EXPECT_EQ(*ran_on.begin(), std::this_thread::get_id());
      }
    }
  }
}

}  // namespace
}  // namespace tiler
