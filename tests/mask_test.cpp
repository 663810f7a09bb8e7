// Masks: tissue, nodata, alpha and file masks at low resolution, and the share of a window inside them.
#include "tiler/io/mask.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <tiffio.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgproc.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

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
  EXPECT_DOUBLE_EQ(m.fractionInside({-50, 0, 100, 50}), 1.0) << "padding counts neither way";
  EXPECT_DOUBLE_EQ(m.fractionInside({-50, 0, 150, 50}), 0.5);
  EXPECT_DOUBLE_EQ(m.fractionInside({200, 0, 10, 10}), 0.0);
  // An image smaller than one window: its window is as inside as the image is.
  CoverageMask small(cv::Mat(3, 4, CV_32F, cv::Scalar(1.0)), 40, 30, "tissue");
  EXPECT_DOUBLE_EQ(small.fractionInside({0, 0, 256, 256}), 1.0);
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

// A scene that carries its own mask (a TIFF's internal mask, or a GDAL .msk beside it) is masked by it under
// --mask auto, not by the tissue detector (which would call this uniform grey image all glass or all tissue).
TEST(Mask, AutoTakesTheScenesOwnMaskFirst) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  if (test::runCommand("command -v gdal_translate").code != 0) GTEST_SKIP() << "no gdal_translate";
  const std::string dir = test::scratchDir("mask_scene");
  cv::Mat rgba(400, 600, CV_8UC4, cv::Scalar(200, 150, 180, 0));
  rgba(cv::Rect(0, 0, 300, 400)).setTo(cv::Scalar(200, 150, 180, 255));  // the left half is the scene
  write(dir + "/rgba.tif", rgba);
  for (const std::string& internal : {"YES", "NO"}) {
    const std::string out = dir + "/masked_" + internal + ".tif";
    const auto r =
        test::runCommand("gdal_translate -q -b 1 -b 2 -b 3 -mask 4 --config GDAL_TIFF_INTERNAL_MASK " +
                         internal + " " + dir + "/rgba.tif " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_EQ(fs::exists(out + ".msk"), internal == "NO");
    auto reader = ImageReader::open(out);
    ASSERT_EQ(reader->info().channels, 3);
    const CoverageMask m = CoverageMask::make(*reader, parseMaskSpec("auto", 0.05));
    EXPECT_EQ(m.method(), "scene") << internal;
    EXPECT_GT(m.fractionInside({0, 0, 250, 400}), 0.99) << internal;
    EXPECT_LT(m.fractionInside({350, 0, 250, 400}), 0.01) << internal;
  }
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

void writeText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A QuPath annotation export: a FeatureCollection of annotations with a classification (Tumor: two polygons,
// one with a hole; Stroma), plus a detection (never a region) and a point (no area).
const std::string kQuPathExport =
    std::string(TILER_TEST_SOURCE_DIR) + "/tests/data/qupath_annotations.geojson";

// The Tumor annotations of kQuPathExport drawn as a raster mask (pixel centres inside).
cv::Mat tumorMask(int w, int h) {
  cv::Mat m = cv::Mat::zeros(h, w, CV_8U);
  m(cv::Rect(20, 30, 280, 220)).setTo(255);
  m(cv::Rect(100, 80, 100, 100)).setTo(0);
  m(cv::Rect(400, 300, 250, 180)).setTo(255);
  return m;
}

TEST(Roi, QuPathExportReadAsIsAndDrawnAsItsRasterMask) {
  const std::string dir = test::scratchDir("roi_qupath");
  fs::copy_file(kQuPathExport, dir + "/slide.geojson");
  EXPECT_EQ(readRoi(dir + "/slide.geojson", "").size(), 3u) << "the detection and the point are no regions";
  const auto tumor = readRoi(dir + "/slide.geojson", "Tumor");
  ASSERT_EQ(tumor.size(), 2u);
  EXPECT_EQ(tumor[0].size(), 2u) << "outer ring and hole";
  cv::Mat drawn = rasterizeRoi(tumor, 700, 500, 1.0, 1.0);
  cv::Mat expected;
  tumorMask(700, 500).convertTo(expected, CV_32F, 1.0 / 255.0);
  EXPECT_EQ(cv::countNonZero(drawn != expected), 0) << "the hole is out, the edges exact";
  // The map of an image, through the directory form: the same as the raster mask file's.
  write(dir + "/slide.tif", cv::Mat(500, 700, CV_8UC3, cv::Scalar(1, 2, 3)));
  write(dir + "/tumor.png", tumorMask(700, 500));
  auto reader = ImageReader::open(dir + "/slide.tif");
  const CoverageMask roi = CoverageMask::make(*reader, parseMaskSpec("none", 0.05, dir, "Tumor"));
  const CoverageMask file = CoverageMask::make(*reader, parseMaskSpec(dir + "/tumor.png", 0.05));
  EXPECT_EQ(roi.method(), "roi");
  EXPECT_EQ(cv::countNonZero(roi.map() != file.map()), 0);
  EXPECT_DOUBLE_EQ(roi.coverage(), file.coverage());
  // With a mask too: their intersection (the mask's left half leaves the first polygon only).
  cv::Mat left = cv::Mat::zeros(500, 700, CV_8U);
  left.colRange(0, 350).setTo(1);
  write(dir + "/left.png", left);
  const CoverageMask both = CoverageMask::make(*reader, parseMaskSpec(dir + "/left.png", 0.05, dir, "Tumor"));
  EXPECT_EQ(both.method(), "file+roi");
  EXPECT_NEAR(both.coverage(), (280.0 * 220 - 100 * 100) / (700.0 * 500), 1e-9);
}

// A directory of ROIs is looked up by the input's stem, as its outputs are named: for a URL, its last path
// element less the query (whose "/" is no folder).
TEST(Roi, ADirectoryIsLookedUpByTheInputsStem) {
  const std::string dir = test::scratchDir("roi_stems");
  EXPECT_EQ(roiFileFor(dir, "/data/slides/a.b.svs"), dir + "/a.b.geojson");
  EXPECT_EQ(roiFileFor(dir, "https://host/bucket/scene.tif?X-Amz-Signature=a/b"), dir + "/scene.geojson");
  EXPECT_EQ(roiFileFor(dir + "/one.geojson", "s3://bucket/x.tif"), dir + "/one.geojson")
      << "a file is taken as is";
}

TEST(Roi, AGeoreferencedImagesRoiIsInItsCrs) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  if (test::runCommand("command -v gdal_translate").code != 0) GTEST_SKIP() << "no gdal_translate here";
  const std::string dir = test::scratchDir("roi_crs");
  write(dir + "/plain.tif", cv::Mat(500, 700, CV_8UC3, cv::Scalar(1, 2, 3)));
  // 2 m pixels, north up, the top-left corner at (1000, 6000): pixel (x, y) is (1000 + 2x, 6000 - 2y).
  const auto r = test::runCommand("gdal_translate -q -a_srs EPSG:32633 -a_ullr 1000 6000 2400 5000 " + dir +
                                  "/plain.tif " + dir + "/scene.tif");
  ASSERT_EQ(r.code, 0) << r.output;
  writeText(dir + "/scene.geojson", R"({"type": "FeatureCollection", "features": [{"type": "Feature",
    "properties": {}, "geometry": {"type": "Polygon",
    "coordinates": [[[1040, 5940], [1600, 5940], [1600, 5500], [1040, 5500], [1040, 5940]]]}}]})");
  auto reader = ImageReader::open(dir + "/scene.tif");
  const CoverageMask m = CoverageMask::make(*reader, parseMaskSpec("none", 0.05, dir + "/scene.geojson"));
  cv::Mat expected = cv::Mat::zeros(500, 700, CV_32F);
  expected(cv::Rect(20, 30, 280, 220)).setTo(1.0f);
  EXPECT_EQ(cv::countNonZero(m.map() != expected), 0) << "pixels (20, 30) to (300, 250)";
}

TEST(Roi, ASmallerMapIsDrawnSupersampled) {
  // 4096 x 2048 shrinks to 2048 x 1024: a polygon edge on an odd pixel covers half a map pixel.
  const std::vector<RoiPolygon> square = {{{{0, 0}, {1001, 0}, {1001, 1001}, {0, 1001}, {0, 0}}}};
  cv::Mat map = rasterizeRoi(square, 2048 * 2, 1024 * 2, 1.0, 1.0);
  cv::resize(map, map, cv::Size(2048, 1024), 0, 0, cv::INTER_AREA);
  EXPECT_FLOAT_EQ(map.at<float>(0, 500), 0.5f);
  EXPECT_FLOAT_EQ(map.at<float>(500, 500), 0.25f);
  EXPECT_FLOAT_EQ(map.at<float>(499, 499), 1.0f);
}

TEST(Roi, BadInputsNameTheFileAndTheProblem) {
  const std::string dir = test::scratchDir("roi_bad");
  const auto message = [&](const std::string& name, const std::string& text, const std::string& cls = "") {
    writeText(dir + "/" + name, text);
    try {
      readRoi(dir + "/" + name, cls);
    } catch (const IoError& e) {
      EXPECT_NE(e.message().find(name), std::string::npos) << e.message();
      return e.message();
    }
    ADD_FAILURE() << name << " was accepted";
    return std::string();
  };
  EXPECT_NE(message("text.geojson", "polygon please").find("not JSON"), std::string::npos);
  EXPECT_NE(message("empty.geojson", R"({"type": "FeatureCollection", "features": []})").find("no features"),
            std::string::npos);
  EXPECT_NE(message("points.geojson",
                    R"({"type": "FeatureCollection", "features": [{"type": "Feature",
                         "geometry": {"type": "Point", "coordinates": [1, 2]}, "properties": {}}]})")
                .find("no Polygon or MultiPolygon"),
            std::string::npos);
  EXPECT_NE(message("short.geojson", R"({"type": "Feature", "properties": {},
                         "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]}})")
                .find("ring 0: 3 position(s); a ring needs at least 4"),
            std::string::npos);
  EXPECT_NE(message("nan.geojson", R"({"type": "Feature", "properties": {}, "geometry": {"type": "Polygon",
                         "coordinates": [[[0, 0], [NaN, 0], [1, 1], [0, 0]]]}})")
                .find("a coordinate NaN or Infinity is no number in JSON"),
            std::string::npos);
  EXPECT_NE(message("far.geojson", R"({"type": "Feature", "properties": {}, "geometry": {"type": "Polygon",
                         "coordinates": [[[0, 0], [1e308, 0], [1, -1e308], [0, 0]]]}})")
                .find("lies beyond 1e+12"),
            std::string::npos);
  EXPECT_NE(message("null.geojson", R"({"type": "Feature", "properties": {}, "geometry": {"type": "Polygon",
                         "coordinates": [[[0, 0], [null, 0], [1, 1], [0, 0]]]}})")
                .find("is not two finite numbers"),
            std::string::npos);
  const std::string cls = message("classes.geojson", test::slurp(kQuPathExport), "Necrosis");
  EXPECT_NE(cls.find("no feature of class 'Necrosis'"), std::string::npos) << cls;
  EXPECT_NE(cls.find("classes present: Stroma, Tumor"), std::string::npos) << cls;
  // In a run: the image's error names the image, the file and the problem.
  write(dir + "/img.tif", cv::Mat(50, 60, CV_8UC3, cv::Scalar(1, 2, 3)));
  auto reader = ImageReader::open(dir + "/img.tif");
  try {
    CoverageMask::make(*reader, parseMaskSpec("none", 0.05, dir + "/short.geojson"));
    FAIL() << "a bad ROI made a mask";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("img.tif"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("short.geojson"), std::string::npos) << e.message();
  }
  // An ROI of another image (QuPath's export over a larger slide, or CRS coordinates over a plain image).
  writeText(dir + "/elsewhere.geojson",
            R"({"type": "Feature", "properties": {}, "geometry": {"type": "Polygon",
                         "coordinates": [[[5000, 5000], [5100, 5000], [5100, 5100], [5000, 5000]]]}})");
  try {
    CoverageMask::make(*reader, parseMaskSpec("none", 0.05, dir + "/elsewhere.geojson"));
    ADD_FAILURE() << "an ROI outside the image made a mask";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("elsewhere.geojson' lies outside the image: its polygons span x 5000..5100"),
              std::string::npos)
        << e.message();
  }
  // A directory without the image's <stem>.geojson.
  fs::create_directories(dir + "/none");
  EXPECT_THROW(CoverageMask::make(*reader, parseMaskSpec("none", 0.05, dir + "/none")), IoError);
  EXPECT_THROW(parseMaskSpec("none", 0.05, dir + "/missing.geojson"), ConfigError);
  EXPECT_THROW(parseMaskSpec("none", 0.05, "", "Tumor"), ConfigError);
}

// The even-odd rule as the pixel centres see it, every row against every edge: what rasterizeRoi must equal.
cv::Mat rasterizedByEveryEdge(const std::vector<RoiPolygon>& polygons, int width, int height) {
  cv::Mat inside = cv::Mat::zeros(height, width, CV_32F);
  for (const RoiPolygon& polygon : polygons)
    for (int y = 0; y < height; ++y) {
      const double yc = y + 0.5;
      std::vector<double> crossings;
      for (const RoiRing& ring : polygon)
        for (size_t i = 0; i < ring.size(); ++i) {
          const cv::Point2d a = ring[i], b = ring[(i + 1) % ring.size()];
          if ((a.y <= yc) != (b.y <= yc)) crossings.push_back(a.x + (yc - a.y) * (b.x - a.x) / (b.y - a.y));
        }
      std::sort(crossings.begin(), crossings.end());
      for (size_t k = 0; k + 1 < crossings.size(); k += 2)
        for (int x = 0; x < width; ++x)
          if (x + 0.5 >= crossings[k] && x + 0.5 < crossings[k + 1]) inside.at<float>(y, x) = 1;
    }
  return inside;
}

TEST(Roi, EachRowLooksOnlyAtTheEdgesThatCrossItAndDrawsWhatEveryEdgeSays) {
  cv::RNG rng(7);
  std::vector<RoiPolygon> polygons;
  for (int p = 0; p < 12; ++p) {
    RoiPolygon polygon;
    for (int r = 0; r < 2; ++r) {  // an outer ring and a crossing "hole": self-intersections included
      RoiRing ring;
      const int n = rng.uniform(3, 40);
      for (int i = 0; i < n; ++i) ring.emplace_back(rng.uniform(-20.0, 140.0), rng.uniform(-20.0, 100.0));
      ring.push_back(ring.front());
      polygon.push_back(ring);
    }
    // Vertices on pixel centres and horizontal edges: the half-open rules' edge cases.
    polygon.push_back({{10.5, 10.5}, {30.5, 10.5}, {30.5, 20.5}, {10.5, 20.5}, {10.5, 10.5}});
    polygons.push_back(polygon);
  }
  for (const auto& one : polygons) {
    const cv::Mat got = rasterizeRoi({one}, 120, 80, 1.0, 1.0), want = rasterizedByEveryEdge({one}, 120, 80);
    EXPECT_EQ(cv::norm(got, want, cv::NORM_L1), 0);
  }
  EXPECT_EQ(cv::norm(rasterizeRoi(polygons, 120, 80, 1.0, 1.0), rasterizedByEveryEdge(polygons, 120, 80),
                     cv::NORM_L1),
            0)
      << "polygons united";
  // A slide-wide annotation of 3 million vertices over 8192 rows: each row sees the two edges it crosses.
  RoiRing circle;
  for (int i = 0; i < 3000000; ++i) {
    const double t = 2 * M_PI * i / 3000000;
    circle.emplace_back(4096 + 4000 * std::cos(t), 4096 + 4000 * std::sin(t));
  }
  circle.push_back(circle.front());
  const cv::Mat disc = rasterizeRoi({{circle}}, 8192, 8192, 1.0, 1.0);
  EXPECT_NEAR(cv::sum(disc)[0], M_PI * 4000 * 4000, 2 * M_PI * 4000);
}

TEST(Roi, WhatIsNoRegularFileIsRefusedNeverRead) {
  // A FIFO would block the read for ever; /dev/zero never ends. Named itself (the run is refused) or found
  // in a --roi directory (that image fails), each is refused at once naming it.
  const std::string dir = test::scratchDir("roi_special");
  ASSERT_EQ(mkfifo((dir + "/pipe.geojson").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir + "/zero.geojson");
  for (const auto& [name, why] : {std::pair<std::string, std::string>{"pipe.geojson", "is a FIFO"},
                                  {"zero.geojson", "is a character device"}}) {
    try {
      parseMaskSpec("none", 0.05, dir + "/" + name);
      ADD_FAILURE() << name << " taken as --roi";
    } catch (const ConfigError& e) {
      EXPECT_NE(e.message().find(name + "': " + why), std::string::npos) << e.message();
    }
    try {
      readRoi(dir + "/" + name, "");
      ADD_FAILURE() << name << " read";
    } catch (const IoError& e) {
      EXPECT_NE(e.message().find(name + "': " + why), std::string::npos) << e.message();
    }
  }
  write(dir + "/pipe.tif", cv::Mat(20, 20, CV_8UC3, cv::Scalar(1, 2, 3)));
  auto reader = ImageReader::open(dir + "/pipe.tif");
  try {
    CoverageMask::make(*reader, parseMaskSpec("none", 0.05, dir));
    ADD_FAILURE() << "a FIFO in the --roi directory made a mask";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("pipe.geojson': is a FIFO"), std::string::npos) << e.message();
  }
}

TEST(Roi, DeepNestingIsRefusedInOneLineWithoutACrash) {
  const std::string dir = test::scratchDir("roi_deep");
  const std::string deep =
      R"({"type": "FeatureCollection", "features": [{"type": "Feature", "properties": )" +
      std::string(100000, '[') + std::string(100000, ']') + "}]}";
  writeText(dir + "/deep.geojson", deep);
  try {
    readRoi(dir + "/deep.geojson", "");
    FAIL() << "read";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("deep.geojson': not JSON: nested deeper than 64 levels"), std::string::npos)
        << e.message();
    EXPECT_LT(e.message().size(), 300u);
  }
}

TEST(Roi, AQuPathExportOfEveryObjectKeepsOnlyItsAnnotations) {
  // Detections and cells come first and in numbers; they are dropped as they are parsed, and the annotations
  // after them are what the ROI is.
  std::string text = R"({"type": "FeatureCollection", "features": [)";
  for (int i = 0; i < 20000; ++i)
    text += R"({"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], )"
            R"([0, 0]]]}, "properties": {"objectType": "detection"}},)";
  text += R"({"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [9, 0], [9, 9], )"
          R"([0, 0]]]}, "properties": {"objectType": "annotation", "classification": {"name": "Tumor"}}}]})";
  const std::string dir = test::scratchDir("roi_export");
  writeText(dir + "/all.geojson", text);
  std::vector<std::string> names;
  const auto polygons = readRoi(dir + "/all.geojson", "", &names);
  ASSERT_EQ(polygons.size(), 1u);
  EXPECT_EQ(polygons[0][0][1].x, 9);
  EXPECT_EQ(names, std::vector<std::string>{"Tumor"});
}

TEST(Roi, AnEmptyMultiPolygonSaysSo) {
  const std::string dir = test::scratchDir("roi_empty_multi");
  writeText(dir + "/empty.geojson", R"({"type": "Feature", "properties": {},
                                        "geometry": {"type": "MultiPolygon", "coordinates": []}})");
  try {
    readRoi(dir + "/empty.geojson", "");
    FAIL() << "read";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("hold no polygon (an empty MultiPolygon)"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("no feature of class ''"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace tiler
