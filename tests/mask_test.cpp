// Masks: tissue, nodata, alpha and file masks at low resolution, and the share of a window inside them.
#include "tiler/mask.hpp"

#include <gtest/gtest.h>
#include <tiffio.h>

#include <filesystem>
#include <opencv2/imgproc.hpp>

#include "test_util.hpp"
#include "tiler/error.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

void write(const std::string& path, const cv::Mat& img) {
  WriterOptions o;
  o.format = fs::path(path).extension() == ".png" ? "png" : "tif";
  ImageWriter w(path, img.cols, img.rows, img.channels(),
                img.depth() == CV_16U ? SampleType::kU16 : SampleType::kU8, o);
  w.writeRows(img);
  w.close();
}

// Light background (slightly noisy glass) with two stained blobs: the truth as a 0/255 mask.
cv::Mat tissueSlide(int w, int h, cv::Mat& truth) {
  cv::Mat img(h, w, CV_8UC3);
  cv::randu(img, cv::Scalar(228, 228, 232), cv::Scalar(240, 240, 245));
  truth = cv::Mat::zeros(h, w, CV_8U);
  cv::ellipse(truth, {w / 3, h / 3}, {w / 6, h / 7}, 20, 0, 360, 255, cv::FILLED);
  cv::circle(truth, {2 * w / 3, 2 * h / 3}, h / 6, 255, cv::FILLED);
  cv::Mat stain(h, w, CV_8UC3);
  cv::randu(stain, cv::Scalar(150, 60, 140), cv::Scalar(200, 110, 190));  // pink-purple H&E-ish
  stain.copyTo(img, truth);
  return img;
}

TEST(Mask, SpecParsing) {
  EXPECT_EQ(parseMaskSpec("none", 0.05).mode, MaskMode::kNone);
  EXPECT_EQ(parseMaskSpec("auto", 0.05).mode, MaskMode::kAuto);
  auto p = parseMaskSpec("m.png", 0.5);
  EXPECT_EQ(p.mode, MaskMode::kPath);
  EXPECT_EQ(p.path, "m.png");
  EXPECT_THROW(parseMaskSpec("auto", 1.5), ConfigError);
}

TEST(Mask, FractionInsideAWindow) {
  // Left half inside, on a 100x50 image with a 10x5 map.
  cv::Mat map = cv::Mat::zeros(5, 10, CV_32F);
  map.colRange(0, 5).setTo(1.0);
  CoverageMask m(map, 100, 50, "file");
  EXPECT_DOUBLE_EQ(m.coverage(), 0.5);
  EXPECT_DOUBLE_EQ(m.fractionInside({0, 0, 50, 50}), 1.0);
  EXPECT_DOUBLE_EQ(m.fractionInside({50, 0, 50, 50}), 0.0);
  EXPECT_DOUBLE_EQ(m.fractionInside({25, 0, 50, 50}), 0.5);
  EXPECT_DOUBLE_EQ(m.fractionInside({-50, 0, 100, 50}), 0.5) << "padding outside the image is not inside";
  EXPECT_DOUBLE_EQ(m.fractionInside({200, 0, 10, 10}), 0.0);
}

TEST(Mask, AutoFindsTissueOnGlass) {
  const std::string dir = test::scratchDir("mask_tissue");
  cv::Mat truth;
  cv::Mat img = tissueSlide(3000, 2000, truth);
  write(dir + "/slide.tif", img);
  auto reader = ImageReader::open(dir + "/slide.tif");
  MaskSpec spec = parseMaskSpec("auto", 0.05);
  spec.max_side = 500;
  CoverageMask m = CoverageMask::make(*reader, spec);
  EXPECT_EQ(m.method(), "tissue");
  EXPECT_LE(std::max(m.map().cols, m.map().rows), 500);
  const double true_coverage = double(cv::countNonZero(truth)) / double(truth.total());
  EXPECT_NEAR(m.coverage(), true_coverage, 0.02) << "truth " << true_coverage;
  // Windows well inside a blob and well on the glass.
  EXPECT_GT(m.fractionInside({1000 - 100, 667 - 100, 200, 200}), 0.99);
  EXPECT_LT(m.fractionInside({2700, 100, 200, 200}), 0.01);
}

TEST(Mask, NodataBorderOfAGeoTiff) {
  const std::string dir = test::scratchDir("mask_nodata");
  // u16, nodata 0 on a 100-px border, valid data (never 0) inside; GDAL_NODATA written as GDAL does.
  cv::Mat img(800, 1000, CV_16UC1, cv::Scalar(0));
  cv::Mat inner = img(cv::Rect(100, 100, 800, 600));
  cv::randu(inner, 1, 60000);
  TIFF* t = TIFFOpen((dir + "/scene.tif").c_str(), "w");
  ASSERT_NE(t, nullptr);
  static const TIFFFieldInfo nodata_field[] = {
      {42113, -1, -1, TIFF_ASCII, FIELD_CUSTOM, 1, 0, const_cast<char*>("GDALNoDataTag")}};
  TIFFMergeFieldInfo(t, nodata_field, 1);
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, 1000);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, 800);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, 1);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 16);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
  TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, 64);
  TIFFSetField(t, 42113, "0");
  for (int y = 0; y < 800; ++y) ASSERT_EQ(TIFFWriteScanline(t, img.ptr(y), uint32_t(y), 0), 1);
  TIFFClose(t);
  auto reader = ImageReader::open(dir + "/scene.tif");
  ASSERT_TRUE(reader->info().nodata.has_value());
  EXPECT_EQ(*reader->info().nodata, 0.0);
  CoverageMask m = CoverageMask::make(*reader, parseMaskSpec("auto", 0.05));
  EXPECT_EQ(m.method(), "nodata");
  EXPECT_NEAR(m.coverage(), 0.6, 0.01);
  EXPECT_EQ(m.fractionInside({0, 0, 100, 800}), 0.0);
  EXPECT_EQ(m.fractionInside({200, 200, 100, 100}), 1.0);
}

TEST(Mask, AlphaZeroIsOutside) {
  const std::string dir = test::scratchDir("mask_alpha");
  cv::Mat img(100, 200, CV_8UC4, cv::Scalar(10, 20, 30, 255));
  img.colRange(0, 50).setTo(cv::Scalar(10, 20, 30, 0));
  write(dir + "/a.png", img);
  auto reader = ImageReader::open(dir + "/a.png");
  CoverageMask m = CoverageMask::make(*reader, parseMaskSpec("auto", 0.05));
  EXPECT_EQ(m.method(), "alpha");
  EXPECT_NEAR(m.coverage(), 0.75, 0.01);
}

TEST(Mask, FileMaskAtASixteenthIsStretched) {
  const std::string dir = test::scratchDir("mask_file");
  cv::Mat img(1600, 3200, CV_8UC3, cv::Scalar(1, 2, 3));
  write(dir + "/big.tif", img);
  cv::Mat small = cv::Mat::zeros(100, 200, CV_8U);
  small.rowRange(0, 50).setTo(7);  // top half: process
  write(dir + "/mask.png", small);
  auto reader = ImageReader::open(dir + "/big.tif");
  CoverageMask m = CoverageMask::make(*reader, parseMaskSpec(dir + "/mask.png", 0.05));
  EXPECT_EQ(m.method(), "file");
  EXPECT_NEAR(m.coverage(), 0.5, 1e-9);
  EXPECT_EQ(m.fractionInside({0, 0, 256, 256}), 1.0);
  EXPECT_EQ(m.fractionInside({0, 1000, 256, 256}), 0.0);
  try {
    CoverageMask::make(*reader, parseMaskSpec(dir + "/missing.png", 0.05));
    FAIL() << "a missing mask was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("big.tif"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("missing.png"), std::string::npos) << e.message();
  }
}

TEST(Mask, ShrinkImageStacksBandsToTheExactSize) {
  const std::string dir = test::scratchDir("mask_shrink");
  cv::Mat img(1037, 611, CV_8UC1);
  cv::randu(img, 0, 255);
  write(dir + "/odd.tif", img);
  auto reader = ImageReader::open(dir + "/odd.tif");
  cv::Mat small = shrinkImage(*reader, 100);
  EXPECT_EQ(small.rows, 100);
  EXPECT_EQ(small.cols, 59);
  cv::Mat same = shrinkImage(*reader, 5000);
  EXPECT_EQ(cv::countNonZero(same != img), 0) << "no shrinking below the limit";
}

}  // namespace
}  // namespace tiler
