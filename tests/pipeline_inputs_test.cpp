// End-to-end tests of what `tiler infer` reads: `tiler info`, int16 RGBA TIFFs, whole slides at a
// resolution (µm/px, magnification, level), --channels, remote inputs by URL.
#include "pipeline_util.hpp"

#include <tiffio.h>

#include <fstream>

#include "range_server.hpp"
#include "slide_util.hpp"
#include "tiler/core/grid.hpp"

namespace tiler::e2e {
namespace {

TEST_F(Pipeline, InfoShowsWhatTheReaderSeesAndTheGrid) {
  auto r =
      run(kTiler + " info " + root_ + "/images/a_large.tif " + root_ + "/images/b_mixed.png --window 128");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("a_large.tif: 700x500, 3 channel(s), u8, reader tiff, tiled 256x256, deflate"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("grid: 35 windows (7 x 5) of 128x128"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("b_mixed.png: 300x200, 3 channel(s), u8, reader opencv, png"), std::string::npos)
      << r.output;
  // At another resolution: the grid infer would cut there (the catalog's description of the image).
  r = run(kTiler + " info " + root_ + "/images/a_large.tif --input_mpp 0.25 --mpp 0.5 --window 128");
  ASSERT_EQ(r.code, 0) << r.output;
  const WindowGrid half(350, 250, GridSpec{128, 128, 0.25, 0.25});
  EXPECT_NE(r.output.find("processing: level 0 resampled, 350x250, 0.5 um/px"), std::string::npos)
      << r.output;
  EXPECT_NE(
      r.output.find("grid: " + std::to_string(half.count()) + " windows (" + std::to_string(half.columns()) +
                    " x " + std::to_string(half.startsY().size()) + ") of 128x128"),
      std::string::npos)
      << r.output;
  auto bad = run(kTiler + " info " + root_ + "/no_such.tif");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("no_such.tif': no such file"), std::string::npos) << bad.output;
}

TEST_F(Pipeline, RgbaInt16TiffIsReadWithItsAlphaDropped) {
  const std::string in = root_ + "/rgba_in", out = root_ + "/rgba_out";
  fs::create_directories(in);
  {
    // tiler's writer makes no i16 files: libtiff directly, RGB plus unassociated alpha, as scanners write.
    cv::Mat px = pattern(100, 120, CV_16SC4, 30000);
    TIFF* t = TIFFOpen((in + "/rgba.tif").c_str(), "w");
    ASSERT_NE(t, nullptr);
    const uint16_t extra[] = {EXTRASAMPLE_UNASSALPHA};
    TIFFSetField(t, TIFFTAG_IMAGEWIDTH, 120);
    TIFFSetField(t, TIFFTAG_IMAGELENGTH, 100);
    TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, 4);
    TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 16);
    TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, SAMPLEFORMAT_INT);
    TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
    TIFFSetField(t, TIFFTAG_EXTRASAMPLES, 1, extra);
    TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
    TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, 16);
    for (int y = 0; y < 100; ++y) ASSERT_EQ(TIFFWriteScanline(t, px.ptr(y), uint32_t(y), 0), 1);
    TIFFClose(t);
  }
  fs::copy_file(root_ + "/images/c_small.png", in + "/c_small.png", fs::copy_options::overwrite_existing);
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + " -i " + in + " -m " + model_ +
               " -o " + out + " --window 64 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ((*imageEntry(report(out), "rgba.tif"))["status"], "ok");
  EXPECT_TRUE(fs::exists(out + "/rgba_labels.tif"));
}

// The pixels of an image file, whatever its tags say.
cv::Mat pixelsOf(const std::string& path) {
  auto reader = ImageReader::open(path);
  return reader->readRegion({0, 0, reader->info().width, reader->info().height});
}

float xResolutionPerCentimetre(const std::string& path) {
  TIFF* t = TIFFOpen(path.c_str(), "r");
  float xres = 0;
  uint16_t unit = 0;
  TIFFGetField(t, TIFFTAG_XRESOLUTION, &xres);
  TIFFGetField(t, TIFFTAG_RESOLUTIONUNIT, &unit);
  TIFFClose(t);
  return unit == RESUNIT_CENTIMETER ? xres : -1;
}

TEST_F(Pipeline, WholeSlideAtMppIsItsLevelPixelForPixel) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = root_ + "/wsi";
  fs::create_directories(dir + "/slides");
  fs::create_directories(dir + "/export");
  test::makeSlide(pattern(768, 1024, CV_8UC3, 255), dir + "/plain.tif", dir + "/slides/aperio.svs", 0.25, 40);
  // Level 1 as OpenSlide's own tool exports it, processed as a plain PNG.
  auto r =
      run("openslide-write-png " + dir + "/slides/aperio.svs 0 0 1 512 384 " + dir + "/export/level1.png");
  ASSERT_EQ(r.code, 0) << r.output;
  auto tiler = [&](const std::string& input, const std::string& out, const std::string& flags,
                   const std::string& save = "labels,probs") {
    auto res = run(kTiler + " -i " + input + " -m " + model_ + " -o " + dir + "/" + out +
                   " --window 128 --batch_size 4 --threads 1 --no_progress --save " + save + " " + flags);
    EXPECT_EQ(res.code, 0) << res.output;
  };
  tiler(dir + "/slides", "mpp", "--mpp 0.5");
  tiler(dir + "/slides", "mag", "--magnification 20");
  tiler(dir + "/slides", "level", "--level 1", "labels,probs,polygons");
  tiler(dir + "/export", "png", "", "labels,probs,polygons");
  // Polygons are in level-0 pixels of the slide: twice the coordinates of the level-1 export's.
  auto polygons = [&](const std::string& path) { return nlohmann::json::parse(slurp(path))["features"]; };
  const auto slide_features = polygons(dir + "/level/aperio_polygons.geojson");
  const auto export_features = polygons(dir + "/png/level1_polygons.geojson");
  ASSERT_EQ(slide_features.size(), export_features.size());
  ASSERT_GT(slide_features.size(), 0u);
  const auto& a = slide_features[0]["geometry"]["coordinates"][0][0];
  const auto& b = export_features[0]["geometry"]["coordinates"][0][0];
  EXPECT_EQ(a[0].get<double>(), 2 * b[0].get<double>());
  EXPECT_EQ(a[1].get<double>(), 2 * b[1].get<double>());
  for (const char* other : {"mag", "level"})
    for (const char* kind : {"probs", "labels"})
      EXPECT_TRUE(slurp(dir + "/mpp/aperio_" + kind + ".tif") ==
                  slurp(dir + "/" + other + "/aperio_" + kind + ".tif"))
          << other << " " << kind;
  EXPECT_EQ(cv::norm(pixelsOf(dir + "/mpp/aperio_probs.tif"), pixelsOf(dir + "/png/level1_probs.tif"),
                     cv::NORM_INF),
            0);
  const auto e = report(dir + "/mpp")["images"][0];
  EXPECT_EQ(e["width"], 512);
  EXPECT_EQ(e["height"], 384);
  EXPECT_EQ(e["level"], 1);
  EXPECT_EQ(e["mpp"], 0.5);
  EXPECT_EQ(e["source_mpp"], 0.25);
  EXPECT_EQ(e["reader"], "openslide");
  EXPECT_EQ(report(dir + "/png")["images"][0]["mpp"], nullptr);
  EXPECT_FLOAT_EQ(xResolutionPerCentimetre(dir + "/mpp/aperio_labels.tif"), 20000.f);  // 0.5 µm/px
}

TEST_F(Pipeline, ResampledSlideTilesExactlyAndIsTheSameOnOneAndTwoRanks) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = root_ + "/wsi_resampled";
  fs::create_directories(dir + "/slides");
  test::makeSlide(pattern(768, 1024, CV_8UC3, 255), dir + "/plain.tif", dir + "/slides/aperio.svs", 0.25, 40);
  const std::string args =
      " -i " + dir + "/slides -m " + model_ +
      " --window 96 --batch_size 3 --threads 1 --save labels,probs --no_progress --mpp 0.375";
  auto one = run(kTiler + args + " -o " + dir + "/one");
  ASSERT_EQ(one.code, 0) << one.output;
  auto two = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + args + " -o " + dir + "/two");
  ASSERT_EQ(two.code, 0) << two.output;
  for (const char* kind : {"probs", "labels"})
    EXPECT_TRUE(slurp(dir + "/one/aperio_" + kind + ".tif") == slurp(dir + "/two/aperio_" + kind + ".tif"));
  const auto e = report(dir + "/one")["images"][0];
  EXPECT_EQ(e["width"], 682);  // floor(1024 / 1.5)
  EXPECT_EQ(e["height"], 512);
  EXPECT_EQ(e["level"], 0);
  EXPECT_DOUBLE_EQ(e["mpp"].get<double>(), 0.375);
  const cv::Mat labels = pixelsOf(dir + "/one/aperio_labels.tif");
  EXPECT_EQ(labels.cols, 682);
  EXPECT_NEAR(xResolutionPerCentimetre(dir + "/one/aperio_labels.tif"), 1e4 / 0.375, 0.01);
}

// --channels on a 16-bit 6-channel TIFF and a 4-band TIFF: the outputs of a pre-sliced copy, byte for byte.
TEST_F(Pipeline, ChosenChannelsEqualAPreSlicedCopy) {
  struct Case {
    const char* name;
    int type;
    double scale;
    SampleType sample;
    std::string list;
    std::vector<int> order;
  };
  for (const Case& c : {Case{"six16", CV_16UC(6), 65535, SampleType::kU16, "4,0,2", {4, 0, 2}},
                        Case{"four8", CV_8UC4, 255, SampleType::kU8, "3,1-2", {3, 1, 2}}}) {
    const std::string whole = root_ + "/ch_" + c.name + "_whole",
                      sliced = root_ + "/ch_" + c.name + "_sliced";
    fs::create_directories(whole);
    fs::create_directories(sliced);
    const cv::Mat all = pattern(190, 260, c.type, c.scale);
    cv::Mat three(all.rows, all.cols, CV_MAKETYPE(all.depth(), 3));
    const int from_to[] = {c.order[0], 0, c.order[1], 1, c.order[2], 2};
    cv::mixChannels(&all, 1, &three, 1, from_to, 3);
    writeImage(whole + "/img.tif", all, c.sample);
    writeImage(sliced + "/img.tif", three, c.sample);
    auto args = [&](const std::string& in, const std::string& out, const std::string& extra) {
      return kTiler + " -i " + in + " -m " + model_ + " -o " + out +
             " --window 64 --batch_size 4 --threads 1 --save labels,probs --no_progress " + extra;
    };
    auto w = run(args(whole, whole + "_out", "--channels " + c.list));
    ASSERT_EQ(w.code, 0) << c.name << ": " << w.output;
    auto s = run(args(sliced, sliced + "_out", ""));
    ASSERT_EQ(s.code, 0) << c.name << ": " << s.output;
    for (const char* f : {"/img_labels.tif", "/img_probs.tif"})
      EXPECT_TRUE(slurp(whole + "_out" + f) == slurp(sliced + "_out" + f)) << c.name << f;
  }
  // Past the image's channels: that image fails, named; malformed: refused at set-up in one line.
  auto past = run(kTiler + " -i " + root_ + "/ch_four8_whole -m " + model_ + " -o " + root_ +
                  "/ch_past --window 64 --no_progress --channels 1,2,4");
  EXPECT_EQ(past.code, 2) << past.output;
  EXPECT_NE(past.output.find("img.tif': --channels names channel 4 but the image has 4 (0-3)"),
            std::string::npos)
      << past.output;
  auto bad = run(kTiler + " -i " + root_ + "/ch_four8_whole -m " + model_ + " -o " + root_ +
                 "/ch_bad --window 64 --no_progress --channels 2-0");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--channels '2-0': range '2-0' runs backwards"), std::string::npos) << bad.output;
}

// Remote inputs: URLs served by tests/range_server.py (HTTP with Range), read by byte ranges through GDAL.

std::string remoteArgs(const std::string& inputs, const std::string& model, const std::string& out) {
  return kTiler + " -i " + inputs + " -m " + model + " -o " + out +
         " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress ";
}

void writeList(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream list(path);
  list << "# inputs of a remote run\n\n";
  for (const auto& line : lines) list << line << "\n";
}

// A tiled TIFF and an SVS named in a list of URLs write the bytes their local files write; the SVS, which
// OpenSlide reads here, is read by libtiff there, at OpenSlide's µm/px.
TEST_F(Pipeline, RemoteInputsInAListOfUrlsWriteTheLocalFilesBytes) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = root_ + "/remote_src";
  fs::create_directories(dir);
  test::writeNoiseTiff(dir + "/tiled.tif", 640);
  cv::Mat rgb = pattern(500, 600, CV_8UC3, 255);
  test::makeSlide(rgb, dir + "/plain.tif", dir + "/slide.svs");
  test::RangeServer server(dir);
  writeList(root_ + "/local.txt", {dir + "/tiled.tif", dir + "/slide.svs"});
  // A password and a token in the URL: used to read, never written anywhere.
  std::string secret = server.url("slide.svs?token=a/b");
  secret.insert(secret.find("://") + 3, "ann:pa55word@");
  writeList(root_ + "/urls.txt", {server.url("tiled.tif"), secret});
  const std::string local = root_ + "/remote_local_out", remote = root_ + "/remote_out";
  auto l = run(remoteArgs(root_ + "/local.txt", model_, local));
  ASSERT_EQ(l.code, 0) << l.output;
  auto r = run(remoteArgs(root_ + "/urls.txt", model_, remote));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* f : {"/tiled_labels.tif", "/tiled_probs.tif", "/slide_labels.tif", "/slide_probs.tif"}) {
    ASSERT_TRUE(fs::exists(remote + f)) << f;
    EXPECT_TRUE(slurp(local + f) == slurp(remote + f)) << f << ": remote outputs are the local ones";
  }
  const nlohmann::json images = report(remote)["images"];
  ASSERT_EQ(images.size(), 2u);
  for (const auto& e : images) {
    EXPECT_EQ(e["reader"], "tiff") << e;
    EXPECT_GT(e["remote_bytes_read"].get<int64_t>(), 0) << e;
  }
  std::string redacted = server.url("slide.svs?token=***");
  redacted.insert(redacted.find("://") + 3, "ann:***@");
  const auto slide = images[images[0]["input"] == redacted ? 0 : 1];
  EXPECT_EQ(slide["input"], redacted);
  EXPECT_EQ(slurp(remote + "/report.json").find("pa55word"), std::string::npos);
  EXPECT_EQ(r.output.find("pa55word"), std::string::npos) << r.output;
  EXPECT_EQ(slide["mpp"], 0.25) << "the SVS's µm/px from its Aperio description";
  EXPECT_FALSE(report(local)["images"][0].contains("remote_bytes_read"))
      << "local inputs read no bytes remotely";
}

TEST_F(Pipeline, AFailedRemoteInputsErrorNamesItWithoutItsPassword) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = root_ + "/remote_secret";
  fs::create_directories(dir);
  test::RangeServer server(dir);
  std::string missing = server.url("missing.tif?X-Amz-Signature=f00d");
  missing.insert(missing.find("://") + 3, "ann:pa55word@");
  writeList(dir + "/urls.txt", {missing});
  auto r = run(remoteArgs(dir + "/urls.txt", model_, dir + "/out"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("ann:***@"), std::string::npos) << r.output;
  const std::string report_text = slurp(dir + "/out/report.json");
  EXPECT_NE(report_text.find("X-Amz-Signature=***"), std::string::npos) << report_text;
  for (const std::string& secret : {"pa55word", "f00d"}) {
    EXPECT_EQ(r.output.find(secret), std::string::npos) << r.output;
    EXPECT_EQ(report_text.find(secret), std::string::npos) << report_text;
  }
}

// A mask that keeps a corner: its windows' tiles (and the header) are all that comes over the network, on
// one rank or two (the report sums what each rank fetched; two ranks both read the tiles their windows
// share).
TEST_F(Pipeline, ACornerOfARemoteImageFetchesLittleOfTheFile) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = root_ + "/remote_corner";
  fs::create_directories(dir);
  test::writeNoiseTiff(dir + "/big.tif", 2048);
  const auto file_size = int64_t(fs::file_size(dir + "/big.tif"));
  cv::Mat mask = cv::Mat::zeros(2048, 2048, CV_8U);
  mask(cv::Rect(0, 0, 256, 256)).setTo(255);
  writeImage(root_ + "/corner_mask.png", mask, SampleType::kU8);
  for (const int ranks : {1, 2}) {
    test::RangeServer server(dir);
    const std::string out = root_ + "/remote_corner_out" + std::to_string(ranks);
    auto r = run(kCtrun + " --nproc_per_node " + std::to_string(ranks) + " --master_port 0 " +
                 remoteArgs(server.url("big.tif"), model_, out) + " --mask " + root_ + "/corner_mask.png");
    ASSERT_EQ(r.code, 0) << r.output;
    const nlohmann::json e = report(out)["images"][0];
    EXPECT_LT(e["windows_processed"].get<int64_t>(), e["windows"].get<int64_t>() / 10) << e;
    const int64_t fetched = e["remote_bytes_read"].get<int64_t>();
    EXPECT_GT(fetched, 256 * 256 * 3) << e;
    EXPECT_LT(fetched, file_size / 6) << ranks << " rank(s) fetched " << fetched << " of " << file_size;
    EXPECT_EQ(fetched, server.bytesSent()) << "the report counts what the server sent";
  }
}

// A server that loses the connection mid-read fails that image alone, naming the URL and what happened; the
// batch's other image is written, the exit code says some failed, and --resume against a good server redoes
// the failed one to the local file's bytes.
TEST_F(Pipeline, ALostConnectionFailsThatImageAloneAndResumeRedoesIt) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = root_ + "/remote_drop";
  fs::create_directories(dir);
  test::writeNoiseTiff(dir + "/small.tif", 256);
  test::writeNoiseTiff(dir + "/cut.tif", 1024);
  test::RangeServer good(dir), cutting(dir, long(fs::file_size(dir + "/cut.tif") / 3));
  const std::string out = root_ + "/remote_drop_out", local = root_ + "/remote_drop_local";
  writeList(root_ + "/drop.txt", {good.url("small.tif"), cutting.url("cut.tif")});
  auto r = run(remoteArgs(root_ + "/drop.txt", model_, out));
  EXPECT_EQ(r.code, kExitSomeFailed) << r.output;
  const nlohmann::json images = report(out)["images"];
  ASSERT_EQ(images.size(), 2u);
  const auto& cut = images[0]["input"] == cutting.url("cut.tif") ? images[0] : images[1];
  const auto& small = images[0]["input"] == cutting.url("cut.tif") ? images[1] : images[0];
  EXPECT_EQ(small["status"], "ok") << small;
  EXPECT_EQ(cut["status"], "error") << cut;
  const std::string error = cut["error"].get<std::string>();
  EXPECT_NE(error.find("'" + cutting.url("cut.tif") + "': TIFFReadTile failed at tile"), std::string::npos)
      << error;
  EXPECT_NE(error.find("the connection was lost or the transfer cut short"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(out + "/cut_labels.tif")) << "nothing of the failed image is final";

  writeList(root_ + "/drop_again.txt", {good.url("small.tif"), good.url("cut.tif")});
  auto again = run(remoteArgs(root_ + "/drop_again.txt", model_, out) + " --resume");
  ASSERT_EQ(again.code, 0) << again.output;
  const nlohmann::json resumed = report(out)["images"];
  for (const auto& e : resumed)
    EXPECT_EQ(e["status"], e["input"] == good.url("small.tif") ? "skipped" : "ok") << e;
  auto l = run(remoteArgs(dir + "/cut.tif", model_, local));
  ASSERT_EQ(l.code, 0) << l.output;
  for (const char* f : {"/cut_labels.tif", "/cut_probs.tif"})
    EXPECT_TRUE(slurp(local + f) == slurp(out + f)) << f << ": the resumed image is the local file's";
}

// A busy server (503) is asked again after GDAL's back-off (tiler's default: 4 retries from 1 s, doubling)
// unless the user set GDAL_HTTP_MAX_RETRY, whose value then holds.
TEST_F(Pipeline, ABusyServerIsAskedAgainUnlessTheUserSetsNoRetries) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = root_ + "/remote_busy";
  fs::create_directories(dir);
  test::writeNoiseTiff(dir + "/busy.tif", 256);
  test::RangeServer busy(dir, -1, 1);
  auto retried = run(kTiler + " info " + busy.url("busy.tif"));
  EXPECT_EQ(retried.code, 0) << retried.output;
  EXPECT_NE(retried.output.find("256x256, 3 channel(s)"), std::string::npos) << retried.output;
  EXPECT_GT(retried.seconds, 1.0) << "the retry waited GDAL_HTTP_RETRY_DELAY";
  test::RangeServer busy_again(dir, -1, 1);
  auto refused = run("GDAL_HTTP_MAX_RETRY=0 " + kTiler + " info " + busy_again.url("busy.tif"));
  EXPECT_NE(refused.code, 0) << refused.output;
  EXPECT_NE(
      refused.output.find("'" + busy_again.url("busy.tif") + "': cannot open it: HTTP response code: 503"),
      std::string::npos)
      << refused.output;
}

}  // namespace
}  // namespace tiler::e2e
