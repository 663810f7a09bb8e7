#include "tiler/writers/zarr_writer.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/io/image_io.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

const std::string kPython = "/usr/bin/python3";

// A store's shape and contents, as a test writes it.
struct StoreCase {
  std::string name;
  int width = 0, height = 0;
  int channels = 0;  // probabilities' channels; 0: none
  SampleType probs = SampleType::kF32;
  bool labels = true;
  SampleType label_type = SampleType::kU8;
  bool pyramid = false;
  int chunk = 64;
  int threads = 0;  // the pool's; 0: none
  std::optional<double> mpp;
  std::string compression;  // --compression's text; "": the defaults
};

void PrintTo(const StoreCase& c, std::ostream* out) {
  *out << c.name;
}

cv::Mat randomProbabilities(int h, int w, int channels, SampleType type, uint64_t seed) {
  cv::Mat wide(h, w, CV_MAKETYPE(CV_32F, channels));
  cv::RNG rng(seed);
  rng.fill(wide, cv::RNG::UNIFORM, 0.0, 1.0);
  // A block of zeros across the top-left chunks: chunks equal to the fill value are left out of the store.
  wide(cv::Rect(0, 0, std::min(w, 150), std::min(h, 70))).setTo(0);
  cv::Mat out;
  if (type == SampleType::kF32) return wide;
  if (type == SampleType::kU8)
    wide.convertTo(out, CV_MAKETYPE(CV_8U, channels), 255.0);
  else
    wide.convertTo(out, CV_MAKETYPE(CV_16F, channels));
  return out;
}

cv::Mat randomLabels(int h, int w, SampleType type, int classes, uint64_t seed) {
  cv::Mat labels(h, w, cvDepthOf(type));
  cv::RNG rng(seed);
  rng.fill(labels, cv::RNG::UNIFORM, 0, classes);
  labels(cv::Rect(0, 0, std::min(w, 150), std::min(h, 70))).setTo(0);
  return labels;
}

// numpy's .npy of an HWC image as (C, H, W).
void writeNpy(const std::string& path, const cv::Mat& hwc, const std::string& dtype) {
  std::string header = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (" +
                       std::to_string(hwc.channels()) + ", " + std::to_string(hwc.rows) + ", " +
                       std::to_string(hwc.cols) + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t length = uint16_t(header.size());
  out.write(reinterpret_cast<const char*>(&length), 2);
  out << header;
  std::vector<cv::Mat> planes;
  cv::split(hwc, planes);
  for (const cv::Mat& plane : planes)
    for (int y = 0; y < plane.rows; ++y)
      out.write(reinterpret_cast<const char*>(plane.ptr(y)), std::streamsize(plane.cols * plane.elemSize()));
}

// numpy's dtype of a matrix's samples (the test's own table, apart from the writer's).
std::string npyDtype(const cv::Mat& m) {
  const int depth = m.depth();
  return depth == CV_8U    ? "|u1"
         : depth == CV_16U ? "<u2"
         : depth == CV_16F ? "<f2"
         : depth == CV_32F ? "<f4"
                           : "?";
}

// Every level of `image` as ImageWriter's TIFF pyramid makes it (tiles of one chunk), read back.
std::vector<cv::Mat> tiffLevels(const std::string& path, const cv::Mat& image, SampleType type, bool nearest,
                                const StoreCase& c) {
  WriterOptions o;
  o.tile = c.chunk;
  o.pyramid = c.pyramid;
  o.nearest = nearest;
  {
    ImageWriter writer(path, image.cols, image.rows, image.channels(), type, o);
    for (int y = 0; y < image.rows; y += 37)
      writer.writeRows(image.rowRange(y, std::min(image.rows, y + 37)));
    writer.close();
  }
  auto reader = ImageReader::open(path);
  std::vector<cv::Mat> levels;
  for (size_t k = 0; k < reader->info().levels.size(); ++k) {
    const auto& level = reader->info().levels[k];
    levels.push_back(reader->readRegion(Rect{0, 0, level.width, level.height}, int(k)));
  }
  return levels;
}

ZarrOptions optionsOf(const StoreCase& c) {
  ZarrOptions o;
  o.chunk = c.chunk;
  o.pyramid = c.pyramid;
  o.mpp = c.mpp;
  o.name = c.name;
  if (!c.compression.empty()) o.compression = parseCompression(c.compression);
  if (c.threads > 0) o.pool = std::make_shared<WorkPool>(c.threads);
  if (c.channels > 0) {
    ZarrProbabilities p;
    p.channels = c.channels;
    p.type = c.probs;
    for (int k = 0; k < c.channels; ++k)
      p.channel_classes.push_back({"class " + std::to_string(k), {200, 10, 10}});
    if (c.probs == SampleType::kU8)
      p.attributes = R"({"tiler": {"probabilities": {"scale": 0.00392156862745098}}})";
    o.probabilities = p;
  }
  if (c.labels) {
    ZarrLabels l;
    l.type = c.label_type;
    l.classes = {{"background", {0, 0, 0}}, {"tumour", {230, 25, 75}}, {"stroma", {60, 180, 75}}};
    o.labels = l;
  }
  return o;
}

// Writes the store of `c` from `probs` and `labels` in bands of `band` rows.
void writeStore(const std::string& path, const StoreCase& c, const cv::Mat& probs, const cv::Mat& labels,
                int band = 37) {
  ZarrWriter writer(path, c.width, c.height, optionsOf(c));
  for (int y = 0; y < c.height; y += band) {
    const int end = std::min(c.height, y + band);
    if (c.channels > 0) writer.writeProbabilities(probs.rowRange(y, end));
    if (c.labels) writer.writeLabels(labels.rowRange(y, end));
  }
  writer.finish();
  writer.commit();
}

bool pythonHasZarr() {
  return test::runCommand(kPython + " -c 'import zarr, numcodecs, jsonschema, numpy'").code == 0;
}

std::map<std::string, std::string> filesUnder(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = test::slurp(e.path().string());
  return files;
}

class ZarrStores : public ::testing::TestWithParam<StoreCase> {};

// The store's arrays, read by python3-zarr, equal what was written (level 0) and the TIFF pyramid's levels;
// its .zattrs validate against the NGFF 0.4 schemas; GDAL's Zarr driver opens it and reads the values too.
TEST_P(ZarrStores, RealReadersSeeWhatWasWritten) {
  const StoreCase& c = GetParam();
  const std::string dir = test::scratchDir("zarr_" + c.name);
  const std::string store = dir + "/" + c.name + ".ome.zarr";
  const cv::Mat probs =
      c.channels > 0 ? randomProbabilities(c.height, c.width, c.channels, c.probs, 7) : cv::Mat();
  const cv::Mat labels = c.labels ? randomLabels(c.height, c.width, c.label_type, 3, 11) : cv::Mat();
  writeStore(store, c, probs, labels);
  ASSERT_TRUE(fs::is_directory(store));
  EXPECT_FALSE(fs::exists(store + ".partial"));

  nlohmann::json arrays = nlohmann::json::array();
  const auto expect = [&](const std::string& prefix, const cv::Mat& image, SampleType type, bool nearest) {
    const std::string tag = prefix.empty() ? "probs" : "labels";
    const auto levels = tiffLevels(dir + "/" + tag + ".tif", image, type, nearest, c);
    EXPECT_EQ(levels.size() > 1, c.pyramid);
    for (size_t k = 0; k < levels.size(); ++k) {
      const std::string npy = dir + "/" + tag + std::to_string(k) + ".npy";
      writeNpy(npy, levels[k], npyDtype(levels[k]));
      arrays.push_back(
          {{"path", prefix + std::to_string(k)}, {"npy", npy}, {"chunks", {1, c.chunk, c.chunk}}});
    }
  };
  if (c.channels > 0) expect("", probs, c.probs, false);
  if (c.labels) expect("labels/classes/", labels, c.label_type, true);

  const nlohmann::json manifest = {
      {"arrays", arrays}, {"strict", c.pyramid}, {"labels", c.labels ? nlohmann::json("classes") : nullptr}};
  std::ofstream(dir + "/manifest.json") << manifest.dump();
  if (!pythonHasZarr())
    GTEST_SKIP() << "python3-zarr, python3-jsonschema or numpy is missing (scripts/setup-deps.sh)";
  const auto checked =
      test::runCommand(kPython + " " + TILER_TEST_SOURCE_DIR + "/tests/zarr_check.py '" + store + "' '" +
                       dir + "/manifest.json' " + TILER_TEST_SOURCE_DIR + "/tests/data/ngff-0.4");
  EXPECT_EQ(checked.code, 0) << checked.output;
  EXPECT_NE(checked.output.find("ok"), std::string::npos) << checked.output;

  TILER_SKIP_WITHOUT_TOOL("gdalinfo");
  const auto info = test::runCommand("gdalinfo '" + store + "'");
  EXPECT_EQ(info.code, 0) << info.output;
  EXPECT_EQ(info.output.find("ERROR"), std::string::npos) << info.output;
  // Level 0 of each image, channel by channel, through GDAL's classic raster view of a 3-d array.
  const auto throughGdal = [&](const std::string& array, const cv::Mat& image) {
    for (int ch = 0; ch < image.channels(); ++ch) {
      const std::string tif = dir + "/gdal_" + std::to_string(ch) + ".tif";
      fs::remove(tif);
      const auto r = test::runCommand("gdal_translate -q -of GTiff 'ZARR:\"" + store + "\":/" + array + ":" +
                                      std::to_string(ch) + "' '" + tif + "'");
      ASSERT_EQ(r.code, 0) << r.output;
      std::vector<cv::Mat> planes;
      cv::split(image, planes);  // OpenCV 4.6's extractChannel has no half floats
      cv::Mat plane = planes[size_t(ch)];
      // GDAL before 3.11 has no half floats: it reads them as floats (exactly).
      if (plane.depth() == CV_16F) plane.convertTo(plane, CV_32F);
      const cv::Mat read = ImageReader::open(tif)->readRegion(Rect{0, 0, image.cols, image.rows});
      ASSERT_EQ(read.type(), plane.type()) << array << " channel " << ch;
      EXPECT_EQ(cv::norm(read != plane, cv::NORM_L1), 0) << array << " channel " << ch;
    }
  };
  if (c.channels > 0) throughGdal("0", probs);
  if (c.labels) throughGdal("labels/classes/0", labels);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ZarrStores,
    ::testing::Values(
        StoreCase{
            "u8_one_channel", 300, 200, 1, SampleType::kU8, true, SampleType::kU8, false, 64, 0, {}, ""},
        StoreCase{"f16_pyramid", 517, 389, 3, SampleType::kF16, true, SampleType::kU16, true, 64, 3, 0.25,
                  ""},
        StoreCase{"f32_pyramid", 700, 450, 3, SampleType::kF32, true, SampleType::kU8, true, 128, 2, 0.5, ""},
        StoreCase{
            "probabilities_only", 333, 129, 2, SampleType::kF32, false, SampleType::kU8, true, 64, 2, {}, ""},
        StoreCase{"labels_only", 260, 390, 0, SampleType::kF32, true, SampleType::kU16, true, 64, 0, {}, ""},
        // --compression as the user gives it for the TIFFs: zstd at a level, deflate past zlib's 9, none.
        StoreCase{"zstd_9", 300, 200, 2, SampleType::kF32, true, SampleType::kU8, false, 64, 2, {}, "zstd:9"},
        StoreCase{"deflate_12",
                  300,
                  200,
                  2,
                  SampleType::kF16,
                  true,
                  SampleType::kU8,
                  false,
                  64,
                  0,
                  {},
                  "deflate:12"},
        StoreCase{
            "uncompressed", 200, 130, 2, SampleType::kU8, true, SampleType::kU16, true, 64, 0, {}, "none"}),
    [](const auto& info) { return info.param.name; });

// The metadata, read back as JSON: scales per level in micrometres where the µm/px is known, pixels
// otherwise; the labels' colours and names; no chunk file for chunks of zeros.
TEST(ZarrWriter, MetadataSaysScalesColoursAndNames) {
  const std::string dir = test::scratchDir("zarr_metadata");
  StoreCase c{"meta", 300, 140, 2, SampleType::kU8, true, SampleType::kU8, true, 64, 0, 0.5, ""};
  writeStore(dir + "/a.ome.zarr", c, randomProbabilities(140, 300, 2, SampleType::kU8, 1),
             randomLabels(140, 300, SampleType::kU8, 3, 2));
  const auto root = nlohmann::json::parse(test::slurp(dir + "/a.ome.zarr/.zattrs"));
  const auto& ms = root["multiscales"][0];
  EXPECT_EQ(ms["axes"][1], (nlohmann::json{{"name", "y"}, {"type", "space"}, {"unit", "micrometer"}}));
  ASSERT_EQ(ms["datasets"].size(), 4u);  // 300 -> 150 -> 75 -> 38 (one chunk)
  EXPECT_EQ(ms["datasets"][2]["coordinateTransformations"][0]["scale"], (nlohmann::json{1.0, 2.0, 2.0}));
  EXPECT_EQ(root["omero"]["channels"][1]["label"], "class 1");
  EXPECT_EQ(root["omero"]["channels"][1]["window"]["max"], 255.0);
  EXPECT_DOUBLE_EQ(root["tiler"]["probabilities"]["scale"].get<double>(), 1.0 / 255);
  const auto zarray = nlohmann::json::parse(test::slurp(dir + "/a.ome.zarr/0/.zarray"));
  EXPECT_EQ(zarray["shape"], (nlohmann::json{2, 140, 300}));
  EXPECT_EQ(zarray["compressor"], (nlohmann::json{{"id", "zstd"}, {"level", 1}})) << "u8 probabilities";
  EXPECT_EQ(nlohmann::json::parse(test::slurp(dir + "/a.ome.zarr/labels/classes/0/.zarray"))["compressor"],
            (nlohmann::json{{"id", "zlib"}, {"level", 1}}));
  EXPECT_EQ(zarray["dimension_separator"], "/");
  // The zeros of the top-left 150 x 70 px fill chunks (0, 0) and (0, 1) of every channel.
  EXPECT_FALSE(fs::exists(dir + "/a.ome.zarr/0/1/0/0"));
  EXPECT_FALSE(fs::exists(dir + "/a.ome.zarr/0/1/0/1"));
  EXPECT_TRUE(fs::exists(dir + "/a.ome.zarr/0/1/0/2"));
  const auto label = nlohmann::json::parse(test::slurp(dir + "/a.ome.zarr/labels/classes/.zattrs"));
  EXPECT_EQ(label["image-label"]["colors"][1],
            (nlohmann::json{{"label-value", 1}, {"rgba", {230, 25, 75, 255}}}));
  EXPECT_EQ(label["image-label"]["properties"][2]["name"], "stroma");
  EXPECT_EQ(label["image-label"]["source"]["image"], "../../");
  EXPECT_EQ(nlohmann::json::parse(test::slurp(dir + "/a.ome.zarr/labels/.zattrs"))["labels"],
            (nlohmann::json{"classes"}));

  c.mpp.reset();
  writeStore(dir + "/b.ome.zarr", c, randomProbabilities(140, 300, 2, SampleType::kU8, 1),
             randomLabels(140, 300, SampleType::kU8, 3, 2));
  const auto pixels = nlohmann::json::parse(test::slurp(dir + "/b.ome.zarr/.zattrs"))["multiscales"][0];
  EXPECT_FALSE(pixels["axes"][1].contains("unit"));
  EXPECT_EQ(pixels["datasets"][1]["coordinateTransformations"][0]["scale"], (nlohmann::json{1.0, 2.0, 2.0}));
}

// Each array names its codec as numcodecs does: the TIFF outputs' defaults (probabilities zstd:1, labels
// zlib:1), else --compression mapped to zstd or zlib (lzw has no Zarr codec), or none.
TEST(ZarrWriter, ArraysNameTheirCompressor) {
  const std::string dir = test::scratchDir("zarr_compressors");
  const auto compressors = [&](const std::string& compression) {
    StoreCase c{"c", 130, 70, 2, SampleType::kF32, true, SampleType::kU8, false, 64, 0, {}, compression};
    const std::string store = dir + "/" + (compression.empty() ? "default" : compression) + ".ome.zarr";
    writeStore(store, c, randomProbabilities(70, 130, 2, SampleType::kF32, 1),
               randomLabels(70, 130, SampleType::kU8, 3, 2));
    return std::pair{nlohmann::json::parse(test::slurp(store + "/0/.zarray"))["compressor"],
                     nlohmann::json::parse(test::slurp(store + "/labels/classes/0/.zarray"))["compressor"]};
  };
  const nlohmann::json zstd1 = {{"id", "zstd"}, {"level", 1}}, zlib1 = {{"id", "zlib"}, {"level", 1}};
  EXPECT_EQ(compressors(""), std::pair(zstd1, zlib1));
  EXPECT_EQ(compressors("zstd:7").first, (nlohmann::json{{"id", "zstd"}, {"level", 7}}));
  EXPECT_EQ(compressors("deflate:11").second, (nlohmann::json{{"id", "zlib"}, {"level", 9}}));
  EXPECT_EQ(compressors("lzw"), std::pair(zlib1, zlib1));
  EXPECT_EQ(compressors("none"), std::pair(nlohmann::json(nullptr), nlohmann::json(nullptr)));
}

// Chunks are compressed on the pool but written in order: the same bytes from no pool, one thread or four,
// and from bands of any height.
TEST(ZarrWriter, BytesDoNotDependOnThreadsOrBands) {
  const std::string dir = test::scratchDir("zarr_threads");
  StoreCase c{"t", 410, 300, 3, SampleType::kF32, true, SampleType::kU8, true, 64, 0, 0.5, ""};
  const cv::Mat probs = randomProbabilities(c.height, c.width, 3, SampleType::kF32, 5);
  const cv::Mat labels = randomLabels(c.height, c.width, SampleType::kU8, 3, 6);
  writeStore(dir + "/none.zarr", c, probs, labels);
  c.threads = 1;
  writeStore(dir + "/one.zarr", c, probs, labels, 64);
  c.threads = 4;
  writeStore(dir + "/four.zarr", c, probs, labels, 1);
  const auto reference = filesUnder(dir + "/none.zarr");
  EXPECT_GT(reference.size(), 40u);
  EXPECT_TRUE(reference == filesUnder(dir + "/one.zarr"));
  EXPECT_TRUE(reference == filesUnder(dir + "/four.zarr"));
}

// Memory is rows of chunks, not the image: at most two rows per level (one filling, one compressing).
TEST(ZarrWriter, HoldsRowsOfChunksNotTheImage) {
  const std::string dir = test::scratchDir("zarr_memory");
  ZarrOptions o;
  o.chunk = 64;
  o.pyramid = true;
  o.probabilities = ZarrProbabilities{2, SampleType::kF32, {}, ""};
  o.pool = std::make_shared<WorkPool>(2);
  const int width = 1000, height = 3000;
  ZarrWriter writer(dir + "/m.zarr", width, height, o);
  const cv::Mat band(50, width, CV_32FC2, cv::Scalar(0.25, 0.75));
  const size_t row_of_chunks = size_t(64) * width * 2 * sizeof(float);
  size_t most = 0;
  for (int y = 0; y < height; y += band.rows) {
    writer.writeProbabilities(band);
    most = std::max(most, writer.bufferedBytes());
  }
  writer.finish();
  // Two rows at level 0, and at most as much again over the halves below it.
  EXPECT_LE(most, 4 * row_of_chunks);
  EXPECT_GE(most, row_of_chunks);
  EXPECT_LT(most, size_t(width) * height * 2 * sizeof(float) / 8);
}

// A writer destroyed before its store is complete, or failing mid-way, leaves neither the store nor its
// partial directory.
TEST(ZarrWriter, NothingLeftWhenAWriterDiesMidway) {
  const std::string dir = test::scratchDir("zarr_midway");
  StoreCase c{"m", 300, 300, 2, SampleType::kF32, true, SampleType::kU8, true, 64, 2, {}, ""};
  const cv::Mat probs = randomProbabilities(300, 300, 2, SampleType::kF32, 3);
  const cv::Mat labels = randomLabels(300, 300, SampleType::kU8, 3, 4);
  const std::string store = dir + "/s.ome.zarr";
  {
    ZarrWriter writer(store, 300, 300, optionsOf(c));
    writer.writeProbabilities(probs.rowRange(0, 200));
    writer.writeLabels(labels.rowRange(0, 200));
    EXPECT_TRUE(fs::exists(store + ".partial/0/0/0/2"));  // the first row of chunks is on disk
  }
  EXPECT_FALSE(fs::exists(store));
  EXPECT_FALSE(fs::exists(store + ".partial"));
  {
    ZarrWriter writer(store, 300, 300, optionsOf(c));
    writer.writeProbabilities(probs.rowRange(0, 100));
    writer.injectChunkFault();
    EXPECT_THROW(
        {
          writer.writeProbabilities(probs.rowRange(100, 300));
          writer.writeLabels(labels);
          writer.finish();
        },
        IoError);
    EXPECT_FALSE(fs::exists(store + ".partial"));
    EXPECT_THROW(writer.commit(), IoError);
  }
  EXPECT_FALSE(fs::exists(store));
  EXPECT_FALSE(fs::exists(store + ".partial"));
  // finish() refuses a store missing rows, and removes it.
  {
    ZarrWriter writer(store, 300, 300, optionsOf(c));
    writer.writeProbabilities(probs);
    EXPECT_THROW(writer.finish(), IoError);  // no labels given
    EXPECT_FALSE(fs::exists(store + ".partial"));
  }
}

// A symbolic link or a file at the store's name or its partial name is refused, and what it points to is
// left alone; a stale partial directory (a crashed run's) is replaced; commit never replaces a directory.
TEST(ZarrWriter, RefusesLinksAndNeverReplaces) {
  const std::string dir = test::scratchDir("zarr_links");
  StoreCase c{"l", 100, 80, 1, SampleType::kU8, true, SampleType::kU8, false, 64, 0, {}, ""};
  const std::string store = dir + "/s.ome.zarr";
  const std::string victim = dir + "/victim";
  fs::create_directories(victim);
  std::ofstream(victim + "/keep") << "x";
  for (const std::string& name : {store, store + ".partial"}) {
    fs::create_directory_symlink(victim, name);
    try {
      ZarrWriter writer(store, 100, 80, optionsOf(c));
      ADD_FAILURE() << "a link at '" << name << "' was not refused";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
    }
    fs::remove(name);
    EXPECT_EQ(fs::directory_iterator(victim)->path().filename(), "keep");
    std::ofstream(name) << "a file";
    EXPECT_THROW(ZarrWriter(store, 100, 80, optionsOf(c)), IoError) << name;
    fs::remove(name);
  }
  EXPECT_TRUE(fs::exists(victim + "/keep"));

  fs::create_directories(store + ".partial/0/0");
  std::ofstream(store + ".partial/0/0/stale") << "old";
  const cv::Mat probs = randomProbabilities(80, 100, 1, SampleType::kU8, 8);
  const cv::Mat labels = randomLabels(80, 100, SampleType::kU8, 3, 9);
  {
    ZarrWriter writer(store, 100, 80, optionsOf(c));
    writer.writeProbabilities(probs);
    writer.writeLabels(labels);
    writer.finish();
    fs::create_directory(store);  // appeared meanwhile: an empty directory rename(2) would replace
    EXPECT_THROW(writer.commit(), IoError);
  }
  EXPECT_TRUE(fs::is_empty(store));
  EXPECT_FALSE(fs::exists(store + ".partial"));
  fs::remove(store);
  writeStore(store, c, probs, labels);
  EXPECT_FALSE(fs::exists(store + "/0/0/stale"));
  EXPECT_TRUE(fs::exists(store + "/.zattrs"));
}

}  // namespace
}  // namespace tiler
