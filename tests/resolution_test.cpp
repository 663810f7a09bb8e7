// slide: resolution choice, resampling that tiles exactly, TIFF levels (pages and SubIFDs) and OpenSlide.
#include "tiler/io/resolution.hpp"

#include <gtest/gtest.h>
#include <tiffio.h>

#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>

#include "slide_util.hpp"
#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/io/readers/readers.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

ImageInfo slideInfo(std::optional<double> mpp, std::optional<double> power) {
  ImageInfo info;
  info.path = "slide.svs";
  info.width = 4000;
  info.height = 3000;
  // An odd-sized scan: the "2x" level has a downsample of 2.0003, as scanners round level sizes.
  info.levels = {{4000, 3000, 1.0}, {1999, 1500, 2.0003}, {1000, 750, 4.0}, {250, 187, 16.02}};
  info.mpp = mpp;
  info.objective_power = power;
  return info;
}

std::string errorOf(const ImageInfo& info, const ResolutionSpec& spec) {
  try {
    chooseResolution(info, spec);
  } catch (const IoError& e) {
    return e.message();
  }
  return "";
}

TEST(Slide, ChoosesTheCoarsestLevelAtLeastAsFineAndResamplesOnlyBetweenLevels) {
  const ImageInfo info = slideInfo(0.25, 40);
  auto native = chooseResolution(info, {});
  EXPECT_TRUE(native.native());
  EXPECT_EQ(native.width, 4000);
  EXPECT_DOUBLE_EQ(*native.mpp, 0.25);

  auto level1 = chooseResolution(info, ResolutionSpec{-1, 0.5});  // within 1% of level 1: as it is
  EXPECT_EQ(level1.level, 1);
  EXPECT_EQ(level1.factor, 1.0);
  EXPECT_EQ(level1.width, 1999);
  EXPECT_EQ(level1.height, 1500);
  EXPECT_NEAR(*level1.mpp, 0.25 * 2.0003, 1e-12);  // the level's own resolution is reported

  auto between = chooseResolution(info, ResolutionSpec{-1, 0.75});  // 3x: level 1 resampled by 1.4998
  EXPECT_EQ(between.level, 1);
  EXPECT_NEAR(between.factor, 3.0 / 2.0003, 1e-12);
  EXPECT_EQ(between.width, int64_t(1999 / between.factor));
  EXPECT_NEAR(between.downsample, 3.0, 1e-12);
  EXPECT_NEAR(*between.mpp, 0.75, 1e-12);

  auto coarse = chooseResolution(info, ResolutionSpec{-1, 8.0});  // 32x: below the coarsest level
  EXPECT_EQ(coarse.level, 3);
  EXPECT_NEAR(coarse.factor, 32.0 / 16.02, 1e-12);

  auto level2 = chooseResolution(info, ResolutionSpec{2});
  EXPECT_EQ(level2.level, 2);
  EXPECT_EQ(level2.factor, 1.0);
  EXPECT_EQ(level2.width, 1000);
  EXPECT_DOUBLE_EQ(*level2.mpp, 1.0);
}

TEST(Slide, MagnificationGoesByObjectivePowerElseTenMicrometresOverX) {
  // 40x scan: 20x is level 1, whatever the µm/px says.
  auto by_power = chooseResolution(slideInfo(0.3, 40), ResolutionSpec{-1, 0, 20});
  EXPECT_EQ(by_power.level, 1);
  EXPECT_EQ(by_power.factor, 1.0);
  // No objective power: 20x is 0.5 µm/px, so a 0.25 µm/px scan reads level 1.
  auto by_mpp = chooseResolution(slideInfo(0.25, std::nullopt), ResolutionSpec{-1, 0, 20});
  EXPECT_EQ(by_mpp.level, 1);
  // --input_mpp overrides the metadata.
  auto overridden = chooseResolution(slideInfo(0.25, std::nullopt), ResolutionSpec{-1, 1.0, 0, 0.5});
  EXPECT_EQ(overridden.level, 1);
  EXPECT_DOUBLE_EQ(*overridden.source_mpp, 0.5);
}

TEST(Slide, TargetsThatCannotBeMetNameTheImageAndWhy) {
  EXPECT_NE(
      errorOf(slideInfo(std::nullopt, std::nullopt), ResolutionSpec{-1, 0.5}).find("states no resolution"),
      std::string::npos);
  EXPECT_NE(
      errorOf(slideInfo(std::nullopt, std::nullopt), ResolutionSpec{-1, 0, 20}).find("neither an objective"),
      std::string::npos);
  const std::string finer = errorOf(slideInfo(0.25, 40), ResolutionSpec{-1, 0.1});
  EXPECT_NE(finer.find("'slide.svs': --mpp 0.1 is finer than the scan itself (level 0 is 0.25 µm/px, 40x)"),
            std::string::npos)
      << finer;
  EXPECT_NE(errorOf(slideInfo(0.25, 40), ResolutionSpec{-1, 0, 80}).find("finer than the scan"),
            std::string::npos);
  // A target coarser than the whole image is refused in words, not as an overflowed region.
  const std::string coarse = errorOf(slideInfo(0.25, 40), ResolutionSpec{-1, 1e308});
  EXPECT_NE(coarse.find("--mpp 1e+308 is coarser than the whole image"), std::string::npos) << coarse;
  EXPECT_NE(errorOf(slideInfo(0.25, 40), ResolutionSpec{-1, 0, 1e-300}).find("coarser than the whole image"),
            std::string::npos);
  EXPECT_NE(
      errorOf(slideInfo(0.25, 40), ResolutionSpec{4}).find("--level 4 does not exist (it has 4 level(s)"),
      std::string::npos);
  // Within the tolerance of level 0 is level 0, not an error.
  EXPECT_TRUE(chooseResolution(slideInfo(0.25, 40), ResolutionSpec{-1, 0.249}).native());
}

TEST(Slide, ATargetFinerThanLevelZeroIsLevelZeroUpsampledUnlessRefused) {
  const std::string refused = errorOf(slideInfo(0.25, 40), ResolutionSpec{-1, 0.125});
  EXPECT_NE(
      refused.find("--mpp 0.125 is finer than the scan itself (level 0 is 0.25 µm/px, 40x), which would "
                   "take upsampling 2x; --no_upsample refuses it"),
      std::string::npos)
      << refused;
  const auto up = chooseResolution(slideInfo(0.25, 40), ResolutionSpec{-1, 0.125, 0, 0, /*upsample=*/true});
  EXPECT_EQ(up.level, 0);
  EXPECT_DOUBLE_EQ(up.factor, 0.5);
  EXPECT_DOUBLE_EQ(up.downsample, 0.5);
  EXPECT_DOUBLE_EQ(up.upsampleFactor(), 2.0);
  EXPECT_EQ(up.width, 8000);
  EXPECT_EQ(up.height, 6000);
  EXPECT_DOUBLE_EQ(*up.mpp, 0.125);
  EXPECT_FALSE(up.native());
  const auto by_power = chooseResolution(slideInfo(0.25, 40), ResolutionSpec{-1, 0, 80, 0, true});
  EXPECT_DOUBLE_EQ(by_power.upsampleFactor(), 2.0);
  // Upsampling allowed changes nothing at or below level 0's resolution.
  EXPECT_DOUBLE_EQ(
      chooseResolution(slideInfo(0.25, 40), ResolutionSpec{-1, 0.75, 0, 0, true}).upsampleFactor(), 1.0);
  EXPECT_TRUE(chooseResolution(slideInfo(0.25, 40), ResolutionSpec{-1, 0.249, 0, 0, true}).native());
}

cv::Mat noiseImage(int h, int w, int type, unsigned seed) {
  cv::Mat m(h, w, type);
  cv::RNG rng(seed);
  rng.fill(m, cv::RNG::UNIFORM, 0, 255);
  return m;
}

void writeTiff(const std::string& path, const cv::Mat& img, bool pyramid = false) {
  WriterOptions o;
  o.pyramid = pyramid;
  o.tile = 64;
  ImageWriter w(path, img.cols, img.rows, img.channels(),
                img.depth() == CV_16U ? SampleType::kU16 : SampleType::kU8, o);
  w.writeRows(img);
  w.close();
}

TEST(Slide, ResampledWindowsHoldTheSamePixelsWhereverTheyLie) {
  const std::string dir = test::scratchDir("slide_resample");
  const cv::Mat img = noiseImage(257, 301, CV_8UC3, 7);
  writeTiff(dir + "/a.tif", img);
  ImageInfo info = ImageReader::open(dir + "/a.tif")->info();
  const ProcessingResolution res = chooseResolution(info, ResolutionSpec{-1, 1.5, 0, 1.0});
  ASSERT_DOUBLE_EQ(res.factor, 1.5);
  ASSERT_EQ(res.width, 200);  // floor(301 / 1.5)
  ASSERT_EQ(res.height, 171);
  auto reader = atResolution(ImageReader::open(dir + "/a.tif"), res);
  EXPECT_EQ(reader->info().width, 200);
  const cv::Mat whole = reader->readRegion({0, 0, 200, 171});
  std::mt19937 rng(3);
  for (int i = 0; i < 40; ++i) {
    const int x = int(rng() % 190), y = int(rng() % 160);
    const int w = 1 + int(rng() % uint32_t(200 - x)), h = 1 + int(rng() % uint32_t(171 - y));
    const cv::Mat part = reader->readRegion({x, y, w, h});
    EXPECT_EQ(cv::norm(part, whole(cv::Rect(x, y, w, h)), cv::NORM_INF), 0)
        << x << "," << y << " " << w << "x" << h;
  }
  // The weights of every output pixel add up to one: a flat image stays flat.
  writeTiff(dir + "/flat.tif", cv::Mat(99, 131, CV_16UC1, cv::Scalar(40000)));
  auto flat = atResolution(ImageReader::open(dir + "/flat.tif"),
                           chooseResolution(ImageReader::open(dir + "/flat.tif")->info(), {-1, 1.7, 0, 1.0}));
  double lo = 0, hi = 0;
  cv::minMaxLoc(flat->readRegion({0, 0, flat->info().width, flat->info().height}), &lo, &hi);
  EXPECT_EQ(lo, 40000);
  EXPECT_EQ(hi, 40000);
  // An integer factor is the mean of each 2x2 block.
  auto half = atResolution(ImageReader::open(dir + "/a.tif"), chooseResolution(info, {-1, 2.0, 0, 1.0}));
  const cv::Mat h2 = half->readRegion({0, 0, 150, 128});
  for (int y = 0; y < 128; y += 17)
    for (int x = 0; x < 150; x += 13)
      for (int c = 0; c < 3; ++c) {
        const double sum = img.at<cv::Vec3b>(2 * y, 2 * x)[c] + img.at<cv::Vec3b>(2 * y, 2 * x + 1)[c] +
                           img.at<cv::Vec3b>(2 * y + 1, 2 * x)[c] +
                           img.at<cv::Vec3b>(2 * y + 1, 2 * x + 1)[c];
        EXPECT_EQ(h2.at<cv::Vec3b>(y, x)[c], cv::saturate_cast<uint8_t>(sum / 4.0));
      }
}

// Upsampling is the area rule with f < 1: at f = 1/2 each level pixel repeated 2x2, exactly; at WSInfer's
// TILs factor (100 px at 0.5 µm/px resized to 299, on a 0.25 µm/px scan: f = 200/299) each pixel the
// area-weighted mean of the one or two level pixels under it along each axis, computed here in integers, and
// the same pixels wherever a region lies.
TEST(Slide, UpsampledPixelsAreTheAreaRuleAndTileExactly) {
  const std::string dir = test::scratchDir("slide_upsample");
  const cv::Mat img = noiseImage(43, 57, CV_8UC3, 11);
  writeTiff(dir + "/a.tif", img);
  const ImageInfo info = ImageReader::open(dir + "/a.tif")->info();
  const auto twice = chooseResolution(info, ResolutionSpec{-1, 0.125, 0, 0.25, true});
  ASSERT_EQ(twice.width, 114);
  ASSERT_EQ(twice.height, 86);
  auto reader = atResolution(ImageReader::open(dir + "/a.tif"), twice);
  cv::Mat repeated;
  cv::resize(img, repeated, cv::Size(), 2, 2, cv::INTER_NEAREST);
  EXPECT_EQ(cv::norm(reader->readRegion({0, 0, 114, 86}), repeated, cv::NORM_INF), 0);
  EXPECT_EQ(cv::norm(reader->readRegion({33, 7, 40, 51}), repeated(cv::Rect(33, 7, 40, 51)), cv::NORM_INF),
            0);

  const auto tils = chooseResolution(info, ResolutionSpec{-1, 0.5 * 100 / 299, 0, 0.25, true});
  ASSERT_NEAR(tils.upsampleFactor(), 299.0 / 200, 1e-12);
  reader = atResolution(ImageReader::open(dir + "/a.tif"), tils);
  const int64_t w = reader->info().width, h = reader->info().height;
  EXPECT_EQ(w, 85);  // floor(57 * 299 / 200)
  EXPECT_EQ(h, 64);
  const cv::Mat whole = reader->readRegion({0, 0, w, h});
  // In 1/299ths of a level pixel, output pixel i spans [200 i, 200 i + 200), level pixel j [299 j, 299 j +
  // 299).
  const auto overlap = [](int64_t i, int64_t j) {
    return std::max<int64_t>(0, std::min(200 * i + 200, 299 * j + 299) - std::max(200 * i, 299 * j));
  };
  int64_t ties = 0;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        int64_t sum = 0;  // the value x 40000
        for (int64_t j = 200 * x / 299; j <= (200 * x + 199) / 299; ++j)
          for (int64_t k = 200 * y / 299; k <= (200 * y + 199) / 299; ++k)
            sum += overlap(x, j) * overlap(y, k) * img.at<cv::Vec3b>(int(k), int(j))[c];
        const int got = whole.at<cv::Vec3b>(int(y), int(x))[c];
        if (sum % 40000 == 20000) {  // a tie: either neighbour is the area mean rounded
          ++ties;
          EXPECT_TRUE(got == sum / 40000 || got == sum / 40000 + 1) << x << "," << y;
        } else {
          EXPECT_EQ(got, (sum + 20000) / 40000) << x << "," << y << " channel " << c;
        }
      }
  EXPECT_LT(ties, w * h * 3 / 50) << "ties are few: the rule decides every other pixel";
  std::mt19937 rng(5);
  for (int i = 0; i < 40; ++i) {
    const int x = int(rng() % 80), y = int(rng() % 60);
    const int rw = 1 + int(rng() % uint32_t(w - x)), rh = 1 + int(rng() % uint32_t(h - y));
    EXPECT_EQ(cv::norm(reader->readRegion({x, y, rw, rh}), whole(cv::Rect(x, y, rw, rh)), cv::NORM_INF), 0)
        << x << "," << y << " " << rw << "x" << rh;
  }
}

TEST(Slide, TiffReaderReadsReducedPagesAndSubIfdsAsLevels) {
  TILER_SKIP_WITHOUT_TOOL("tiffcp");
  const std::string dir = test::scratchDir("slide_tiff_levels");
  const cv::Mat img = noiseImage(300, 520, CV_8UC3, 11);
  writeTiff(dir + "/pyramid.tif", img, true);  // NewSubfileType 1 pages: 260x150 ... 33x19 (one tile)
  auto reader = ImageReader::open(dir + "/pyramid.tif");
  const auto& levels = reader->info().levels;
  ASSERT_EQ(levels.size(), 5u);
  EXPECT_EQ(levels[1].width, 260);
  EXPECT_EQ(levels[1].height, 150);
  EXPECT_DOUBLE_EQ(levels[1].downsample, 2.0);
  EXPECT_EQ(levels[3].width, 65);
  EXPECT_EQ(reader->info().reader, "tiff");
  // Level 1 holds exactly the pixels of page 1 (extracted with libtiff's tiffcp).
  auto r = test::runCommand("tiffcp " + dir + "/pyramid.tif,1 " + dir + "/page1.tif");
  ASSERT_EQ(r.code, 0) << r.output;
  const cv::Mat page1 = ImageReader::open(dir + "/page1.tif")->readRegion({0, 0, 260, 150});
  EXPECT_EQ(cv::norm(reader->readRegion({0, 0, 260, 150}, 1), page1, cv::NORM_INF), 0);
  EXPECT_EQ(
      cv::norm(reader->readRegion({100, 50, 64, 64}, 1), page1(cv::Rect(100, 50, 64, 64)), cv::NORM_INF), 0);
  EXPECT_THROW(reader->readRegion({0, 0, 261, 1}, 1), IoError);
  EXPECT_THROW(reader->readRegion({0, 0, 1, 1}, 5), IoError);
  // A plain TIFF has one level.
  writeTiff(dir + "/flat.tif", img);
  EXPECT_EQ(ImageReader::open(dir + "/flat.tif")->info().levels.size(), 1u);

  if (!test::haveSlideTools()) GTEST_SKIP() << "vips not installed (scripts/setup-deps.sh installs it)";
  // libvips' SubIFD pyramid (the OME-TIFF layout): the levels hang off page 0.
  r = test::runCommand(
      "vips tiffsave " + dir + "/flat.tif " + dir +
      "/subifd.tif --tile --pyramid --subifd --compression deflate --tile-width 64 --tile-height 64");
  ASSERT_EQ(r.code, 0) << r.output;
  auto sub = ImageReader::open(dir + "/subifd.tif");
  ASSERT_GE(sub->info().levels.size(), 3u);
  EXPECT_EQ(sub->info().pages, 1);
  EXPECT_EQ(sub->info().levels[1].width, 260);
  const cv::Mat l1 = sub->readRegion({0, 0, 260, 150}, 1);
  cv::Mat shrunk;
  cv::resize(img, shrunk, cv::Size(260, 150), 0, 0, cv::INTER_AREA);
  EXPECT_LE(cv::norm(l1, shrunk, cv::NORM_L1) / double(l1.total() * 3), 1.0);  // libvips' own 2x2 shrink
}

class SlideFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    TILER_SKIP_WITHOUT_FEATURE("openslide");
    if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
    dir_ = test::scratchDir("slide_files");
    image_ = noiseImage(768, 1024, CV_8UC3, 5);
    cv::GaussianBlur(image_, image_, cv::Size(9, 9), 3);
    test::makeSlide(image_, dir_ + "/plain.tif", dir_ + "/aperio.svs", 0.25, 40);
  }
  std::string dir_;
  cv::Mat image_;
};

TEST_F(SlideFiles, OpenSlideReadsAnAperioSlideWithItsLevelsAndResolution) {
  auto slide = ImageReader::open(dir_ + "/aperio.svs");
  const ImageInfo& info = slide->info();
  EXPECT_EQ(info.reader, "openslide");
  EXPECT_EQ(info.vendor, "aperio");
  EXPECT_EQ(info.width, 1024);
  EXPECT_EQ(info.channels, 3);
  ASSERT_TRUE(info.mpp && info.objective_power);
  EXPECT_DOUBLE_EQ(*info.mpp, 0.25);
  EXPECT_DOUBLE_EQ(*info.objective_power, 40);
  ASSERT_EQ(info.levels.size(), 3u);  // 1024x768, 512x384, 256x192 (one tile)
  EXPECT_EQ(info.levels[1].width, 512);
  EXPECT_DOUBLE_EQ(info.levels[2].downsample, 4.0);
  // Level 1 as OpenSlide's own tool exports it.
  auto r = test::runCommand("openslide-write-png " + dir_ + "/aperio.svs 0 0 1 512 384 " + dir_ + "/l1.png");
  ASSERT_EQ(r.code, 0) << r.output;
  cv::Mat exported = cv::imread(dir_ + "/l1.png", cv::IMREAD_COLOR);
  cv::cvtColor(exported, exported, cv::COLOR_BGR2RGB);
  EXPECT_EQ(cv::norm(slide->readRegion({0, 0, 512, 384}, 1), exported, cv::NORM_INF), 0);
  EXPECT_EQ(cv::norm(slide->readRegion({300, 200, 100, 90}, 1), exported(cv::Rect(300, 200, 100, 90)),
                     cv::NORM_INF),
            0);
  // The same tiles through libtiff (the plain file is generic-tiff to OpenSlide, so tiler reads it itself).
  auto plain = ImageReader::open(dir_ + "/plain.tif");
  EXPECT_EQ(plain->info().reader, "tiff");
  EXPECT_EQ(plain->info().levels.size(), 3u);
  EXPECT_LE(cv::norm(plain->readRegion({0, 0, 512, 384}, 1), exported, cv::NORM_INF), 2);
  // Reads from several threads at once take handles of their own.
  std::vector<std::thread> threads;
  std::vector<double> diffs(4, -1);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const Rect rect{int64_t(t) * 100, 50, 100, 100};
      diffs[size_t(t)] =
          cv::norm(slide->readRegion(rect, 1), exported(cv::Rect(t * 100, 50, 100, 100)), cv::NORM_INF);
    });
  for (auto& th : threads) th.join();
  for (double d : diffs) EXPECT_EQ(d, 0);
}

TEST_F(SlideFiles, BrokenAndMisnamedSlidesAreClearErrorsOrPlainTiffs) {
  // A plain TIFF named .svs is listed and read by libtiff.
  fs::copy_file(dir_ + "/plain.tif", dir_ + "/generic.svs");
  EXPECT_TRUE(hasImageExtension(dir_ + "/generic.svs"));
  EXPECT_EQ(ImageReader::open(dir_ + "/generic.svs")->info().reader, "tiff");
  // Not a slide at all.
  std::ofstream(dir_ + "/notes.svs") << "not a slide\n";
  try {
    ImageReader::open(dir_ + "/notes.svs");
    FAIL() << "opened a text file";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("notes.svs': not a whole-slide image OpenSlide can read"), std::string::npos)
        << e.message();
  }
  // Cut in half: the levels' tiles past the end cannot be read.
  const auto size = fs::file_size(dir_ + "/aperio.svs");
  fs::copy_file(dir_ + "/aperio.svs", dir_ + "/cut.svs");
  fs::resize_file(dir_ + "/cut.svs", size / 3);
  try {
    auto cut = ImageReader::open(dir_ + "/cut.svs");
    cut->readRegion({0, 0, cut->info().width, cut->info().height});
    FAIL() << "read a truncated slide";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("cut.svs'"), std::string::npos) << e.message();
  }
}

// The bytes of `path`, for editing a slide's structure in place.
std::vector<char> bytesOf(const std::string& path) {
  const std::string text = test::slurp(path);
  return {text.begin(), text.end()};
}
void writeBytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}
uint16_t u16At(const std::vector<char>& b, size_t at) {
  return uint16_t(uint8_t(b[at]) | uint8_t(b[at + 1]) << 8);
}
uint32_t u32At(const std::vector<char>& b, size_t at) {
  return uint32_t(u16At(b, at)) | uint32_t(u16At(b, at + 2)) << 16;
}

// An Aperio slide whose first TileByteCounts is retyped LONG -> LONG8 (two bytes changed): OpenSlide took
// the offsets for 64-bit counts, asked GLib for 63 TB and aborted the process. It is this image's error now.
TEST_F(SlideFiles, ASlideWithAnAbsurdTileTableFailsAloneInsteadOfAbortingTheProcess) {
  std::vector<char> b = bytesOf(dir_ + "/aperio.svs");
  ASSERT_EQ(b[0], 'I') << "libvips writes little-endian classic TIFF";
  const size_t ifd = u32At(b, 4);
  bool retyped = false;
  for (size_t e = 0; e < u16At(b, ifd); ++e) {
    const size_t entry = ifd + 2 + 12 * e;
    if (u16At(b, entry) == 325) {  // TileByteCounts
      b[entry + 2] = 16;           // TIFF_LONG8
      b[entry + 3] = 0;
      retyped = true;
    }
  }
  ASSERT_TRUE(retyped);
  writeBytes(dir_ + "/retyped.svs", b);
  EXPECT_THROW(ImageReader::open(dir_ + "/retyped.svs"), IoError);
  // Every tile of every page inside the file: the intact slide passes the same check.
  EXPECT_NO_THROW(ImageReader::open(dir_ + "/aperio.svs"));
  // What the check cannot see (another format's files) OpenSlide first meets in a child process: here
  // OpenSlide itself opens the retyped slide and aborts, and only the child is lost.
  try {
    probeSlideInChildProcess(dir_ + "/retyped.svs");
    FAIL() << "OpenSlide survived the retyped slide";
  } catch (const IoError& e) {
    // A signal (GLib's abort), or under ASan its own abort, an exit status.
    EXPECT_TRUE(e.message().find("retyped.svs': OpenSlide crashed on it (") != std::string::npos ||
                e.message().find("retyped.svs': OpenSlide ended the probe process on it (exit status") !=
                    std::string::npos)
        << e.message();
  }
  EXPECT_NO_THROW(probeSlideInChildProcess(dir_ + "/aperio.svs"));
}

// A JPEG tile with a marker in the middle of its scan: libjpeg warns ("Corrupt JPEG data") and fills the rest
// with grey; libtiff passed that on as a warning and the tile read as ok. The read fails now, also after
// OpenCV's TIFF codec (a TIFF under another extension) has put its own libtiff handlers in ours' place.
TEST_F(SlideFiles, ACorruptJpegTileInATiffFailsItsRead) {
  std::vector<char> b = bytesOf(dir_ + "/plain.tif");
  TIFF* tif = TIFFOpen((dir_ + "/plain.tif").c_str(), "r");
  ASSERT_NE(tif, nullptr);
  uint64_t *offsets = nullptr, *counts = nullptr;
  ASSERT_TRUE(TIFFGetField(tif, TIFFTAG_TILEOFFSETS, &offsets) &&
              TIFFGetField(tif, TIFFTAG_TILEBYTECOUNTS, &counts));
  const uint64_t at = offsets[0] + counts[0] / 2;
  TIFFClose(tif);
  b[at] = char(0xFF);
  b[at + 1] = char(0xD9);  // EOI in the middle of the entropy-coded data
  writeBytes(dir_ + "/corrupt_tile.tif", b);
  auto reader = ImageReader::open(dir_ + "/corrupt_tile.tif");
  ASSERT_TRUE(cv::imwrite(dir_ + "/by_opencv.tif", cv::Mat(8, 8, CV_8UC1, cv::Scalar(1))));
  ASSERT_FALSE(cv::imread(dir_ + "/by_opencv.tif").empty());
  try {
    reader->readRegion({0, 0, 64, 64});
    FAIL() << "a corrupt JPEG tile read as ok";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("tile (0,0) is corrupt: "), std::string::npos) << e.message();
  }
  EXPECT_NO_THROW(reader->readRegion({512, 512, 64, 64})) << "the other tiles are fine";
}

}  // namespace
}  // namespace tiler
