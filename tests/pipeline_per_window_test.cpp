// End-to-end tests of `tiler infer`'s per-window tasks: detect (boxes each found once), embed and classify.
#include "pipeline_util.hpp"

#include <torch/script.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <sstream>

#include "tiler/core/grid.hpp"

namespace tiler::e2e {
namespace {

// A detector of 8x8 cells: every cell of a window is a box row (x1, y1, x2, y2, score, class), its score the
// cell's mean where that is over a half (else 0: padding), class 1 where it is over 0.9.
const char* kCellDetector = R"JIT(
def forward(self, x):
    m = torch.avg_pool2d(x.mean([1], True), [8, 8], [8, 8])[:, 0]
    b, h, w = m.size(0), m.size(1), m.size(2)
    ys = (torch.arange(h).float() * 8).view(1, h, 1).expand(b, h, w)
    xs = (torch.arange(w).float() * 8).view(1, 1, w).expand(b, h, w)
    score = torch.where(m > 0.5, m, torch.zeros_like(m))
    cls = (m > 0.9).float()
    return torch.stack([xs, ys, xs + 8, ys + 8, score, cls], 3).reshape(b, h * w, 6)
)JIT";

// Boxes from the CSV of a detect run: "class x1 y1 x2 y2", one each.
std::multiset<std::string> csvBoxes(const std::string& csv) {
  std::multiset<std::string> boxes;
  std::istringstream in(slurp(csv));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "id,class,score,x1,y1,x2,y2");
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string v; std::getline(fields, v, ',');) f.push_back(v);
    EXPECT_EQ(f.size(), 7u) << line;
    if (f.size() == 7) boxes.insert(f[1] + " " + f[3] + " " + f[4] + " " + f[5] + " " + f[6]);
  }
  return boxes;
}

// Squares of 8x8 px on the 8 px lattice, bright (class 1) and grey (class 0), some on the windows' core
// boundaries, some in several windows' overlap, some at the image's edges: each is found once, by the window
// whose core holds its centre, on 1, 2 and 3 ranks alike, in every output.
TEST_F(Pipeline, DetectionsAreEachObjectOnceWhateverTheWorldSize) {
  const int W = 200, H = 152;
  cv::Mat img(H, W, CV_8UC3, cv::Scalar::all(0));
  std::multiset<std::string> want;
  const int cells[][3] = {{0, 0, 255},   {5, 2, 160},   {6, 6, 255},   {7, 6, 255},
                          {12, 1, 160},  {13, 12, 255}, {18, 7, 160},  {24, 3, 255},
                          {24, 18, 160}, {0, 18, 255},  {11, 11, 255}, {19, 12, 160}};
  for (const auto& [cx, cy, v] : cells) {
    img(cv::Rect(cx * 8, cy * 8, 8, 8)).setTo(cv::Scalar::all(v));
    want.insert(std::string(v == 255 ? "class_1" : "class_0") + " " + std::to_string(cx * 8) + " " +
                std::to_string(cy * 8) + " " + std::to_string(cx * 8 + 8) + " " + std::to_string(cy * 8 + 8));
  }
  const std::string dir = root_ + "/detect", model = saveDetector(root_ + "/cells.pt", kCellDetector);
  fs::create_directories(dir);
  writeImage(dir + "/squares.tif", img, SampleType::kU8);
  const std::string args =
      " -i " + dir + " -m " + model + " --task detect --window 64 --overlap 0.25 " +
      "--batch_size 4 --threads 1 --save objects,objects_csv,coco,objects_store --no_progress -o ";
  auto r = run(kTiler + args + root_ + "/out_detect1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(csvBoxes(root_ + "/out_detect1/squares_objects.csv"), want);
  const auto e = *imageEntry(report(root_ + "/out_detect1"), "squares.tif");
  EXPECT_EQ(e["objects"], int64_t(std::size(cells))) << e;
  EXPECT_EQ(e["objects_at_window_edge"], 0) << e;
  const auto coco = nlohmann::json::parse(slurp(root_ + "/out_detect1/squares_coco.json"));
  EXPECT_EQ(coco["annotations"].size(), std::size(cells));
  EXPECT_EQ(coco["images"][0]["width"], W);
  EXPECT_EQ(coco["categories"].size(), 2u);
  const auto geojson = nlohmann::json::parse(slurp(root_ + "/out_detect1/squares_objects.geojson"));
  ASSERT_EQ(geojson["features"].size(), std::size(cells));
  EXPECT_EQ(geojson["features"][0]["properties"]["objectType"], "detection");
  // The store: a box each, its key its id, its class `type` (tests/objects_store_check.py reads it).
  r = run("/usr/bin/python3 " + std::string(TILER_TEST_SOURCE_DIR) + "/tests/objects_store_check.py " +
          root_ + "/out_detect1/squares_objects.db 0,0,1,1");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto store = nlohmann::json::parse(r.output);
  ASSERT_EQ(store["rows"].size(), std::size(cells));
  for (size_t i = 0; i < std::size(cells); ++i) {
    const auto& row = store["rows"][i];
    const auto& feature = geojson["features"][i];
    EXPECT_EQ(row["key"], std::to_string(feature["id"].get<int>()));
    EXPECT_EQ(row["properties"]["type"], feature["properties"]["classification"]["name"]);
    EXPECT_EQ(row["objtype"], "Polygon");
  }
  if (run("command -v ogrinfo").code == 0) {
    auto ogr = run("ogrinfo -so -al " + root_ + "/out_detect1/squares_objects.geojson");
    EXPECT_NE(ogr.output.find("Feature Count: " + std::to_string(std::size(cells))), std::string::npos)
        << ogr.output;
  }
  for (int ranks : {2, 3}) {
    const std::string out = root_ + "/out_detect" + std::to_string(ranks);
    r = run(kCtrun + " --nproc_per_node " + std::to_string(ranks) + " --master_port 0 " + kTiler + args +
            out);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* file :
         {"squares_objects.geojson", "squares_objects.csv", "squares_coco.json", "squares_objects.db"})
      EXPECT_TRUE(slurp(out + "/" + file) == slurp(root_ + "/out_detect1/" + file))
          << ranks << " ranks: " << file;
  }
}

// A georeferenced scene's objects are placed in its CRS in the GeoJSON (QGIS reads them there); the CSV and
// COCO stay in level-0 pixels.
TEST_F(Pipeline, DetectionsOfAGeoreferencedSceneAreInItsCrs) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  if (run("command -v gdal_translate && command -v ogrinfo").code != 0) GTEST_SKIP() << "no gdal-bin";
  const std::string dir = root_ + "/detect_geo";
  fs::create_directories(dir);
  cv::Mat img(152, 200, CV_8UC3, cv::Scalar::all(0));
  img(cv::Rect(16, 24, 8, 8)).setTo(cv::Scalar::all(255));
  writeImage(dir + "/plain.tif", img, SampleType::kU8);
  // 2 m pixels in UTM zone 33N, the top-left corner at (500000, 4600000).
  auto r = run("gdal_translate -q -a_srs EPSG:32633 -a_ullr 500000 4600000 500400 4599696 " + dir +
               "/plain.tif " + dir + "/scene.tif && rm " + dir + "/plain.tif");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(kTiler + " -i " + dir + " -m " + saveDetector(root_ + "/cells_geo.pt", kCellDetector) + " -o " +
          root_ +
          "/out_detect_geo --task detect --window 64 --save objects,objects_csv --threads 1 --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto geojson = nlohmann::json::parse(slurp(root_ + "/out_detect_geo/scene_objects.geojson"));
  EXPECT_EQ(geojson["crs"]["properties"]["name"], "urn:ogc:def:crs:EPSG::32633");
  ASSERT_EQ(geojson["features"].size(), 1u);
  EXPECT_EQ(geojson["features"][0]["geometry"]["coordinates"][0],
            nlohmann::json::parse("[[500032,4599952],[500048,4599952],[500048,4599936],[500032,4599936],"
                                  "[500032,4599952]]"));
  EXPECT_EQ(slurp(root_ + "/out_detect_geo/scene_objects.csv"),
            "id,class,score,x1,y1,x2,y2\n1,class_1,1,16,24,24,32\n");
  const auto ogr = run("ogrinfo -so -al " + root_ + "/out_detect_geo/scene_objects.geojson");
  EXPECT_NE(ogr.output.find("UTM zone 33N"), std::string::npos) << ogr.output;
}

// The bundled detector (samples/models/detector.pt) over discs of known centres and radii, some in two or
// four windows' overlap, some at the image's edge: every disc once, where it is, as big as it is.
TEST_F(Pipeline, TheBundledDetectorFindsEachDiscOnce) {
  const int W = 300, H = 260;
  const std::vector<std::array<double, 3>> discs = {{40.3, 30.6, 10}, {96.5, 100.2, 14}, {160.1, 96.4, 8},
                                                    {130, 200.5, 20}, {250.7, 40.2, 12}, {290.4, 250.6, 7},
                                                    {8.2, 240.5, 6},  {200.6, 170.3, 16}};
  cv::Mat img(H, W, CV_8UC3, cv::Scalar::all(40));
  for (const auto& [x, y, r] : discs)
    for (int py = 0; py < H; ++py)
      for (int px = 0; px < W; ++px)
        if (std::hypot(px + 0.5 - x, py + 0.5 - y) <= r) img.at<cv::Vec3b>(py, px) = cv::Vec3b(220, 200, 180);
  const std::string dir = root_ + "/discs";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", img, SampleType::kU8);
  auto r =
      run(kTiler + " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR + "/samples/models/detector.pt -o " + root_ +
          "/out_discs --task detect --window 128 --overlap 0.5 --batch_size 4 --threads 1 "
          "--save objects_csv --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  std::istringstream csv(slurp(root_ + "/out_discs/discs_objects.csv"));
  std::string line;
  std::getline(csv, line);
  std::vector<int> found(discs.size(), 0);
  int rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    std::vector<double> f;
    std::stringstream fields(line.substr(line.find(',', line.find(',') + 1) + 1));  // score onwards
    for (std::string v; std::getline(fields, v, ',');) f.push_back(std::stod(v));
    ASSERT_EQ(f.size(), 5u) << line;
    const double cx = (f[1] + f[3]) / 2, cy = (f[2] + f[4]) / 2, half = (f[3] - f[1]) / 2;
    for (size_t k = 0; k < discs.size(); ++k)
      if (std::hypot(cx - discs[k][0], cy - discs[k][1]) < 2.0) {
        ++found[k];
        EXPECT_NEAR(half, discs[k][2], 1.5) << line;
      }
  }
  EXPECT_EQ(rows, int(discs.size()));
  for (size_t k = 0; k < discs.size(); ++k) EXPECT_EQ(found[k], 1) << "disc " << k;
}

// What a detector must not give: each is a clear error, of the model (exit 1) or of the image (exit 2).
TEST_F(Pipeline, DetectionsThatMakeNoSenseAreClearErrors) {
  const std::string dir = root_ + "/detect_bad";
  fs::create_directories(dir);
  writeImage(dir + "/grey.tif", cv::Mat(96, 96, CV_8UC3, cv::Scalar::all(200)), SampleType::kU8);
  const auto tiler = [&](const std::string& name, const std::string& forward, const std::string& extra = "") {
    return run(kTiler + " -i " + dir + " -m " + saveDetector(root_ + "/" + name + ".pt", forward) + " -o " +
               root_ + "/out_" + name + " --task detect --window 64 --threads 1 --no_progress" + extra);
  };
  const std::string body = R"JIT(
def forward(self, x):
    b = x.size(0)
    w = float(x.size(3))
    h = float(x.size(2))
)JIT";
  auto r =
      tiler("det_swapped",
            body + "    return torch.tensor([w, 0.0, 0.0, h, 1.0, 0.0]).view(1, 1, 6).expand(b, 1, 6)\n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("x2 < x1 or y2 < y1"), std::string::npos) << r.output;
  r = tiler(
      "det_nan",
      body + "    return torch.tensor([0.0, 0.0, w, h, float('nan'), 0.0]).view(1, 1, 6).expand(b, 1, 6)\n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("grey.tif': window 0 (column 0, row 0), box 0 of 1: its score is not a number"),
            std::string::npos)
      << r.output;
  r = tiler("det_five", body + "    return torch.zeros(b, 3, 5)\n");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--task detect needs boxes [batch, N, 6]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the output is [1, 3, 5]"), std::string::npos) << r.output;
  // --save objects says the task; the output shape alone never does.
  r = run(kTiler + " -i " + dir + " -m " + root_ + "/det_five.pt -o " + root_ +
          "/out_det_saved --save objects --window 64 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--task detect needs boxes [batch, N, 6]"), std::string::npos) << r.output;
  r = tiler("det_nms", body + "    return torch.zeros(b, 3, 6)\n", " --nms 1.5");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--nms is an IoU in [0, 1) (0: none), not 1.5"), std::string::npos) << r.output;
  r = run(kTiler + " -i " + dir + " -m " + model_ + " -o " + root_ + "/out_seg_nms --nms 0.5 --no_progress");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--nms is for --task detect's boxes"), std::string::npos) << r.output;
  r = tiler("det_tta", body + "    return torch.zeros(b, 3, 6)\n", " --tta flip");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--tta is for maps and vectors"), std::string::npos) << r.output;
  // A box of a window's top-left quarter: every window keeps its own, those of windows inside the image cut
  // where the window begins, and no two meet in the windows' overlap: counted as cut.
  r = tiler("det_quarter", body +
                               "    return torch.tensor([0.0, 0.0, w / 2, h / 2, 1.0, 0.0]).view(1, 1, "
                               "6).expand(b, 1, 6)\n");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("touch a window edge inside the image"), std::string::npos) << r.output;
  const auto e = *imageEntry(report(root_ + "/out_det_quarter"), "grey.tif");
  EXPECT_GT(e["objects_at_window_edge"].get<int64_t>(), 0) << e;
  EXPECT_EQ(e["objects"], e["windows"]) << e;
  // A box as large as the window: every window keeps its own, cut where the window ends inside the image;
  // the parts overlap where the windows do and are merged into one box, the image.
  r = tiler("det_whole",
            body + "    return torch.tensor([0.0, 0.0, w, h, 1.0, 0.0]).view(1, 1, 6).expand(b, 1, 6)\n");
  EXPECT_EQ(r.code, 0) << r.output;
  const auto whole = *imageEntry(report(root_ + "/out_det_whole"), "grey.tif");
  EXPECT_EQ(whole["objects"], 1) << whole;
  EXPECT_EQ(whole["objects_at_window_edge"], 0) << whole;
  for (const char* name : {"out_det_swapped", "out_det_nan"})
    EXPECT_FALSE(fs::exists(root_ + "/" + name + "/grey_objects.geojson"))
        << name << ": nothing half-written";
}

// What a detector may give and what tiler then says: no rows at all is an answer (nothing found); a row count
// that changes is shown as the model gave it; NaN in padding rows is no value of the image; a classifier of
// more classes than a heatmap holds is refused before any image.
TEST_F(Pipeline, DetectorsWithoutRowsVaryingRowsOrNaNPaddingAreTakenAsTheyAre) {
  const std::string dir = root_ + "/detect_shapes";
  fs::create_directories(dir);
  writeImage(dir + "/grey.tif", cv::Mat(96, 96, CV_8UC3, cv::Scalar::all(200)), SampleType::kU8);
  const auto tiler = [&](const std::string& name, const std::string& forward, const std::string& extra) {
    return run(kTiler + " -i " + dir + " -m " + saveDetector(root_ + "/" + name + ".pt", forward) + " -o " +
               root_ + "/out_" + name + " --window 64 --batch_size 4 --threads 1 --no_progress " + extra);
  };
  auto r = tiler("det_none", "def forward(self, x):\n    return torch.zeros(x.size(0), 0, 6)\n",
                 "--task detect --save objects,coco");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(imageEntry(report(root_ + "/out_det_none"), "grey.tif")->value("objects", -1), 0);
  EXPECT_EQ(nlohmann::json::parse(slurp(root_ + "/out_det_none/grey_objects.geojson"))["features"].size(),
            0u);
  r = tiler("det_vary", "def forward(self, x):\n    return torch.zeros(x.size(0), 3 * x.size(0), 6)\n",
            "--task detect");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the model's output is [4, 12, 6] for 4 windows, not [4, 3, 6]"), std::string::npos)
      << r.output;
  r = tiler("det_nan_padding", R"JIT(
def forward(self, x):
    b = x.size(0)
    nan = float('nan')
    rows = torch.tensor([[nan, nan, nan, nan, 0.0, nan], [0.0, 0.0, 8.0, 8.0, 1.0, 0.0]])
    return rows.view(1, 2, 6).expand(b, 2, 6)
)JIT",
            "--task detect --save objects_csv");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto e = *imageEntry(report(root_ + "/out_det_nan_padding"), "grey.tif");
  EXPECT_EQ(e.value("non_finite_values", int64_t(0)), 0) << e;
  EXPECT_EQ(e["objects"], 1) << e;
  r = tiler("classes_600", "def forward(self, x):\n    return torch.zeros(x.size(0), 600)\n",
            "--task classify --save csv,heatmap");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--save heatmap holds at most 512 classes"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/out_classes_600/grey.csv")) << "refused before any image";
}

TEST_F(Pipeline, EmbedWritesTheGridsFeaturesByteIdenticalForOneToThreeRanks) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  const std::string encoder = perWindowModel(root_, "encoder", "    return f\n");
  const std::string args = " -i " + root_ + "/images -m " + encoder +
                           " --window 64 --batch_size 4 --threads 1 --no_progress --encoder_name tiny"
                           " --save features,features_pt -o ";
  const std::string ref = root_ + "/out_embed1";
  auto r = run(kTiler + args + ref);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rep = report(ref);
  EXPECT_EQ(rep["task"], "embed") << "a [B, D] output without an activation is an encoder";
  EXPECT_EQ(rep["feature_dim"], 8);
  // No overlap by default: a_large.tif (700 x 500) in 64 px windows is 11 x 8 on TRIDENT's and CLAM's patch
  // lattice: the last column starts at 640 and reaches past the edge (padded), so that x / 64 names a cell.
  const WindowGrid grid(700, 500, GridSpec{64, 64, 0.0, 0.0, /*lattice=*/true});
  EXPECT_EQ(grid.count(), 88);
  EXPECT_EQ(grid.imageWindow(10).x, 640);
  const std::string h5 = ref + "/a_large.h5";
  const auto coords = test::h5dumpValues(h5, "coords");
  ASSERT_EQ(coords.size(), size_t(2 * grid.count()));
  for (int64_t w = 0; w < grid.count(); ++w) {
    EXPECT_EQ(coords[size_t(2 * w)], grid.imageWindow(w).x) << w;
    EXPECT_EQ(coords[size_t(2 * w + 1)], grid.imageWindow(w).y) << w;
  }
  // The features are the model's forward of each window (window 13: column 2, row 1), values / 255.
  cv::Mat pixels;
  cv::cvtColor(cv::imread(root_ + "/images/a_large.tif", cv::IMREAD_UNCHANGED), pixels, cv::COLOR_BGR2RGB);
  const Rect w13 = grid.imageWindow(13);
  cv::Mat window;
  pixels(cv::Rect(int(w13.x), int(w13.y), 64, 64)).convertTo(window, CV_32FC3, 1.0 / 255);
  auto x = torch::from_blob(window.data, {1, 64, 64, 3}).permute({0, 3, 1, 2}).contiguous();
  auto module = torch::jit::load(encoder);
  const auto expected = module.forward({x}).toTensor();
  const auto row = test::h5dumpValues(h5, "features", "-s 13,0 -c 1,8");
  ASSERT_EQ(row.size(), 8u);
  for (int d = 0; d < 8; ++d) EXPECT_NEAR(row[size_t(d)], expected[0][d].item<float>(), 1e-5) << d;
  // CLAM's pt_files/<slide>.pt beside it: the same rows as one tensor.
  const std::string pt = slurp(ref + "/a_large.pt");
  const auto tensor = torch::jit::pickle_load(std::vector<char>(pt.begin(), pt.end())).toTensor();
  ASSERT_EQ(tensor.sizes(), (std::vector<int64_t>{88, 8}));
  for (int d = 0; d < 8; ++d)
    EXPECT_NEAR(tensor[13][d].item<float>(), expected[0][d].item<float>(), 1e-5) << d;
  auto attrs = run("h5dump -a /coords/encoder -a /coords/patch_size " + h5);
  EXPECT_NE(attrs.output.find("\"tiny\""), std::string::npos) << attrs.output;
  EXPECT_NE(attrs.output.find("(0): 64"), std::string::npos) << attrs.output;
  // CLAM's and TRIDENT's reader, where Python has h5py.
  if (run("/usr/bin/python3 -c 'import h5py'").code == 0) {
    auto py = run("/usr/bin/python3 -c \"import h5py; f = h5py.File('" + h5 +
                  "', 'r'); print(f['features'][:].shape, f['features'].dtype, f['coords'][:].shape, "
                  "f['coords'].dtype, f['coords'].attrs['name'])\"");
    EXPECT_NE(py.output.find("(88, 8) float32 (88, 2) int64 a_large"), std::string::npos) << py.output;
  }
  for (int n : {2, 3}) {
    const std::string out = root_ + "/out_embed" + std::to_string(n);
    r = run(kCtrun + " --nproc_per_node " + std::to_string(n) + " --master_port 0 " + kTiler + args + out);
    ASSERT_EQ(r.code, 0) << r.output;
    int files = 0;
    for (const auto& e : fs::directory_iterator(ref)) {
      if (e.path().extension() != ".h5" && e.path().extension() != ".pt") continue;
      ++files;
      EXPECT_TRUE(slurp(e.path().string()) == slurp(out + "/" + e.path().filename().string()))
          << e.path().filename() << " with " << n << " ranks";
    }
    EXPECT_EQ(files, 10);
  }
  // --edge shift: MONAI's grid, the last column shifted back to end at the edge.
  const std::string shifted = root_ + "/out_embed_shift";
  r = run(kTiler + args + shifted + " --edge shift");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(test::h5dumpValues(shifted + "/a_large.h5", "coords")[2 * 10], 700 - 64);
  r = run(kTiler + args + root_ + "/out_embed_bad_edge --edge diagonal");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--edge must be auto, lattice or shift"), std::string::npos) << r.output;
  // The model is never an output: slide.png's features_pt would be the model itself, slide.pt.
  const std::string same = root_ + "/embed_model_dir";
  fs::create_directories(same);
  fs::copy_file(root_ + "/images/c_small.png", same + "/slide.png");
  fs::copy_file(encoder, same + "/slide.pt");
  const std::string model = slurp(same + "/slide.pt");
  r = run(kTiler + " -i " + same + "/slide.png -m " + same +
          "/slide.pt --window 64 --threads 1 --no_progress --save features_pt --overwrite -o " + same);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("is read by this run"), std::string::npos) << r.output;
  EXPECT_TRUE(slurp(same + "/slide.pt") == model) << "the model was overwritten";
}

TEST_F(Pipeline, ClassifyWritesCsvTilesAndHeatmapThatGdalReads) {
  const std::string classifier =
      perWindowModel(root_, "classifier", "    return torch.matmul(f, self.head.t())\n");
  const std::string out = root_ + "/out_classify";
  auto r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + classifier + " -o " + out +
               " --window 64 --batch_size 4 --threads 1 --no_progress --activation softmax "
               "--classes stroma,tumor:#ff0000,fat --save csv,tiles,heatmap,objects_store");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(report(out)["task"], "classify") << "softmax over a [B, K] output: a classifier";
  EXPECT_EQ(report(out)["feature_dim"], 3);
  std::istringstream csv(slurp(out + "/a_large.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "minx,miny,width,height,prob_stroma,prob_tumor,prob_fat");
  int rows = 0;
  while (std::getline(csv, line)) {
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream in(line);
    double x, y, w, h, p0, p1, p2;
    in >> x >> y >> w >> h >> p0 >> p1 >> p2;
    EXPECT_NEAR(p0 + p1 + p2, 1.0, 1e-5) << line;
    EXPECT_EQ(w, 64);
    ++rows;
  }
  EXPECT_EQ(rows, 88);
  const auto tiles = nlohmann::json::parse(slurp(out + "/a_large_tiles.geojson"));
  ASSERT_EQ(tiles["features"].size(), 88u);
  EXPECT_EQ(tiles["features"][0]["properties"]["objectType"], "tile");
  // The store: each window its box, its class `type` the tile's classification.
  r = run("/usr/bin/python3 " + std::string(TILER_TEST_SOURCE_DIR) + "/tests/objects_store_check.py " + out +
          "/a_large_objects.db 0,0,1,1");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto store = nlohmann::json::parse(r.output);
  ASSERT_EQ(store["rows"].size(), 88u);
  EXPECT_EQ(store["rows"][0]["properties"]["type"],
            tiles["features"][0]["properties"]["classification"]["name"]);
  EXPECT_EQ(store["rows"][0]["area"], 64.0 * 64.0);
  EXPECT_EQ(store["bbox_keys"], nlohmann::json({"1"}));
  if (have("ogrinfo")) {
    for (const char* file : {"a_large.csv", "a_large_tiles.geojson"}) {
      auto info = run("ogrinfo -ro -so -al " + out + "/" + file);
      EXPECT_NE(info.output.find("Feature Count: 88"), std::string::npos) << file << "\n" << info.output;
    }
  }
  if (have("gdalinfo")) {
    auto info = run("gdalinfo " + out + "/a_large_heatmap.tif");
    EXPECT_NE(info.output.find("Size is 11, 8"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("Band 3 Block"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("NoData Value=nan"), std::string::npos) << info.output;
    // A GeoTIFF's heatmap is georeferenced: a pixel spans a stride (64 px of 10 m), from the same origin.
    const std::string geo = root_ + "/geo_in";
    fs::create_directories(geo);
    auto t = run("gdal_translate -q -a_srs EPSG:32633 -a_ullr 500000 6000000 507000 5995000 " + root_ +
                 "/images/a_large.tif " + geo + "/scene.tif");
    ASSERT_EQ(t.code, 0) << t.output;
    r = run(kTiler + " -i " + geo + " -m " + classifier + " -o " + out +
            "_geo --window 64 --threads 1 --no_progress --task classify --save heatmap");
    ASSERT_EQ(r.code, 0) << r.output;
    info = run("gdalinfo " + out + "_geo/scene_heatmap.tif");
    EXPECT_NE(info.output.find("Pixel Size = (640.000000000000000,-640.000000000000000)"), std::string::npos)
        << info.output;
    EXPECT_NE(info.output.find("Origin = (500000.000000000000000,6000000.000000000000000)"),
              std::string::npos)
        << info.output;
    EXPECT_NE(info.output.find("32633"), std::string::npos) << info.output;
  }
}

TEST_F(Pipeline, EmbedUnderAMaskAndAtAnotherResolution) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  const std::string encoder = perWindowModel(root_, "encoder_mask", "    return f\n");
  // The mask keeps the left 128 columns of a_large.tif (700 x 500): 2 of 11 window columns, 8 rows.
  cv::Mat mask(500, 700, CV_8UC1, cv::Scalar(0));
  mask(cv::Rect(0, 0, 128, 500)).setTo(255);
  cv::imwrite(root_ + "/mask.png", mask);
  const std::string out = root_ + "/out_embed_mask";
  auto r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + encoder + " -o " + out + " --mask " +
               root_ + "/mask.png --window 64 --threads 1 --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  auto coords = test::h5dumpValues(out + "/a_large.h5", "coords");
  ASSERT_EQ(coords.size(), 2u * 16) << "the masked windows are absent";
  for (size_t k = 0; k < 16; ++k) EXPECT_LT(coords[2 * k], 128) << k;
  // At twice the source's um/px: windows of 64 processing pixels are 128 level-0 pixels apart.
  const std::string half = root_ + "/out_embed_mpp";
  r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + encoder + " -o " + half +
          " --input_mpp 0.25 --mpp 0.5 --window 64 --threads 1 --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  coords = test::h5dumpValues(half + "/a_large.h5", "coords");
  const WindowGrid grid(350, 250, GridSpec{64, 64, 0.0, 0.0, /*lattice=*/true});
  ASSERT_EQ(coords.size(), size_t(2 * grid.count()));
  EXPECT_EQ(coords[2], 128);
  EXPECT_EQ(coords[2 * 5], 2 * 320) << "the last column, on the lattice past the edge";
  auto attrs = run("h5dump -a /coords/patch_size_level0 -a /coords/mpp " + half + "/a_large.h5");
  EXPECT_NE(attrs.output.find("(0): 128"), std::string::npos) << attrs.output;
  EXPECT_NE(attrs.output.find("(0): 0.5"), std::string::npos) << attrs.output;
}

// WSInfer's TILs model as its zoo ships it (100 px at 0.5 µm/px resized to 299, an extra field in its
// config) on a 0.25 µm/px TIFF: upsampled 299/200x with a warning and the factor in the report, windows that
// are 200 px level-0 boxes, scores equal to those of the windows' pixels computed here by the area rule in
// integers, refused with --no_upsample, and WSInfer's layout byte-identical on one rank and two.
TEST_F(Pipeline, WsinferTilsConfigRunsOnAFinerScanByUpsampling) {
  const std::string dir = root_ + "/tils";
  fs::create_directories(dir + "/zoo");
  fs::create_directories(dir + "/slides");
  cv::Mat slide(420, 620, CV_8UC3);
  cv::RNG(17).fill(slide, cv::RNG::UNIFORM, 0, 256);
  WriterOptions wo;
  wo.mpp = 0.25;
  wo.tile = 64;
  ImageWriter writer(dir + "/slides/purple.tif", slide.cols, slide.rows, 3, SampleType::kU8, wo);
  writer.writeRows(slide);
  writer.close();
  // The mean square of the normalised red channel: as sensitive to how pixels are resampled as to where.
  torch::jit::Module m("Tils");
  m.define(
      "def forward(self, x):\n    s = torch.mean(x[:, 0] * x[:, 0], [1, 2])\n"
      "    return torch.stack([torch.zeros_like(s), s], 1)\n");
  m.save(dir + "/zoo/torchscript_model.pt");
  std::ofstream(dir + "/zoo/config.json") << R"({"spec_version": "1.0", "architecture": "inception_v4nobn",
    "num_classes": 2, "class_names": ["Other", "Lymphocytes"], "patch_size_pixels": 100, "spacing_um_px": 0.5,
    "transform": [{"name": "Resize", "arguments": {"size": 299}}, {"name": "ToTensor"},
                  {"name": "Normalize", "arguments": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}],
    "description": "tumor-infiltrating lymphocytes"})";
  const std::string args =
      " -i " + dir + "/slides -m " + dir + "/zoo --threads 1 --batch_size 2 --no_progress -o " + dir;
  auto r = run(kTiler + args + "/out");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("'description'"), std::string::npos) << "the extra field, warned: " << r.output;
  EXPECT_NE(r.output.find("upsampled 1.495x"), std::string::npos) << r.output;
  const nlohmann::json out_report = report(dir + "/out");
  const auto* entry = imageEntry(out_report, "purple.tif");
  ASSERT_NE(entry, nullptr);
  EXPECT_NEAR((*entry)["upsample_factor"].get<double>(), 299.0 / 200, 1e-9);
  EXPECT_NEAR((*entry)["mpp"].get<double>(), 0.5 * 100 / 299, 1e-12);
  // The processing image is floor(620 x 299 / 200) x floor(420 x 299 / 200): 926 x 627, 3 x 2 whole windows.
  EXPECT_EQ((*entry)["width"], 926);
  EXPECT_EQ((*entry)["height"], 627);
  // Processing pixel i spans [200 i, 200 i + 200) in 1/299ths of a level pixel; level pixel j [299 j, 299 j +
  // 299).
  const auto overlap = [](int64_t i, int64_t j) {
    return std::max<int64_t>(0, std::min(200 * i + 200, 299 * j + 299) - std::max(200 * i, 299 * j));
  };
  const auto expected = [&](int64_t x0, int64_t y0) {  // the window at processing (x0, y0): p(Lymphocytes)
    double squares = 0;
    for (int64_t y = y0; y < y0 + 299; ++y)
      for (int64_t x = x0; x < x0 + 299; ++x) {
        int64_t sum = 0;  // the red value x 40000
        for (int64_t j = 200 * x / 299; j <= (200 * x + 199) / 299; ++j)
          for (int64_t k = 200 * y / 299; k <= (200 * y + 199) / 299; ++k)
            sum += overlap(x, j) * overlap(y, k) *
                   slide.at<cv::Vec3b>(int(k), int(j))[0];  // tiler's mats are RGB
        const double v = double((sum + 20000) / 40000) / 255.0, n = (v - 0.5) / 0.5;
        squares += n * n;
      }
    return 1.0 / (1.0 + std::exp(-squares / (299.0 * 299.0)));
  };
  std::istringstream csv(slurp(dir + "/out/purple.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "minx,miny,width,height,prob_Other,prob_Lymphocytes");
  int whole = 0;
  while (std::getline(csv, line)) {
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream in(line);
    int64_t x = 0, y = 0, w = 0, h = 0;
    double p0 = 0, p1 = 0;
    in >> x >> y >> w >> h >> p0 >> p1;
    EXPECT_EQ(x % 200, 0) << line;
    EXPECT_EQ(y % 200, 0) << line;
    if (x + 200 > 620 || y + 200 > 420) continue;  // a lattice window past the edge, padded
    ++whole;
    EXPECT_EQ(w, 200) << line;
    EXPECT_EQ(h, 200) << line;
    EXPECT_NEAR(p1, expected(x * 299 / 200, y * 299 / 200), 2e-5) << line;
  }
  EXPECT_EQ(whole, 6);
  // --no_upsample: the image fails, naming the factor it would take.
  r = run(kTiler + args + "/refused --no_upsample");
  EXPECT_EQ(r.code, 2) << r.output;
  const nlohmann::json refused_report = report(dir + "/refused");
  const auto* refused = imageEntry(refused_report, "purple.tif");
  ASSERT_NE(refused, nullptr);
  const std::string error = (*refused)["error"];
  EXPECT_NE(error.find("is finer than the scan itself"), std::string::npos) << error;
  EXPECT_NE(error.find("--no_upsample"), std::string::npos) << error;
  // WSInfer's layout, one rank and two: the same bytes; the CSV column by column.
  r = run(kTiler + args + "/one --wsinfer_layout");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + args + "/two --wsinfer_layout");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* file : {"/model-outputs-csv/purple.csv", "/model-outputs-geojson/purple.geojson"}) {
    ASSERT_TRUE(fs::exists(dir + "/one" + file)) << file;
    EXPECT_TRUE(slurp(dir + "/one" + file) == slurp(dir + "/two" + file)) << file;
  }
  EXPECT_FALSE(fs::exists(dir + "/one/purple.csv")) << "WSInfer's files in place of tiler's";
  std::istringstream table(slurp(dir + "/one/model-outputs-csv/purple.csv"));
  std::getline(table, line);
  std::vector<std::string> starts;
  while (std::getline(table, line)) starts.push_back(line.substr(0, line.find(',', line.find(',') + 1)));
  ASSERT_GE(starts.size(), 6u);
  EXPECT_EQ(starts[0], "0,0");
  EXPECT_EQ(starts[1], "0,200") << "column by column, as WSInfer's patches";
  const auto geojson = nlohmann::json::parse(slurp(dir + "/one/model-outputs-geojson/purple.geojson"));
  EXPECT_EQ(geojson["features"].size(), starts.size());
  EXPECT_EQ(geojson["features"][1]["geometry"]["coordinates"][0][0], (nlohmann::json{200.0, 200.0}));
  // --wsinfer_layout is classify's: another task refuses it.
  r = run(kTiler + " -i " + root_ + "/images/c_small.png -m " + model_ + " -o " + dir +
          "/segment --threads 1 --no_progress --wsinfer_layout");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--wsinfer_layout is for --task classify"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tiler::e2e
