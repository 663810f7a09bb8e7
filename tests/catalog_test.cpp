// The window catalog: inputs, per-image checks that never throw, the global window index.
#include "tiler/io/catalog.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// The naming of the outputs these tests save, as writers/formats names them (the catalog takes any).
const OutputKind kLabels{"labels", "{stem}_labels.{format}", false, {}, true};
const OutputKind kPolygons{"polygons", "{stem}_polygons.geojson", false, {".labels.tif"}, true};
const OutputKind kFeaturesPt{"features_pt", "{stem}.pt", false, {".rows"}};

void writeRgb(const std::string& path, int w, int h) {
  WriterOptions o;
  o.format = fs::path(path).extension() == ".png" ? "png" : "tif";
  ImageWriter writer(path, w, h, 3, SampleType::kU8, o);
  writer.writeRows(cv::Mat(h, w, CV_8UC3, cv::Scalar(1, 2, 3)));
  writer.close();
}

TEST(Catalog, ListImagesSortsAndFilters) {
  const std::string dir = test::scratchDir("list");
  fs::create_directories(dir + "/sub");
  for (const char* f : {"b.tif", "a.PNG", "notes.txt", "sub/c.jpg"}) std::ofstream(dir + "/" + f) << "x";
  auto flat = listImages({dir}, false);
  ASSERT_EQ(flat.size(), 2u);
  EXPECT_EQ(fs::path(flat[0]).filename(), "a.PNG");
  EXPECT_EQ(listImages({dir}, true).size(), 3u);
  removeTree(dir);
}

// Links that lead nowhere are listed (opening one fails that image alone, and the report names it) whatever
// the directory's order; a FIFO is passed over in a directory and refused when named, never waited on.
TEST(Catalog, DanglingLinksLoopsAndFifos) {
  const std::string dir = test::scratchDir("list_links");
  writeRgb(dir + "/good.tif", 64, 64);
  fs::create_symlink(dir + "/nowhere.tif", dir + "/a_dangling.tif");
  fs::create_symlink(dir + "/z_loop.tif", dir + "/z_loop.tif");
  ASSERT_EQ(mkfifo((dir + "/m_fifo.tif").c_str(), 0600), 0);
  for (bool recursive : {false, true}) {
    const auto files = listImages({dir}, recursive);
    ASSERT_EQ(files.size(), 3u) << recursive;
    EXPECT_EQ(fs::path(files[0]).filename(), "a_dangling.tif");
    EXPECT_EQ(fs::path(files[1]).filename(), "good.tif");
    EXPECT_EQ(fs::path(files[2]).filename(), "z_loop.tif");
  }
  // A FIFO a list of inputs names: its first bytes are looked at (is it tiler's own output?) without waiting.
  fs::create_directories(dir + "/listed");
  ASSERT_EQ(mkfifo((dir + "/listed/n_fifo.tif").c_str(), 0600), 0);
  std::ofstream(dir + "/listed/inputs.txt") << dir << "/listed/n_fifo.tif\n";
  InferCatalogOptions o;
  o.inputs = {dir, dir + "/m_fifo.tif", dir + "/listed/inputs.txt"};
  o.output_dir = dir + "/out";
  o.outputs = {{"labels", kLabels}};
  CatalogSpec spec;
  spec.grid = GridSpec{32, 32, 0.0, 0.0};
  spec.input_channels = 3;
  const auto catalog = buildInferCatalog(o, spec);
  ASSERT_EQ(catalog.images().size(), 5u);
  std::map<std::string, std::string> errors;
  for (const auto& img : catalog.images()) errors[fs::path(img.input).filename()] = img.error;
  EXPECT_NE(errors["a_dangling.tif"].find("leads nowhere"), std::string::npos) << errors["a_dangling.tif"];
  EXPECT_NE(errors["z_loop.tif"].find("leads nowhere"), std::string::npos) << errors["z_loop.tif"];
  EXPECT_NE(errors["m_fifo.tif"].find("not a regular file"), std::string::npos) << errors["m_fifo.tif"];
  EXPECT_NE(errors["n_fifo.tif"].find("not a regular file"), std::string::npos) << errors["n_fifo.tif"];
  EXPECT_EQ(errors["good.tif"], "");
  removeTree(dir);
}

// `mkfifo out/.a.tiler-reading` blocked the run in open(O_WRONLY) forever, out of --timeout's reach: the mark
// is evidence, so something other than a plain file at its name is left alone and the run goes on.
TEST(Catalog, AFifoAtAReadingMarkIsLeftAloneNeverWaitedOn) {
  const std::string dir = test::scratchDir("mark_fifo");
  CatalogImage img;
  img.reading_mark = dir + "/.a.tiler-reading";
  ASSERT_EQ(mkfifo(img.reading_mark.c_str(), 0600), 0);
  auto marked = std::async(std::launch::async, [&] { markReading(img); });
  const bool returned = marked.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!returned) {
    // Let the blocked open through (a reader arrives), so that the test can end and say so.
    const int fd = open(img.reading_mark.c_str(), O_RDONLY | O_NONBLOCK);
    marked.wait();
    if (fd >= 0) close(fd);
  }
  EXPECT_TRUE(returned) << "markReading waited on a FIFO";
  struct stat st {};
  ASSERT_EQ(lstat(img.reading_mark.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "left as it was";
  unmarkReading(img);
  EXPECT_EQ(lstat(img.reading_mark.c_str(), &st), 0) << "only a plain file is a mark to remove";
  // A plain mark is made and removed as before.
  CatalogImage plain;
  plain.reading_mark = dir + "/.b.tiler-reading";
  markReading(plain);
  EXPECT_TRUE(isPlainFile(plain.reading_mark));
  unmarkReading(plain);
  EXPECT_FALSE(fs::exists(plain.reading_mark));
  removeTree(dir);
}

// An output is renamed over its name: a FIFO (or device) there, even with --overwrite, fails its image and
// stays, never unlinked.
TEST(Catalog, AFifoWhereAnOutputGoesFailsItsImageAndStays) {
  const std::string dir = test::scratchDir("output_fifo");
  writeRgb(dir + "/a.tif", 64, 64);
  writeRgb(dir + "/b.tif", 64, 64);
  fs::create_directories(dir + "/out");
  ASSERT_EQ(mkfifo((dir + "/out/a_labels.tif").c_str(), 0600), 0);
  InferCatalogOptions o;
  o.inputs = {dir + "/a.tif", dir + "/b.tif"};
  o.output_dir = dir + "/out";
  o.outputs = {{"labels", kLabels}};
  o.overwrite = true;
  CatalogSpec spec;
  spec.grid = GridSpec{32, 32, 0.0, 0.0};
  const auto catalog = buildInferCatalog(o, spec);
  ASSERT_EQ(catalog.images().size(), 2u);
  EXPECT_EQ(catalog.image(0).status, "error");
  EXPECT_EQ(catalog.image(0).error, "'" + dir + "/a.tif': its labels output '" + dir +
                                        "/out/a_labels.tif' is a character device or FIFO, which tiler never "
                                        "replaces; remove it or choose another --output");
  EXPECT_EQ(catalog.image(1).status, "ok");
  struct stat st {};
  ASSERT_EQ(lstat((dir + "/out/a_labels.tif").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  removeTree(dir);
}

TEST(Catalog, ChannelAdaptation) {
  EXPECT_EQ(channelAdaptation(3, 3, "a"), ChannelAdapt::kNone);
  EXPECT_EQ(channelAdaptation(1, 3, "a"), ChannelAdapt::kRepeatGray);
  EXPECT_EQ(channelAdaptation(4, 3, "a"), ChannelAdapt::kDropAlpha);
  EXPECT_EQ(channelAdaptation(1, 3, "a", /*palette=*/true), ChannelAdapt::kPalette);
  EXPECT_EQ(channelAdaptation(1, 1, "a", /*palette=*/true), ChannelAdapt::kNone) << "labels stay indices";
  try {
    channelAdaptation(5, 3, "x.tif");
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_EQ(e.message(), "'x.tif': image has 5 channel(s) but the model takes 3");
  }
}

TEST(Catalog, ChannelListsChooseAndOrder) {
  EXPECT_EQ(parseChannelList(""), std::vector<int>{});
  EXPECT_EQ(parseChannelList("2,0,1"), (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(parseChannelList("0-2"), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(parseChannelList("3,1-2"), (std::vector<int>{3, 1, 2}));
  EXPECT_EQ(parseChannelList("5"), std::vector<int>{5});
  for (const char* bad : {"a", "1,", ",1", "-1", "2-1", "1--2", "1-", "1 2", "1.5", "99999999"}) {
    try {
      parseChannelList(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.message().find("--channels '" + std::string(bad) + "': "), 0u) << e.message();
      EXPECT_EQ(e.message().find('\n'), std::string::npos) << "one line: " << e.message();
    }
  }
}

TEST(Catalog, ChosenChannelsAreTheImagesAndPastItsLastFailIt) {
  const std::string dir = test::scratchDir("catalog_channels");
  writeRgb(dir + "/rgb.tif", 40, 30);
  CatalogSpec spec;
  spec.grid = parseGridSpec("16", "0");
  spec.input_channels = 1;
  spec.channels = {2};
  CatalogImage img = WindowCatalog::describe(dir + "/rgb.tif", spec);
  ASSERT_EQ(img.status, "ok") << img.error;
  EXPECT_EQ(img.info.channels, 1) << "the model sees the chosen channel alone";
  EXPECT_EQ(img.adapt, ChannelAdapt::kNone);
  EXPECT_EQ(img.channels, std::vector<int>{2});
  spec.channels = {0, 3};
  img = WindowCatalog::describe(dir + "/rgb.tif", spec);
  EXPECT_EQ(img.status, "error");
  EXPECT_EQ(img.error, "'" + dir + "/rgb.tif': --channels names channel 3 but the image has 3 (0-2)");
}

TEST(Catalog, GlobalIndexSpansPlannedImagesOnly) {
  const std::string dir = test::scratchDir("catalog");
  writeRgb(dir + "/a.tif", 300, 200);  // 128-px windows, overlap 0.25: 3 x 2
  writeRgb(dir + "/c.tif", 100, 100);  // 1
  std::ofstream(dir + "/b.tif") << "not a tiff";
  InferCatalogOptions o;
  o.outputs = {{"labels", kLabels}};
  o.inputs = {dir};
  o.output_dir = dir + "/out";
  CatalogSpec spec{GridSpec{128, 128, 0.25, 0.25}, 3, Scale{}, 0.0, MaskSpec{}, ResolutionSpec{}};
  WindowCatalog c = buildInferCatalog(o, spec);
  ASSERT_EQ(c.images().size(), 3u);
  EXPECT_EQ(c.image(1).status, "error");
  EXPECT_NE(c.image(1).error.find("b.tif"), std::string::npos) << c.image(1).error;
  EXPECT_EQ(c.totalWindows(), 6 + 1);
  EXPECT_EQ(c.plannedImages(), 2);
  EXPECT_EQ(c.locate(0), std::make_pair(0, int64_t(0)));
  EXPECT_EQ(c.locate(5), std::make_pair(0, int64_t(5)));
  EXPECT_EQ(c.locate(6), std::make_pair(2, int64_t(0))) << "the failed image has no windows";
  EXPECT_THROW(c.locate(7), Error);
  EXPECT_EQ(c.image(2).first_window, 6);
  EXPECT_EQ(c.image(0).outputs.at("labels"), dir + "/out/a_labels.tif");
  removeTree(dir);
}

TEST(Catalog, ExistingOutputsNeedResumeOrOverwrite) {
  const std::string dir = test::scratchDir("catalog_resume");
  writeRgb(dir + "/a.tif", 64, 64);
  writeRgb(dir + "/b.tif", 64, 64);
  fs::create_directories(dir + "/out");
  writeRgb(dir + "/out/a_labels.tif", 8, 8);
  std::ofstream(dir + "/out/b_labels.tif.partial") << "left by a killed run";
  InferCatalogOptions o;
  o.outputs = {{"labels", kLabels}};
  o.inputs = {dir + "/a.tif", dir + "/b.tif"};
  o.output_dir = dir + "/out";
  CatalogSpec spec{GridSpec{64, 64, 0.25, 0.25}, 3, Scale{}, 0.0, MaskSpec{}, ResolutionSpec{}};
  try {
    buildInferCatalog(o, spec);
    FAIL() << "existing outputs were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("a_labels.tif"), std::string::npos) << e.message();
  }
  o.resume = true;
  o.remove_stale_partials = true;
  WindowCatalog c = buildInferCatalog(o, spec);
  EXPECT_EQ(c.image(0).status, "skipped");
  EXPECT_EQ(c.image(1).status, "ok");
  EXPECT_EQ(c.totalWindows(), 1);
  EXPECT_FALSE(fs::exists(dir + "/out/b_labels.tif.partial"));
  removeTree(dir);
}

// What a killed run's writers left goes as their rows name it (a polygons' scratch labels level under
// --pyramid); what no writer of the saved kinds makes stays.
TEST(Catalog, StalePartialsOfTheSavedKindsAreSwept) {
  const std::string dir = test::scratchDir("catalog_sweep");
  writeRgb(dir + "/b.tif", 64, 64);
  fs::create_directories(dir + "/out");
  const std::vector<std::string> stale = {
      "b_polygons.geojson.partial", "b_polygons.geojson.labels.tif.partial",
      "b_polygons.geojson.labels.tif.level2.partial", "b.pt.rows.partial"};
  for (const auto& name : stale) std::ofstream(dir + "/out/" + name) << "left by a killed run";
  std::ofstream(dir + "/out/b.csv.partial") << "no writer of this run's kinds";
  InferCatalogOptions o;
  o.inputs = {dir + "/b.tif"};
  o.output_dir = dir + "/out";
  o.outputs = {{"polygons", kPolygons}, {"features_pt", kFeaturesPt}};
  o.resume = true;
  o.remove_stale_partials = true;
  CatalogSpec spec{GridSpec{64, 64, 0.25, 0.25}, 3, Scale{}, 0.0, MaskSpec{}, ResolutionSpec{}};
  WindowCatalog c = buildInferCatalog(o, spec);
  EXPECT_EQ(c.image(0).status, "ok");
  for (const auto& name : stale) EXPECT_FALSE(fs::exists(dir + "/out/" + name)) << name;
  EXPECT_TRUE(fs::exists(dir + "/out/b.csv.partial"));
  removeTree(dir);
}

TEST(Catalog, SameStemTwiceFailsTheSecond) {
  const std::string dir = test::scratchDir("catalog_stem");
  writeRgb(dir + "/a.tif", 64, 64);
  writeRgb(dir + "/a.png", 64, 64);
  InferCatalogOptions o;
  o.outputs = {{"labels", kLabels}};
  o.inputs = {dir};
  o.output_dir = dir + "/out";
  WindowCatalog c = buildInferCatalog(
      o, CatalogSpec{GridSpec{64, 64, 0.25, 0.25}, 3, Scale{}, 0.0, MaskSpec{}, ResolutionSpec{}});
  EXPECT_EQ(c.image(0).status, "ok");
  EXPECT_EQ(c.image(1).status, "error");
  EXPECT_NE(c.image(1).error.find("same file stem"), std::string::npos);
  removeTree(dir);
}

}  // namespace
}  // namespace tiler
