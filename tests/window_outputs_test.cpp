// Per-window outputs: features (HDF5, read back by h5dump; the tensor file, read back by LibTorch's and,
// where installed, Python's torch.load) and class scores (CSV, QuPath tiles, heatmap) in window order
// whatever order the vectors arrive in, level-0 coordinates, masked windows absent, the same bytes for any
// arrival order, and nothing left behind by an image that is not committed.
#include "tiler/writers/window_outputs.hpp"

#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// A 40x30 image of 10x10 windows without overlap (4 x 3), at `downsample` level-0 pixels per pixel.
CatalogImage image(const std::string& dir, double downsample = 1.0) {
  CatalogImage img;
  img.input = dir + "/slide.png";
  img.info.width = 40;
  img.info.height = 30;
  img.info.format = "png";
  img.info.levels = {{int64_t(40 * downsample), int64_t(30 * downsample), 1.0}};
  img.info.objective_power = 40.0;
  img.resolution.downsample = downsample;
  img.resolution.mpp = 0.25 * downsample;
  img.resolution.source_mpp = 0.25;
  img.grid = WindowGrid(40, 30, GridSpec{10, 10, 0.0, 0.0});
  img.outputs["features"] = dir + "/slide.h5";
  img.outputs["features_pt"] = dir + "/slide.pt";
  img.outputs["csv"] = dir + "/slide.csv";
  img.outputs["tiles"] = dir + "/slide_tiles.geojson";
  img.outputs["heatmap"] = dir + "/slide_heatmap.tif";
  return img;
}

// Window w's vector: dim values w * 100 + d.
std::vector<float> vectorOf(int64_t w, int64_t dim) {
  std::vector<float> v(static_cast<size_t>(dim));
  for (int64_t d = 0; d < dim; ++d) v[size_t(d)] = float(w * 100 + d);
  return v;
}

// Adds the planned windows of `img` in the order `order` gives (indices into its planned windows).
std::vector<std::string> writeAll(const CatalogImage& img, const WindowOutputOptions& o,
                                  const std::vector<int64_t>& order) {
  WindowOutputs out(img, o);
  for (int64_t k : order) {
    EXPECT_FALSE(out.done());
    out.add(img.gridWindow(k), vectorOf(img.gridWindow(k), o.dim).data());
  }
  EXPECT_TRUE(out.done());
  EXPECT_EQ(out.heldVectors(), 0u);
  return out.commit();
}

WindowOutputOptions embed(int64_t dim) {
  WindowOutputOptions o;
  o.kinds = {"features"};
  o.dim = dim;
  o.encoder = "tiny_encoder";
  return o;
}

TEST(WindowOutputs, ClassNamesWithoutClasses) {
  EXPECT_EQ(classNames(3, {})[2].name, "class_2");
}

TEST(WindowOutputs, FeaturesInWindowOrderWithLevelZeroCoordinates) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  const std::string dir = test::scratchDir("features");
  const CatalogImage img = image(dir, 4.0);
  std::vector<int64_t> order = test::inOrder(12);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  const auto paths = writeAll(img, embed(3), order);
  ASSERT_EQ(paths, std::vector<std::string>{dir + "/slide.h5"});
  EXPECT_FALSE(fs::exists(dir + "/slide.h5.partial"));
  const auto features = test::h5dumpValues(paths[0], "features"),
             coords = test::h5dumpValues(paths[0], "coords");
  ASSERT_EQ(features.size(), 36u);
  ASSERT_EQ(coords.size(), 24u);
  for (int64_t w = 0; w < 12; ++w) {
    EXPECT_EQ(features[size_t(w * 3 + 2)], double(w * 100 + 2)) << w;
    EXPECT_EQ(coords[size_t(w * 2)], double((w % 4) * 10 * 4)) << "level-0 x of window " << w;
    EXPECT_EQ(coords[size_t(w * 2 + 1)], double((w / 4) * 10 * 4)) << "level-0 y of window " << w;
  }
  auto r = test::runCommand("h5dump -H -A " + paths[0]);
  for (const char* attribute :
       {"patch_size", "patch_size_level0", "level0_magnification", "target_magnification", "mpp", "overlap",
        "level0_width", "level0_height", "name", "encoder"})
    EXPECT_NE(r.output.find("ATTRIBUTE \"" + std::string(attribute) + "\""), std::string::npos) << attribute;
  EXPECT_NE(r.output.find("H5T_IEEE_F32LE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("H5T_STD_I64LE"), std::string::npos) << r.output;
  r = test::runCommand("h5dump -a /coords/patch_size_level0 -a /coords/encoder -a /target_magnification " +
                       paths[0]);
  EXPECT_NE(r.output.find("(0): 40"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"tiny_encoder\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(0): 10"), std::string::npos) << "40x at 4 level-0 pixels per pixel\n" << r.output;
  // TRIDENT reads the encoder and the slide's name on the features dataset too.
  r = test::runCommand("h5dump -a /features/encoder -a /features/name " + paths[0]);
  EXPECT_NE(r.output.find("\"tiny_encoder\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"slide\""), std::string::npos) << r.output;
  removeTree(dir);
}

// An image that says neither its µm/px nor its objective power: the attributes TRIDENT's reader indexes are
// still there, NaN (unknown), on the file and on coords.
TEST(WindowOutputs, UnknownResolutionAttributesAreNaNNotMissing) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  const std::string dir = test::scratchDir("features_unknown");
  CatalogImage img = image(dir);
  img.info.objective_power.reset();
  img.resolution.mpp.reset();
  img.resolution.source_mpp.reset();
  const auto paths = writeAll(img, embed(2), test::inOrder(12));
  for (const std::string where : {"/", "/coords/"})
    for (const char* attribute : {"mpp", "level0_mpp", "level0_magnification", "target_magnification"}) {
      const auto r = test::runCommand("h5dump -a " + where + attribute + " " + paths[0]);
      EXPECT_EQ(r.code, 0) << where << attribute << ": " << r.output;
      EXPECT_NE(r.output.find("H5T_IEEE_F64LE"), std::string::npos) << where << attribute << ": " << r.output;
      EXPECT_NE(r.output.find("(0): nan"), std::string::npos) << where << attribute << ": " << r.output;
    }
  removeTree(dir);
}

TEST(WindowOutputs, TheSameVectorsInAnyOrderGiveTheSameBytes) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  // Several chunks (a chunk holds 16 rows at least): 3 x 40 windows of 20 features.
  const std::string dir = test::scratchDir("features_bytes");
  CatalogImage img = image(dir);
  img.grid = WindowGrid(400, 30, GridSpec{10, 10, 0.0, 0.0});
  std::string first;
  for (unsigned seed : {0u, 1u, 2u}) {
    std::vector<int64_t> order = test::inOrder(img.plannedWindows());
    if (seed) std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    writeAll(img, embed(20), order);
    const std::string bytes = test::slurp(dir + "/slide.h5");
    if (seed == 0) first = bytes;
    EXPECT_EQ(bytes, first) << "arrival order " << seed << " changed the file";
    fs::remove(dir + "/slide.h5");
  }
  EXPECT_EQ(test::h5dumpValues(
                [&] {
                  writeAll(img, embed(20), test::inOrder(img.plannedWindows()));
                  return dir + "/slide.h5";
                }(),
                "coords")
                .size(),
            size_t(img.plannedWindows() * 2));
  removeTree(dir);
}

// The tensor file as LibTorch's own reader (torch::jit::pickle_load, which reads what Python's torch.save
// writes) sees it.
torch::Tensor loadTensorFile(const std::string& path) {
  const std::string bytes = test::slurp(path);
  return torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toTensor();
}

// CLAM's pt_files/<slide>.pt: one float32 tensor (N, D) in window order, which torch.load reads; the same
// bytes whatever order the rows arrive in, and no scratch file left.
TEST(WindowOutputs, FeaturesPtIsATensorThatTorchLoadReads) {
  const std::string dir = test::scratchDir("features_pt");
  const CatalogImage img = image(dir, 4.0);
  WindowOutputOptions o = embed(3);
  o.kinds = {"features_pt"};
  std::vector<int64_t> order = test::inOrder(12);
  std::shuffle(order.begin(), order.end(), std::mt19937(11));
  EXPECT_EQ(writeAll(img, o, order), std::vector<std::string>{dir + "/slide.pt"});
  EXPECT_FALSE(fs::exists(dir + "/slide.h5")) << "only what --save names";
  const std::vector<std::string> left = {"slide.pt"};
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  EXPECT_EQ(files, left) << "the scratch rows are removed";
  const torch::Tensor t = loadTensorFile(dir + "/slide.pt");
  EXPECT_EQ(t.scalar_type(), torch::kFloat32);
  ASSERT_EQ(t.sizes(), (std::vector<int64_t>{12, 3}));
  EXPECT_TRUE(t.is_contiguous());
  for (int64_t w = 0; w < 12; ++w)
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(t[w][d].item<float>(), float(w * 100 + d)) << w << "," << d;
  const std::string first = test::slurp(dir + "/slide.pt");
  fs::remove(dir + "/slide.pt");
  writeAll(img, o, test::inOrder(12));
  EXPECT_TRUE(test::slurp(dir + "/slide.pt") == first) << "the same bytes for any arrival order";
  if (test::runCommand("/usr/bin/python3 -c 'import torch'").code == 0) {
    // Python's own reader, with weights_only where this torch has it (the default from 2.6).
    const auto py = test::runCommand(
        "/usr/bin/python3 -c \"import torch, inspect; f = '" + dir +
        "/slide.pt'; w = 'weights_only' in inspect.signature(torch.load).parameters; "
        "t = torch.load(f, weights_only=True) if w else torch.load(f); print(tuple(t.shape), t.dtype, "
        "float(t[7, 2]), float(t.sum()))\" 2>&1");
    EXPECT_NE(py.output.find("(12, 3) torch.float32 702.0 19836.0"), std::string::npos) << py.output;
  }
  removeTree(dir);
}

// Sizes whose pickled integers take Python's one-, two- and four-byte encodings (eight would need 2^31
// values), and an image with no window at all: (0, D).
TEST(WindowOutputs, FeaturesPtHoldsAnyRowCountAndWidth) {
  const std::string dir = test::scratchDir("features_pt_sizes");
  CatalogImage img = image(dir);
  img.masked = true;
  img.kept = {};
  WindowOutputOptions o = embed(300);
  o.kinds = {"features_pt"};
  writeAll(img, o, {});
  EXPECT_EQ(loadTensorFile(dir + "/slide.pt").sizes(), (std::vector<int64_t>{0, 300}));
  fs::remove(dir + "/slide.pt");
  img.kept = {4};
  o.dim = 70000;  // numel 70000: past two bytes
  writeAll(img, o, {0});
  const torch::Tensor wide = loadTensorFile(dir + "/slide.pt");
  ASSERT_EQ(wide.sizes(), (std::vector<int64_t>{1, 70000}));
  EXPECT_EQ(wide[0][69999].item<float>(), float(4 * 100 + 69999));
  removeTree(dir);
}

// An image of `o`'s outputs given one window of 12: `partial` exists while it is written, commit() fails, and
// nothing is left in `dir` once the writer is gone.
void expectAnUncommittedImageLeavesNothing(const CatalogImage& img, const WindowOutputOptions& o,
                                           const std::string& dir, const std::string& partial) {
  {
    WindowOutputs out(img, o);
    out.add(0, vectorOf(0, o.dim).data());
    EXPECT_TRUE(fs::exists(dir + partial)) << partial;
    EXPECT_THROW(out.commit(), IoError) << "11 windows missing";
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "nothing left behind";
}

// A failed image leaves neither the archive nor its scratch rows; a link planted at either partial name is
// replaced by a file of its own, never written through.
TEST(WindowOutputs, FeaturesPtLeavesNothingWhenNotCommitted) {
  const std::string dir = test::scratchDir("features_pt_fail");
  const CatalogImage img = image(dir);
  WindowOutputOptions o = embed(2);
  o.kinds = {"features_pt"};
  expectAnUncommittedImageLeavesNothing(img, o, dir, "/slide.pt.rows.partial");
  std::ofstream(dir + "/victim") << "precious";
  for (const char* planted : {"/slide.pt.partial", "/slide.pt.rows.partial"})
    fs::create_symlink(dir + "/victim", dir + planted);
  writeAll(img, o, test::inOrder(12));
  EXPECT_EQ(test::slurp(dir + "/victim"), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir + "/slide.pt")));
  EXPECT_EQ(loadTensorFile(dir + "/slide.pt").size(0), 12);
  removeTree(dir);
}

TEST(WindowOutputs, MaskedWindowsAreAbsentAndAnEmptyImageGivesAnEmptyFile) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  const std::string dir = test::scratchDir("features_masked");
  CatalogImage img = image(dir);
  img.masked = true;
  img.kept = {1, 6, 11};
  writeAll(img, embed(2), {2, 0, 1});
  EXPECT_EQ(test::h5dumpValues(dir + "/slide.h5", "features"),
            (std::vector<double>{100, 101, 600, 601, 1100, 1101}));
  EXPECT_EQ(test::h5dumpValues(dir + "/slide.h5", "coords"), (std::vector<double>{10, 0, 20, 10, 30, 20}));
  fs::remove(dir + "/slide.h5");
  img.kept.clear();
  writeAll(img, embed(2), {});
  auto r = test::runCommand("h5dump -H " + dir + "/slide.h5");
  EXPECT_NE(r.output.find("( 0, 2 ) / ( H5S_UNLIMITED, 2 )"), std::string::npos) << r.output;
  removeTree(dir);
}

TEST(WindowOutputs, AnImageNotCommittedLeavesNothingAndAPlantedLinkIsRefused) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  const std::string dir = test::scratchDir("features_fail");
  const CatalogImage img = image(dir);
  WindowOutputOptions o = embed(2);
  o.kinds = {"features"};
  expectAnUncommittedImageLeavesNothing(img, o, dir, "/slide.h5.partial");
  std::ofstream(dir + "/victim") << "precious";
  fs::create_symlink(dir + "/victim", dir + "/slide.h5.partial");
  EXPECT_THROW(WindowOutputs(img, o), IoError);
  EXPECT_EQ(test::slurp(dir + "/victim"), "precious");
  removeTree(dir);
}

TEST(WindowOutputs, ClassScoresAsCsvQuPathTilesAndAHeatmap) {
  const std::string dir = test::scratchDir("classify");
  CatalogImage img = image(dir, 2.0);
  img.masked = true;
  img.kept = {0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11};  // window 4 (column 0, row 1) masked out
  WindowOutputOptions o;
  o.class_scores = true;
  o.kinds = {"csv", "tiles", "heatmap"};
  o.dim = 2;
  o.classes = parseClasses("stroma,tumor:#ff0000");
  std::vector<int64_t> order = test::inOrder(img.plannedWindows());
  std::reverse(order.begin(), order.end());
  const auto paths = writeAll(img, o, order);
  EXPECT_EQ(paths.size(), 3u);
  // CSV: WSInfer's columns, level-0 pixels, one row per window in order.
  std::istringstream csv(test::slurp(dir + "/slide.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "minx,miny,width,height,prob_stroma,prob_tumor");
  std::getline(csv, line);
  EXPECT_EQ(line, "0,0,20,20,0,1");
  std::getline(csv, line);
  EXPECT_EQ(line, "20,0,20,20,100,101");
  int rows = 2;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 11);
  // QuPath tiles: argmax class (tumor: 101 > 100), its colour, every probability as a measurement.
  const auto tiles = nlohmann::json::parse(test::slurp(dir + "/slide_tiles.geojson"));
  ASSERT_EQ(tiles["features"].size(), 11u);
  const auto& t = tiles["features"][4];  // window 5: column 1, row 1
  EXPECT_EQ(t["properties"]["objectType"], "tile");
  EXPECT_EQ(t["properties"]["classification"]["name"], "tumor");
  EXPECT_EQ(t["properties"]["classification"]["color"], (nlohmann::json{255, 0, 0}));
  EXPECT_EQ(t["properties"]["measurements"]["prob_stroma"], 500);
  EXPECT_EQ(t["geometry"]["coordinates"][0][2], (nlohmann::json{40, 40}));
  // Heatmap: a pixel per window, the scores as bands, NaN (GDAL's nodata) where no window ran.
  auto reader = ImageReader::open(dir + "/slide_heatmap.tif");
  EXPECT_EQ(reader->info().width, 4);
  EXPECT_EQ(reader->info().height, 3);
  EXPECT_EQ(reader->info().channels, 2);
  ASSERT_TRUE(reader->info().nodata.has_value());
  EXPECT_TRUE(std::isnan(*reader->info().nodata));
  cv::Mat heat = reader->readRegion(Rect{0, 0, 4, 3});
  EXPECT_EQ(heat.at<cv::Vec2f>(2, 3)[1], 1101.f);
  EXPECT_TRUE(std::isnan(heat.at<cv::Vec2f>(1, 0)[0])) << "the masked window";
  ASSERT_TRUE(reader->info().mpp.has_value());
  EXPECT_NEAR(*reader->info().mpp, 0.5 * 10, 1e-9) << "a pixel spans a stride of 10 pixels of 0.5 um";
  removeTree(dir);
}

// Six classes (a heatmap of more than cv::Scalar's four channels), names a CSV must quote, no colours given,
// a NaN score, and a slide that states only its µm/px.
TEST(WindowOutputs, ManyClassesQuotedNamesDistinctColoursAndNaN) {
  const std::string dir = test::scratchDir("classify_six");
  CatalogImage img = image(dir);
  WindowOutputOptions o;
  o.class_scores = true;
  o.kinds = {"csv", "tiles", "heatmap"};
  o.dim = 6;
  o.classes = parseClasses("a,\"b\",c,d,e,f");
  {
    WindowOutputs out(img, o);
    for (int64_t w = 0; w < img.plannedWindows(); ++w) {
      std::vector<float> v = vectorOf(w, o.dim);
      if (w == 1) v[2] = std::numeric_limits<float>::quiet_NaN();
      if (w == 2) std::fill(v.begin(), v.end(), std::numeric_limits<float>::quiet_NaN());
      out.add(w, v.data());
    }
    out.commit();
  }
  std::istringstream csv(test::slurp(dir + "/slide.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "minx,miny,width,height,prob_a,\"prob_\"\"b\"\"\",prob_c,prob_d,prob_e,prob_f");
  const auto tiles = nlohmann::json::parse(test::slurp(dir + "/slide_tiles.geojson"));
  std::set<std::vector<int>> colours;
  for (const auto& t : tiles["features"])
    if (t["properties"].contains("classification"))
      colours.insert(t["properties"]["classification"]["color"]);
  EXPECT_EQ(colours.size(), 1u) << "every window's argmax is class f";
  // Every score NaN: no class wins, none is named (the last class did), as for an object's class means.
  EXPECT_FALSE(tiles["features"][2]["properties"].contains("classification")) << tiles["features"][2].dump();
  EXPECT_TRUE(tiles["features"][2]["properties"]["measurements"].empty());
  EXPECT_NE(*colours.begin(), (std::vector<int>{0, 0, 0})) << "a classifier's classes are never black";
  const auto& m = tiles["features"][1]["properties"]["measurements"];
  EXPECT_FALSE(m.contains("prob_c")) << "a NaN score is left out (QuPath reads it as NaN)";
  EXPECT_EQ(m["prob_d"], 103);
  std::set<std::array<uint8_t, 3>> distinct;
  for (const auto& c : classNames(6, {})) distinct.insert(c.color);
  EXPECT_EQ(distinct.size(), 6u);
  auto reader = ImageReader::open(dir + "/slide_heatmap.tif");
  EXPECT_EQ(reader->info().channels, 6);
  cv::Mat heat = reader->readRegion(Rect{0, 0, 4, 3});
  EXPECT_EQ(heat.ptr<float>(0)[5], 5.f);
  EXPECT_TRUE(std::isnan(heat.ptr<float>(0)[6 + 2]));
  EXPECT_EQ(heat.ptr<float>(2)[3 * 6 + 5], 1105.f);
  removeTree(dir);
}

// WSInfer's results layout: model-outputs-csv/<stem>.csv with run_inference.py's columns, windows column by
// column (itertools.product of x, then y), values as pandas writes float64;
// model-outputs-geojson/<stem>.geojson as write_geojson.py's json.dump writes it.
// tests/data/wsinfer/tils_purple_head.csv is the head of WSInfer's own reference output of the TILs model
// (SBU-BMI/wsinfer tests/reference/).
TEST(WindowOutputs, WsinferLayoutIsWsinfersColumnsOrderAndGeojson) {
  const std::string dir = test::scratchDir("classify_wsinfer");
  CatalogImage img = image(dir, 2.0);
  img.masked = true;
  img.kept = {0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11};  // window 4 (column 0, row 1) masked out
  img.outputs = {{"wsinfer_csv", dir + "/model-outputs-csv/slide.csv"},
                 {"wsinfer_geojson", dir + "/model-outputs-geojson/slide.geojson"}};
  WindowOutputOptions o;
  o.class_scores = true;
  o.kinds = {"wsinfer_csv", "wsinfer_geojson"};
  o.dim = 2;
  o.classes = parseClasses("Other,Lymphocytes");
  const auto commitIn = [&](const std::vector<int64_t>& order) {
    WindowOutputs out(img, o);
    for (int64_t k : order) {
      std::vector<float> v = vectorOf(img.gridWindow(k), 2);
      if (img.gridWindow(k) == 1) v = {1.0f, 3.4273725e-12f};
      if (img.gridWindow(k) == 2) v = {0.1f, std::numeric_limits<float>::quiet_NaN()};
      out.add(img.gridWindow(k), v.data());
    }
    return out.commit();
  };
  std::vector<int64_t> order = test::inOrder(img.plannedWindows());
  EXPECT_EQ(commitIn(order).size(), 2u);
  const std::string csv_text = test::slurp(dir + "/model-outputs-csv/slide.csv");
  std::istringstream csv(csv_text);
  std::string line;
  std::getline(csv, line);
  std::string wsinfer_header;
  std::getline(std::istringstream(test::slurp(std::string(TILER_TEST_SOURCE_DIR) +
                                              "/tests/data/wsinfer/tils_purple_head.csv")),
               wsinfer_header);
  EXPECT_EQ(line, wsinfer_header) << "WSInfer's own header for the TILs model's classes";
  std::vector<std::string> rows;
  while (std::getline(csv, line)) rows.push_back(line);
  ASSERT_EQ(rows.size(), 11u);
  // Column 0 top to bottom (its row 1 masked), then column 1: level-0 pixels (downsample 2).
  EXPECT_EQ(rows[0], "0,0,20,20,0.0,1.0");
  EXPECT_EQ(rows[1], "0,40,20,20,800.0,801.0");
  EXPECT_EQ(rows[2], "20,0,20,20,1.0,3.4273725350864037e-12") << "a float32 score widened, as pandas";
  EXPECT_EQ(rows[3], "20,20,20,20,500.0,501.0");
  EXPECT_EQ(rows[5], "40,0,20,20,0.10000000149011612,") << "NaN: an empty field, as pandas";
  EXPECT_EQ(rows[10], "60,40,20,20,1100.0,1101.0");
  // write_geojson.py's features, in the CSV's order.
  const std::string geojson_bytes = test::slurp(dir + "/model-outputs-geojson/slide.geojson");
  std::string geojson_text = geojson_bytes;
  EXPECT_EQ(
      geojson_text.rfind(R"({"type": "FeatureCollection", "features": [{"type": "Feature", "id": ")", 0), 0u)
      << geojson_text.substr(0, 200);
  EXPECT_NE(
      geojson_text.find(R"("geometry": {"type": "Polygon", "coordinates": [[[40.0, 0.0], [40.0, 20.0], )"
                        R"([20.0, 20.0], [20.0, 0.0], [40.0, 0.0]]]}, "properties": {"isLocked": true, )"
                        R"("measurements": {"prob_Other": 1.0, "prob_Lymphocytes": 3.4273725350864037e-12}, )"
                        R"("objectType": "tile"}})"),
      std::string::npos)
      << geojson_text;
  EXPECT_NE(geojson_text.find(R"("prob_Lymphocytes": NaN})"), std::string::npos) << "json.dump's NaN";
  // json.dump's NaN is no JSON: read the rest with it as null.
  for (size_t at; (at = geojson_text.find("NaN")) != std::string::npos;) geojson_text.replace(at, 3, "null");
  const auto geojson = nlohmann::json::parse(geojson_text);
  ASSERT_EQ(geojson["features"].size(), 11u);
  std::set<std::string> ids;
  for (size_t i = 0; i < 11; ++i) {
    const auto& f = geojson["features"][i];
    std::vector<std::string> keys, properties;
    for (const auto& [key, value] : f.items()) keys.push_back(key);
    EXPECT_EQ(keys, (std::vector<std::string>{"geometry", "id", "properties", "type"}));
    const std::string id = f["id"];
    EXPECT_EQ(id.size(), 36u);
    EXPECT_EQ(id[14], '8') << "an RFC 9562 version 8 UUID: " << id;
    ids.insert(id);
    const auto& ring = f["geometry"]["coordinates"][0];
    std::istringstream row(rows[i]);
    std::string field;
    std::vector<double> box;
    for (int n = 0; n < 4 && std::getline(row, field, ','); ++n) box.push_back(std::stod(field));
    const double minx = box[0], miny = box[1], maxx = box[0] + box[2], maxy = box[1] + box[3];
    EXPECT_EQ(ring, (nlohmann::json{{maxx, miny}, {maxx, maxy}, {minx, maxy}, {minx, miny}, {maxx, miny}}));
    EXPECT_EQ(f["properties"]["objectType"], "tile");
    EXPECT_EQ(f["properties"]["isLocked"], true);
    EXPECT_FALSE(f["properties"].contains("classification")) << "WSInfer names no class a tile";
  }
  EXPECT_EQ(ids.size(), 11u);
  // Any arrival order, the same bytes (the ids too).
  std::reverse(order.begin(), order.end());
  commitIn(order);
  EXPECT_EQ(test::slurp(dir + "/model-outputs-csv/slide.csv"), csv_text);
  EXPECT_EQ(test::slurp(dir + "/model-outputs-geojson/slide.geojson"), geojson_bytes);
  removeTree(dir);
}

TEST(WindowOutputs, MagnificationFromMicronsPerPixel) {
  CatalogImage img = image("/nonexistent");
  EXPECT_EQ(level0Magnification(img), 40.0) << "the slide's own power first";
  img.info.objective_power.reset();
  for (const auto& [mpp, power] :
       {std::pair{0.25, 40.0}, {0.5, 20.0}, {1.0, 10.0}, {0.12, 80.0}, {2.0, 5.0}}) {
    img.resolution.source_mpp = mpp;
    EXPECT_EQ(level0Magnification(img), power) << mpp;
  }
  img.resolution.source_mpp = 8.0;
  EXPECT_FALSE(level0Magnification(img).has_value());
  img.resolution.source_mpp.reset();
  EXPECT_FALSE(level0Magnification(img).has_value());
}

TEST(WindowOutputs, NamedClassesMustMatchTheScores) {
  const std::string dir = test::scratchDir("classify_names");
  WindowOutputOptions o;
  o.class_scores = true;
  o.kinds = {"csv"};
  o.dim = 3;
  o.classes = parseClasses("a,b");
  EXPECT_THROW(WindowOutputs(image(dir), o), ConfigError);
  removeTree(dir);
}

}  // namespace
}  // namespace tiler

namespace tiler {
namespace {

// A 40x30 image of 16x16 windows at stride 8 (overlap 0.5: starts 0, 8, 16, 24 by 0, 8, 14), level 0 at twice
// its pixels, whose windows all see one box: the object at image (20, 13)-(24, 17), centre (22, 15).
TEST(WindowOutputs, EachBoxIsKeptByTheWindowWhoseCoreHoldsItsCentre) {
  const std::string dir = test::scratchDir("detect_core");
  CatalogImage img = image(dir, 2.0);
  img.grid = WindowGrid(40, 30, GridSpec{16, 16, 0.5, 0.5});
  img.outputs["objects_csv"] = dir + "/slide_objects.csv";
  ASSERT_EQ(img.grid.startsX(), (std::vector<int64_t>{0, 8, 16, 24}));
  ASSERT_EQ(img.grid.startsY(), (std::vector<int64_t>{0, 8, 14}));
  WindowOutputOptions o;
  o.boxes = true;
  o.kinds = {"objects_csv"};
  o.dim = 12;  // two boxes a window: the object where the window sees it, and padding
  for (int pass = 0; pass < 3; ++pass) {
    WindowOutputs out(img, o);
    // In any arrival order (the second pass backwards), and as the records the ranks that ran the windows
    // send (the third, backwards): the same rows.
    int64_t kept = 0;
    for (int64_t k = 0; k < img.grid.count(); ++k) {
      const int64_t w = pass == 0 ? k : img.grid.count() - 1 - k;
      const Rect r = img.grid.imageWindow(w);
      const float x = float(20 - r.x), y = float(13 - r.y);
      const std::vector<float> boxes = {x, y, x + 4, y + 4, 0.75f, 3, 0, 0, 0, 0, 0, 0};
      if (pass < 2) {
        out.add(w, boxes.data());
        continue;
      }
      // A record holds the boxes its window keeps, and nothing of the padding.
      const std::string record = detectionRecord(img, o, w, boxes.data());
      kept += int64_t(record.size() / (6 * sizeof(float)));
      out.addRecord(w, record);
    }
    if (pass == 2) {
      EXPECT_EQ(kept, 1);
    }
    out.commit();
    // Centre x 22: columns' centres 8, 16, 24, 32, cores split at 12, 20, 28: column 2. Centre y 15: rows'
    // centres 8, 16, 22, split at 12 and 19: row 1. Written once, in level-0 pixels.
    EXPECT_EQ(test::slurp(dir + "/slide_objects.csv"),
              "id,class,score,x1,y1,x2,y2\n1,class_3,0.75,40,26,48,34\n");
    EXPECT_EQ(out.objects(), (std::array<int64_t, 2>{1, 0}));
    fs::remove(dir + "/slide_objects.csv");
  }
  // A centre on a split (x 20: columns 1 and 2 halve there) goes to the later window, once.
  WindowOutputs out(img, o);
  for (int64_t w = 0; w < img.grid.count(); ++w) {
    const Rect r = img.grid.imageWindow(w);
    const std::vector<float> boxes = {
        float(18 - r.x), float(13 - r.y), float(22 - r.x), float(17 - r.y), 1, 0, 0, 0, 0, 0, 0, 0};
    out.add(w, boxes.data());
  }
  out.commit();
  EXPECT_EQ(out.objects(), (std::array<int64_t, 2>{1, 0}));
}

// A box larger than the overlap, seen cut by each window that sees it: the parts its windows keep (their
// centres in their cores) chain across the windows, where they overlap in the region both windows see, and
// are written as one box, their union, never counted as cut.
TEST(WindowOutputs, ABoxCutByWindowEdgesIsMergedFromItsParts) {
  const std::string dir = test::scratchDir("detect_cut");
  CatalogImage img = image(dir, 2.0);
  img.grid = WindowGrid(40, 30, GridSpec{16, 16, 0.5, 0.5});
  img.outputs["objects_csv"] = dir + "/slide_objects.csv";
  WindowOutputOptions o;
  o.boxes = true;
  o.kinds = {"objects_csv"};
  o.dim = 12;
  for (bool backwards : {false, true}) {
    WindowOutputs out(img, o);
    int64_t kept = 0;
    for (int64_t k = 0; k < img.grid.count(); ++k) {
      const int64_t w = backwards ? img.grid.count() - 1 - k : k;
      const Rect r = img.grid.imageWindow(w);
      // The object [5, 35) x [12, 16) as the window sees it (clipped to it), a second box apart from it.
      const float x1 = std::max(5.0f - float(r.x), 0.0f), x2 = std::min(35.0f - float(r.x), 16.0f);
      const float y1 = std::max(12.0f - float(r.y), 0.0f), y2 = std::min(16.0f - float(r.y), 16.0f);
      std::vector<float> boxes(12, 0.0f);
      if (x1 < x2 && y1 < y2) boxes = {x1, y1, x2, y2, 0.5f + 0.01f * float(w), 1, 0, 0, 0, 0, 0, 0};
      const std::string record = detectionRecord(img, o, w, boxes.data());
      kept += int64_t(record.size() / (6 * sizeof(float)));
      out.addRecord(w, record);
    }
    EXPECT_EQ(kept, 4);  // the four columns of grid row 1
    out.commit();
    // Level 0 at twice the pixels; the highest score of its parts (window 7).
    EXPECT_EQ(test::slurp(dir + "/slide_objects.csv"),
              "id,class,score,x1,y1,x2,y2\n1,class_1,0.57,10,24,70,32\n");
    EXPECT_EQ(out.objects(), (std::array<int64_t, 2>{1, 0}));
    fs::remove(dir + "/slide_objects.csv");
  }
}

// One box a window, written as GeoJSON.
WindowOutputOptions oneBoxAWindow() {
  WindowOutputOptions o;
  o.boxes = true;
  o.kinds = {"objects"};
  o.dim = 6;
  return o;
}

TEST(WindowOutputs, ARecordOfBoxesIsCheckedLikeTheBoxes) {
  const std::string dir = test::scratchDir("detect_record");
  CatalogImage img = image(dir);
  img.outputs["objects"] = dir + "/slide_objects.geojson";
  WindowOutputOptions o = oneBoxAWindow();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> swapped = {5, 5, 2, 8, 1, 0}, padding = {nan, 1, 2, 3, 0, 0};
  try {
    detectionRecord(img, o, 0, swapped.data());
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("window 0 (column 0, row 0), box 0 of 1: x2 < x1"), std::string::npos)
        << e.message();
  }
  // Padding is no box, and what it holds is no value of the image: neither sent nor counted as not finite.
  const std::string record = detectionRecord(img, o, 0, padding.data());
  EXPECT_EQ(record.size(), 0u);
  WindowOutputs out(img, o);
  out.addRecord(0, record);
  EXPECT_EQ(out.nonFiniteValues(), 0);
  EXPECT_THROW(out.addRecord(1, record + "abc"), IoError);
  o.kinds = {"features_pt"};
  o.boxes = false;
  img.outputs["features_pt"] = dir + "/slide.pt";
  WindowOutputs vectors(img, o);
  EXPECT_THROW(vectors.addRecord(0, record), IoError);  // a record is for boxes only
}

TEST(WindowOutputs, ABoxThatIsNoBoxFailsTheImageAndLeavesNothing) {
  const std::string dir = test::scratchDir("detect_bad");
  CatalogImage img = image(dir);
  img.outputs["objects"] = dir + "/slide_objects.geojson";
  WindowOutputOptions o = oneBoxAWindow();
  o.classes = {{"tumour", {255, 0, 0}, true}};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<std::vector<float>, std::string>> bad = {
      {{5, 5, 2, 8, 1, 0}, "x2 < x1 or y2 < y1 (5, 5, 2, 8)"},
      {{1, 1, 2, 2, nan, 0}, "its score is not a number"},
      {{1, nan, 2, 2, 1, 0}, "a coordinate or its score is not finite"},
      {{1, 1, 2, 2, 1, 1}, "class 1 is not one of the 1 --classes"},
      {{1, 1, 2, 2, 1, 0.5f}, "class 0.5 is not one of the 1 --classes"},
  };
  for (const auto& [box, message] : bad) {
    try {
      WindowOutputs out(img, o);
      out.add(0, box.data());
      ADD_FAILURE() << message << ": no error";
    } catch (const IoError& e) {
      EXPECT_NE(e.message().find("slide.png': window 0 (column 0, row 0), box 0 of 1: " + message),
                std::string::npos)
          << e.message();
    }
    EXPECT_FALSE(fs::exists(dir + "/slide_objects.geojson.partial"));
  }
  // Padding (a score of 0 or less, whatever its coordinates) is no box.
  WindowOutputs out(img, o);
  const std::vector<float> padding = {9, 9, 1, 1, 0, 7};
  for (int64_t w = 0; w < img.grid.count(); ++w) out.add(w, padding.data());
  out.commit();
  EXPECT_EQ(out.objects(), (std::array<int64_t, 2>{0, 0}));
  EXPECT_EQ(nlohmann::json::parse(test::slurp(dir + "/slide_objects.geojson"))["features"].size(), 0u);
}

// The boxes written (CSV rows without the header) when window w of image() gives boxes[w] (image pixels,
// x1, y1, x2, y2, score, class; one box a window at most), with NMS at `iou`.
std::string nmsRun(const std::map<int64_t, std::array<float, 6>>& boxes, double iou) {
  const std::string dir = test::scratchDir("detect_nms");
  CatalogImage img = image(dir);
  img.outputs["objects_csv"] = dir + "/slide_objects.csv";
  fs::remove(img.outputs["objects_csv"]);
  WindowOutputOptions o;
  o.boxes = true;
  o.kinds = {"objects_csv"};
  o.dim = 6;
  o.nms_iou = iou;
  {
    WindowOutputs out(img, o);
    for (int64_t w = 0; w < img.grid.count(); ++w) {
      std::array<float, 6> box{0, 0, 0, 0, 0, 0};
      if (auto it = boxes.find(w); it != boxes.end()) {
        const Rect r = img.grid.imageWindow(w);
        box = it->second;
        for (int i : {0, 2}) box[size_t(i)] -= float(r.x);
        for (int i : {1, 3}) box[size_t(i)] -= float(r.y);
      }
      out.add(w, box.data());
    }
    out.commit();
  }
  const std::string csv = test::slurp(img.outputs["objects_csv"]);
  return csv.substr(csv.find('\n') + 1);
}

// Across windows, NMS drops a box that a box of its class overlapping it beyond the IoU outscores (ties: the
// earlier), suppressed or not itself, whichever grid row either is in; rows stay in window order.
TEST(WindowOutputs, NonMaximumSuppressionAcrossWindowsIsARuleOfPairs) {
  // A (window 0) and B (window 1) overlap by an IoU of 0.6; C (window 4, the next row) overlaps A by 0.25
  // and B by 0.18.
  const std::array<float, 6> a{4, 2, 12, 9, 0.9f, 0}, b{6, 2, 14, 9, 0.8f, 0}, c{4, 6, 12, 14, 0.95f, 0};
  EXPECT_EQ(nmsRun({{0, a}, {1, b}}, 0), "1,class_0,0.9,4,2,12,9\n2,class_0,0.8,6,2,14,9\n");
  EXPECT_EQ(nmsRun({{0, a}, {1, b}}, 0.5), "1,class_0,0.9,4,2,12,9\n");
  EXPECT_EQ(nmsRun({{0, a}, {1, b}}, 0.7), "1,class_0,0.9,4,2,12,9\n2,class_0,0.8,6,2,14,9\n");
  auto other = b;
  other[5] = 1;
  EXPECT_EQ(nmsRun({{0, a}, {1, other}}, 0.5), "1,class_0,0.9,4,2,12,9\n2,class_1,0.8,6,2,14,9\n");
  auto tie = b;
  tie[4] = 0.9f;
  EXPECT_EQ(nmsRun({{0, a}, {1, tie}}, 0.5), "1,class_0,0.9,4,2,12,9\n") << "an equal score: the earlier";
  // C, a row later, outscores A; A, suppressed, still outscores B.
  EXPECT_EQ(nmsRun({{0, a}, {1, b}, {4, c}}, 0.2), "1,class_0,0.95,4,6,12,14\n");
}

// The boxes of a detect run's CSV (the header left out), each line as written.
std::vector<std::string> csvRows(const std::string& path) {
  std::istringstream in(test::slurp(path));
  std::vector<std::string> rows;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) rows.push_back(line);
  return rows;
}

// A CSV row's fields.
std::vector<std::string> fieldsOf(const std::string& row) {
  std::vector<std::string> f;
  std::stringstream in(row);
  for (std::string v; std::getline(in, v, ',');) f.push_back(v);
  return f;
}

// Random boxes over a grid of 20 px windows without overlap (so a box whose centre lies inside a window is
// that window's): whole grid rows without any, windows with none or up to a dozen, sides from under a pixel
// to past the image (clipped: a share `giant` of them; a share `large` across grid rows), scores on a coarse
// scale (ties), three classes. `rows` receives each box's grid row, in window order.
struct RandomDetections {
  CatalogImage img;
  WindowOutputOptions options;
  std::vector<std::vector<float>> windows;  // each window's rows, padded
  std::vector<int64_t> rows;
};
RandomDetections randomDetections(const std::string& dir, uint32_t seed, int64_t columns, int64_t grid_rows,
                                  int64_t most, float large, float giant) {
  RandomDetections d;
  d.img = image(dir);
  d.img.grid = WindowGrid(20 * columns, 20 * grid_rows, GridSpec{20, 20, 0.0, 0.0});
  d.img.outputs["objects_csv"] = dir + "/slide_objects.csv";
  d.options.boxes = true;
  d.options.kinds = {"objects_csv"};
  d.options.dim = 6 * most;
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> unit(0, 1);
  const auto empty_row = [&](int64_t row) { return (row + seed) % 4 == 3; };
  for (int64_t w = 0; w < d.img.grid.count(); ++w) {
    std::vector<float>& v = d.windows.emplace_back(size_t(d.options.dim), 0.0f);
    const int64_t row = w / columns, n = empty_row(row) ? 0 : int64_t(random() % uint32_t(most + 1));
    for (int64_t i = 0; i < n; ++i) {
      const float cx = 0.5f + 19 * unit(random), cy = 0.5f + 19 * unit(random);
      const float draw = unit(random);
      const float side = draw < giant           ? 700
                         : draw < giant + large ? 20 + 40 * unit(random)
                                                : 0.3f + 8 * unit(random);
      const float aspect = 0.5f + unit(random);
      float* b = v.data() + 6 * i;
      b[0] = cx - side / 2;
      b[1] = cy - side * aspect / 2;
      b[2] = cx + side / 2;
      b[3] = cy + side * aspect / 2;
      b[4] = float(1 + random() % 8) / 8;
      b[5] = float(random() % 3);
      d.rows.push_back(row);
    }
  }
  return d;
}

// The CSV rows `d` writes with NMS at `iou` (0: none).
std::vector<std::string> detectRows(RandomDetections& d, double iou) {
  fs::remove(d.img.outputs["objects_csv"]);
  d.options.nms_iou = iou;
  WindowOutputs out(d.img, d.options);
  for (int64_t w = 0; w < d.img.grid.count(); ++w) out.add(w, d.windows[size_t(w)].data());
  out.commit();
  return csvRows(d.img.outputs["objects_csv"]);
}

// NMS as it was written first, brute force over every pending box: boxes held by grid row, a row's boxes
// settled when the row after next begins (and all at the end), each written unless a pending box of its class
// outscores it (higher score, or equal and earlier) with an IoU above `iou`. Returns the written boxes'
// places in `kept` (every box, window order).
std::vector<size_t> bruteForceNms(const std::vector<std::string>& kept, const std::vector<int64_t>& rows,
                                  double iou) {
  struct Box {
    size_t at;
    int64_t row;
    std::string k;
    float score;
    double x1, y1, x2, y2;
    bool settled = false;
  };
  const auto overlap = [](const Box& a, const Box& b) {
    const double w = std::min(a.x2, b.x2) - std::max(a.x1, b.x1),
                 h = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
    if (w <= 0 || h <= 0) return 0.0;
    return w * h / ((a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - w * h);
  };
  std::vector<size_t> written;
  std::vector<Box> pending;
  const auto settle = [&](int64_t row) {
    for (Box& b : pending) {
      if (b.settled || b.row > row) continue;
      b.settled = true;
      bool outscored = false;
      for (const Box& c : pending)
        outscored =
            outscored || (c.k == b.k && c.at != b.at &&
                          (c.score > b.score || (c.score == b.score && c.at < b.at)) && overlap(b, c) > iou);
      if (!outscored) written.push_back(b.at);
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(), [row](const Box& b) { return b.row < row; }),
                  pending.end());
  };
  int64_t last_row = -1;
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto f = fieldsOf(kept[i]);
    const Box b{i,
                rows[i],
                f[1],
                std::stof(f[2]),
                std::stod(f[3]),
                std::stod(f[4]),
                std::stod(f[5]),
                std::stod(f[6])};
    if (b.row > last_row) settle(b.row - 2);
    last_row = b.row;
    pending.push_back(b);
  }
  settle(std::numeric_limits<int64_t>::max());
  return written;
}

// NMS through the spatial index writes the boxes brute force writes, in the same order, for random boxes of
// every size (some across several rows, some past the image), ties and classes, at any IoU.
TEST(WindowOutputs, NonMaximumSuppressionEqualsTheBruteForceRule) {
  const std::string dir = test::scratchDir("detect_nms_random");
  int64_t suppressed = 0;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    RandomDetections d = randomDetections(dir, seed, 9, 7, 24, 0.15f, 0.02f);
    const std::vector<std::string> all = detectRows(d, 0);
    ASSERT_EQ(all.size(), d.rows.size()) << "every box is its window's";
    for (double iou : {0.05, 0.3, 0.5, 0.8}) {
      std::string want;
      int64_t id = 0;
      for (size_t at : bruteForceNms(all, d.rows, iou))
        want += std::to_string(++id) + all[at].substr(all[at].find(',')) + "\n";
      std::string got;
      for (const auto& row : detectRows(d, iou)) got += row + "\n";
      EXPECT_EQ(got, want) << "seed " << seed << ", IoU " << iou;
      suppressed += int64_t(all.size()) - id;
    }
  }
  EXPECT_GT(suppressed, 1000) << "the boxes meet often enough to test the rule";
  removeTree(dir);
}

// The index keeps NMS near linear in the boxes: 120 000 boxes in three grid rows, which brute force compared
// pair by pair (10^10 pairs: minutes), take about a second.
TEST(WindowOutputs, NonMaximumSuppressionIsNearLinearInTheBoxes) {
  const std::string dir = test::scratchDir("detect_nms_many");
  RandomDetections d = randomDetections(dir, 4, 120, 3, 667, 0.0f, 0.0f);
  ASSERT_GT(d.rows.size(), 100000u);
  const auto start = std::chrono::steady_clock::now();
  const auto rows = detectRows(d, 0.5);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20) << rows.size() << " of " << d.rows.size() << " boxes written";
  EXPECT_LT(rows.size(), d.rows.size());
  removeTree(dir);
}

// Boxes reaching past the image (a window's padding, any finite value a model gives) end at its edges in
// every output: no ±1e30 and no negative start is ever written. COCO has what pycocotools reads (info,
// licenses, segmentation, supercategory); the GeoJSON's id is also a property (GeoPandas' column).
TEST(WindowOutputs, BoxesAreClippedToTheImageInEveryOutput) {
  const std::string dir = test::scratchDir("detect_clip");
  CatalogImage img = image(dir, 2.0);  // 40 x 30 of 10 px windows, level 0 at 80 x 60
  img.outputs["objects"] = dir + "/slide_objects.geojson";
  img.outputs["objects_csv"] = dir + "/slide_objects.csv";
  img.outputs["coco"] = dir + "/slide_coco.json";
  WindowOutputOptions o = oneBoxAWindow();
  o.kinds = {"objects", "objects_csv", "coco"};
  const std::map<int64_t, std::vector<float>> boxes = {
      {0, {-1e30f, -1e30f, 1e30f, 1e30f, 0.5f, 0}},  // centre (0, 0): window 0's
      {4, {-2, 1, 6, 4, 0.6f, 0}},                   // starts 2 px left of the image
      {5, {-3, 2, 4, 8, 0.9f, 1}},                   // inside it
      {11, {5, 6, 14, 12, 0.7f, 0}}};                // past its right and bottom edges
  WindowOutputs out(img, o);
  for (int64_t w = 0; w < img.grid.count(); ++w) {
    const auto it = boxes.find(w);
    const std::vector<float> none(6, 0.0f);
    out.add(w, it == boxes.end() ? none.data() : it->second.data());
  }
  out.commit();
  EXPECT_EQ(test::slurp(dir + "/slide_objects.csv"),
            "id,class,score,x1,y1,x2,y2\n1,class_0,0.5,0,0,80,60\n2,class_0,0.6,0,22,12,28\n"
            "3,class_1,0.9,14,24,28,36\n4,class_0,0.7,70,52,80,60\n");
  const auto coco = nlohmann::json::parse(test::slurp(dir + "/slide_coco.json"));
  for (const char* key : {"info", "licenses", "images", "annotations", "categories"})
    EXPECT_TRUE(coco.contains(key)) << key;
  EXPECT_EQ(coco["images"][0]["width"], 80);
  EXPECT_EQ(coco["images"][0]["height"], 60);
  ASSERT_EQ(coco["annotations"].size(), 4u);
  EXPECT_EQ(coco["annotations"][0]["bbox"], nlohmann::json::parse("[0, 0, 80, 60]"));
  EXPECT_EQ(coco["annotations"][0]["area"], 4800);
  EXPECT_EQ(coco["annotations"][3]["bbox"], nlohmann::json::parse("[70, 52, 10, 8]"));
  EXPECT_EQ(coco["annotations"][3]["segmentation"],
            nlohmann::json::parse("[[70, 52, 80, 52, 80, 60, 70, 60]]"));
  for (const auto& a : coco["annotations"])
    for (const char* key : {"id", "image_id", "category_id", "bbox", "area", "segmentation", "iscrowd"})
      EXPECT_TRUE(a.contains(key)) << key;
  ASSERT_EQ(coco["categories"].size(), 2u);
  EXPECT_EQ(coco["categories"][1],
            nlohmann::json::parse(R"({"id": 2, "name": "class_1", "supercategory": "object"})"));
  const auto geojson = nlohmann::json::parse(test::slurp(dir + "/slide_objects.geojson"));
  ASSERT_EQ(geojson["features"].size(), 4u);
  EXPECT_EQ(geojson["features"][0]["geometry"]["coordinates"][0],
            nlohmann::json::parse("[[0, 0], [80, 0], [80, 60], [0, 60], [0, 0]]"));
  EXPECT_EQ(geojson["features"][1]["geometry"]["coordinates"][0][0], nlohmann::json::parse("[0, 22]"));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(geojson["features"][size_t(i)]["id"], i + 1);
    EXPECT_EQ(geojson["features"][size_t(i)]["properties"]["id"], i + 1);
  }
  removeTree(dir);
}

// A detector with no rows at all ([B, 0, 6]) finds nothing: valid, and every file is written, empty.
TEST(WindowOutputs, ADetectorWithoutRowsWritesEmptyFiles) {
  const std::string dir = test::scratchDir("detect_none");
  CatalogImage img = image(dir);
  img.outputs["objects"] = dir + "/slide_objects.geojson";
  img.outputs["coco"] = dir + "/slide_coco.json";
  WindowOutputOptions o = oneBoxAWindow();
  o.kinds = {"objects", "coco"};
  o.dim = 0;
  WindowOutputs out(img, o);
  for (int64_t w = 0; w < img.grid.count(); ++w) out.add(w, nullptr);
  out.commit();
  EXPECT_EQ(out.objects(), (std::array<int64_t, 2>{0, 0}));
  EXPECT_EQ(nlohmann::json::parse(test::slurp(dir + "/slide_objects.geojson"))["features"].size(), 0u);
  EXPECT_EQ(nlohmann::json::parse(test::slurp(dir + "/slide_coco.json"))["annotations"].size(), 0u);
  removeTree(dir);
}

}  // namespace
}  // namespace tiler
