// End-to-end tests of `tiler infer`'s objects: polygons of segmentation maps and instance maps (whatever
// the world size, objects larger than the overlap joined, under a mask, at another resolution, and the maps
// it refuses).
#include "pipeline_util.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <sstream>

namespace tiler::e2e {
namespace {

// Shoelace areas of a GeoJSON Polygon: the outer ring minus its holes.
double polygonArea(const nlohmann::json& rings) {
  double total = 0;
  for (size_t i = 0; i < rings.size(); ++i) {
    double a = 0;
    const auto& ring = rings[i];
    for (size_t k = 0; k + 1 < ring.size(); ++k)
      a += ring[k][0].get<double>() * ring[k + 1][1].get<double>() -
           ring[k + 1][0].get<double>() * ring[k][1].get<double>();
    total += (i == 0 ? 1 : -1) * std::abs(a) / 2;
  }
  return total;
}

// Known shapes: a 60x60 square ring with a 20x20 hole, and two separate squares: 3 regions of class 1.
cv::Mat knownShapes() {
  cv::Mat img = cv::Mat::zeros(300, 400, CV_8UC3);
  img(cv::Rect(30, 40, 60, 60)).setTo(cv::Scalar(255, 0, 0));
  img(cv::Rect(50, 60, 20, 20)).setTo(cv::Scalar(0, 0, 0));
  img(cv::Rect(200, 100, 30, 50)).setTo(cv::Scalar(255, 0, 0));
  img(cv::Rect(300, 250, 70, 40)).setTo(cv::Scalar(255, 0, 0));
  return img;
}

TEST_F(Pipeline, PolygonsOutlineEachRegionExactlyWithItsHoles) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string in = root_ + "/shapes_in", out = root_ + "/shapes_out";
  fs::create_directories(in);
  writeImage(in + "/shapes.png", knownShapes(), SampleType::kU8);
  auto r = run(kTiler + " -i " + in + " -m " + thresholdModel(root_) + " -o " + out +
               " --window 64 --threads 1 --no_progress --save polygons --classes background,tumour:#ff0000");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(fs::exists(out + "/shapes_labels.tif")) << "labels were not asked for";
  EXPECT_EQ(report(out)["images"][0]["outputs"]["polygons"], out + "/shapes_polygons.geojson");
  auto j = nlohmann::json::parse(slurp(out + "/shapes_polygons.geojson"));
  EXPECT_EQ(j["type"], "FeatureCollection");
  EXPECT_FALSE(j.contains("crs")) << "pixel coordinates";
  ASSERT_EQ(j["features"].size(), 3u);
  std::vector<double> areas;
  int holes = 0;
  for (const auto& f : j["features"]) {
    EXPECT_EQ(f["properties"]["class"], 1);
    EXPECT_EQ(f["properties"]["name"], "tumour");
    EXPECT_EQ(f["properties"]["classification"]["name"], "tumour");
    EXPECT_EQ(f["properties"]["classification"]["color"], nlohmann::json({255, 0, 0}));
    areas.push_back(polygonArea(f["geometry"]["coordinates"]));
    holes += int(f["geometry"]["coordinates"].size()) - 1;
  }
  std::sort(areas.begin(), areas.end());
  EXPECT_EQ(areas, (std::vector<double>{1500, 2800, 3200}))
      << "areas are pixel counts (the ring: 3600 - 400)";
  EXPECT_EQ(holes, 1);
  if (have("ogrinfo")) {
    auto info = run("ogrinfo -so -al " + out + "/shapes_polygons.geojson");
    EXPECT_NE(info.output.find("Feature Count: 3"), std::string::npos) << info.output;
  }
}

TEST_F(Pipeline, GeoreferencedPolygonsAreInTheInputsCrs) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  TILER_SKIP_WITHOUT_TOOL("gdalinfo");
  if (!have("gdal_translate")) GTEST_SKIP() << "gdal-bin is not installed";
  const std::string in = root_ + "/geo_in", out = root_ + "/geo_out";
  fs::create_directories(in);
  writeImage(root_ + "/shapes_plain.tif", knownShapes(), SampleType::kU8);
  // UTM 33N, 10 m pixels, upper-left corner at (500000, 6000000).
  auto t = run("gdal_translate -q -a_srs EPSG:32633 -a_ullr 500000 6000000 504000 5997000 " + root_ +
               "/shapes_plain.tif " + in + "/scene.tif");
  ASSERT_EQ(t.code, 0) << t.output;
  auto r = run(kTiler + " -i " + in + " -m " + thresholdModel(root_) + " -o " + out +
               " --window 64 --threads 1 --no_progress --save labels,polygons");
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = nlohmann::json::parse(slurp(out + "/scene_polygons.geojson"));
  EXPECT_EQ(j["crs"]["properties"]["name"], "urn:ogc:def:crs:EPSG::32633");
  ASSERT_EQ(j["features"].size(), 3u);
  for (const auto& f : j["features"])
    for (const auto& p : f["geometry"]["coordinates"][0]) {
      EXPECT_GE(p[0].get<double>(), 500000);
      EXPECT_LE(p[0].get<double>(), 504000);
      EXPECT_GE(p[1].get<double>(), 5997000);
      EXPECT_LE(p[1].get<double>(), 6000000);
    }
  std::vector<double> areas;
  for (const auto& f : j["features"]) areas.push_back(polygonArea(f["geometry"]["coordinates"]));
  std::sort(areas.begin(), areas.end());
  EXPECT_EQ(areas.front(), 1500 * 100.0) << "m^2: 1500 pixels of 10 x 10 m";
  auto info = run("gdalinfo " + out + "/scene_labels.tif");
  EXPECT_NE(info.output.find("32633"), std::string::npos) << "the labels keep the CRS";
  // At 20 m (µm/px is metres x 10^6): resampled 2x, the transform's pixel size doubles, the origin stays.
  r = run(kTiler + " -i " + in + " -m " + thresholdModel(root_) + " -o " + out +
          "_20m --window 64 --threads 1 --no_progress --save labels,polygons --mpp 2e7");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto e = report(out + "_20m")["images"][0];
  EXPECT_EQ(e["source_mpp"].get<double>(), 1e7);
  EXPECT_EQ(e["mpp"].get<double>(), 2e7);
  EXPECT_EQ(e["width"], 200);
  info = run("gdalinfo " + out + "_20m/scene_labels.tif");
  EXPECT_NE(info.output.find("Pixel Size = (20.000000000000000,-20.000000000000000)"), std::string::npos)
      << info.output;
  EXPECT_NE(info.output.find("Origin = (500000.000000000000000,6000000.000000000000000)"), std::string::npos)
      << info.output;
}

// Discs of known centres and radii on a dark ground (some across the windows' borders, two that touch and
// make one object, some cut by the image's edge), and what the bundled instance model must find: the
// 8-connected parts of the pixels it calls bright, computed here over the whole image.
struct DiscScene {
  cv::Mat image;  // 8-bit RGB
  cv::Mat parts;  // int32: 0, or the whole image's part 1..n
  int n = 0;
};
DiscScene discScene() {
  const int W = 300, H = 260;
  const std::vector<std::array<double, 3>> discs = {
      {40.3, 30.6, 10},  {96.5, 100.2, 14}, {160.1, 96.4, 8},   {130, 200.5, 20}, {250.7, 40.2, 12},
      {290.4, 250.6, 7}, {8.2, 240.5, 6},   {200.6, 170.3, 16}, {226, 170, 11},   {64, 64, 5}};
  DiscScene s;
  s.image = cv::Mat(H, W, CV_8UC3, cv::Scalar::all(40));
  for (const auto& [x, y, r] : discs)
    for (int py = 0; py < H; ++py)
      for (int px = 0; px < W; ++px)
        if (std::hypot(px + 0.5 - x, py + 0.5 - y) <= r)
          s.image.at<cv::Vec3b>(py, px) = cv::Vec3b(220, 200, 180);
  cv::Mat grey;
  cv::cvtColor(s.image, grey, cv::COLOR_RGB2GRAY);
  s.n = cv::connectedComponents(grey > 100, s.parts, 8, CV_32S) - 1;
  return s;
}

// Every pixel of `got` (a uint32 instance TIFF) is an object exactly where `want` has a part, one object for
// each part.
void expectSameObjects(const std::string& tiff, const cv::Mat& want, int parts) {
  cv::Mat got = ImageReader::open(tiff)->readRegion({0, 0, want.cols, want.rows});
  ASSERT_EQ(got.type(), CV_32S);
  std::map<int, int> to_part, to_object;
  for (int y = 0; y < want.rows; ++y)
    for (int x = 0; x < want.cols; ++x) {
      const int g = got.at<int32_t>(y, x), w = want.at<int32_t>(y, x);
      ASSERT_EQ(g == 0, w == 0) << "pixel " << x << ", " << y;
      if (g == 0) continue;
      ASSERT_EQ(to_part.emplace(g, w).first->second, w) << "object " << g << " at " << x << ", " << y;
      ASSERT_EQ(to_object.emplace(w, g).first->second, g) << "part " << w << " at " << x << ", " << y;
    }
  EXPECT_EQ(int(to_part.size()), parts);
}

// The bundled instance model over the discs: every object once, exactly the whole image's parts (the TIFF
// pixel for pixel; the GeoJSON's outlines of their pixel counts), on 1, 2 and 3 ranks to the byte.
TEST_F(Pipeline, InstancesAreTheWholeImagesObjectsWhateverTheWorldSize) {
  const DiscScene scene = discScene();
  const std::string dir = root_ + "/instances";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", scene.image, SampleType::kU8);
  const std::string args =
      " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
      "/samples/models/instances.pt --task instances --window 128 --overlap 0.5 "
      "--batch_size 4 --threads 1 --save objects,objects_csv,instances --no_progress -o ";
  auto r = run(kTiler + args + root_ + "/out_instances1");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string out = root_ + "/out_instances1";
  expectSameObjects(out + "/discs_instances.tif", scene.parts, scene.n);
  const auto e = *imageEntry(report(out), "discs.tif");
  EXPECT_EQ(e["objects"], scene.n) << e;
  EXPECT_EQ(e["objects_at_window_edge"], 0) << e;
  const auto geojson = nlohmann::json::parse(slurp(out + "/discs_objects.geojson"));
  ASSERT_EQ(int(geojson["features"].size()), scene.n);
  std::multiset<double> want_areas, got_areas;
  for (int k = 1; k <= scene.n; ++k) want_areas.insert(cv::countNonZero(scene.parts == k));
  for (const auto& f : geojson["features"]) {
    got_areas.insert(f["properties"]["measurements"]["area"].get<double>());
    EXPECT_EQ(f["properties"]["objectType"], "detection");
    EXPECT_EQ(f["geometry"]["type"], "Polygon") << f["id"];
  }
  EXPECT_EQ(got_areas, want_areas);
  if (run("command -v ogrinfo").code == 0) {
    auto ogr = run("ogrinfo -so -al " + out + "/discs_objects.geojson");
    EXPECT_NE(ogr.output.find("Feature Count: " + std::to_string(scene.n)), std::string::npos) << ogr.output;
    // OGR's own area of every outline: the pixel counts, to the pixel.
    ogr = run("ogrinfo -q -dialect SQLite -sql \"SELECT SUM(ST_Area(geometry)) AS a FROM discs_objects\" " +
              out + "/discs_objects.geojson");
    EXPECT_NE(ogr.output.find("a (Real) = " + std::to_string(cv::countNonZero(scene.parts))),
              std::string::npos)
        << ogr.output;
  }
  for (int ranks : {2, 3}) {
    const std::string other = root_ + "/out_instances" + std::to_string(ranks);
    r = run(kCtrun + " --nproc_per_node " + std::to_string(ranks) + " --master_port 0 " + kTiler + args +
            other);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* file : {"discs_objects.geojson", "discs_objects.csv", "discs_instances.tif"})
      EXPECT_TRUE(slurp(other + "/" + file) == slurp(out + "/" + file)) << ranks << " ranks: " << file;
  }
}

// Objects larger than the overlap (windows of 64 at an overlap of 0.5: 32 px), up to three overlaps wide: a
// ring and a C that a window sees in two pieces (their parts meet only in a neighbouring window), a bar, a
// disc, a one-pixel diagonal line, and small discs, brighter where x is larger (green). The model (made here)
// is the bundled instance model, 8-connected bright blobs with window-local ids, and the green channel as a
// class score, so the whole image's objects are the 8-connected parts of the bright pixels and each
// object's score is its mean green.
struct LargeObjectScene {
  cv::Mat image;  // 8-bit RGB, 352 x 256
  cv::Mat parts;  // int32: 0, or the whole image's part 1..n
  int n = 0;
};
LargeObjectScene largeObjectScene() {
  const int W = 352, H = 256;
  cv::Mat mask = cv::Mat::zeros(H, W, CV_8U);
  mask(cv::Rect(20, 20, 96, 40)).setTo(255);  // the ring: 96 x 40, 4 px thick
  mask(cv::Rect(24, 24, 88, 32)).setTo(0);
  mask(cv::Rect(140, 80, 96, 4)).setTo(255);  // the C: open to the right, 96 x 40
  mask(cv::Rect(140, 116, 96, 4)).setTo(255);
  mask(cv::Rect(140, 80, 4, 40)).setTo(255);
  mask(cv::Rect(260, 20, 8, 64)).setTo(255);                               // a bar two overlaps tall
  cv::circle(mask, {70, 180}, 30, cv::Scalar(255), cv::FILLED);            // a disc 61 px across
  cv::line(mask, {270, 150}, {330, 210}, cv::Scalar(255), 1, cv::LINE_8);  // one pixel wide
  for (const cv::Point c : {cv::Point(180, 30), cv::Point(300, 110), cv::Point(200, 200), cv::Point(15, 240)})
    cv::circle(mask, c, 5, cv::Scalar(255), cv::FILLED);
  LargeObjectScene s;
  s.image = cv::Mat(H, W, CV_8UC3, cv::Scalar::all(40));
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      if (mask.at<uint8_t>(y, x))
        s.image.at<cv::Vec3b>(y, x) = cv::Vec3b(255, uint8_t(80 + x * 170 / W), 255);
  s.n = cv::connectedComponents(mask, s.parts, 8, CV_32S) - 1;
  return s;
}

TEST_F(Pipeline, ObjectsLargerThanTheOverlapAreTheWholeImagesOnAnyWorldSize) {
  const LargeObjectScene scene = largeObjectScene();
  ASSERT_EQ(scene.n, 9);
  const std::string dir = root_ + "/instances_large";
  fs::create_directories(dir);
  writeImage(dir + "/large.tif", scene.image, SampleType::kU8);
  const std::string model = blobsAndGreenModel(root_);
  const std::string args =
      " -i " + dir + " -m " + model +
      " --task instances --window 64 --overlap 0.5 --batch_size 4 --threads 1 "
      "--save objects,objects_csv,objects_store,instances --classes green --no_progress -o ";
  const std::string out = root_ + "/out_large1";
  auto r = run(kTiler + args + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto e = *imageEntry(report(out), "large.tif");
  EXPECT_EQ(e["objects"], scene.n) << e;
  EXPECT_EQ(e["objects_at_window_edge"], 0) << e;
  // Each of the whole image's objects is one object, none split and none twice, IoU >= 0.99.
  cv::Mat got = ImageReader::open(out + "/large_instances.tif")->readRegion({0, 0, 352, 256});
  ASSERT_EQ(got.type(), CV_32S);
  std::map<std::pair<int, int>, int> both;  // (object, part) -> pixels
  std::map<int, int> object_pixels, part_pixels;
  for (int y = 0; y < 256; ++y)
    for (int x = 0; x < 352; ++x) {
      const int g = got.at<int32_t>(y, x), w = scene.parts.at<int32_t>(y, x);
      if (g) ++object_pixels[g];
      if (w) ++part_pixels[w];
      if (g && w) ++both[{g, w}];
    }
  EXPECT_EQ(int(object_pixels.size()), scene.n);
  std::map<int, int> matched;  // part -> object
  for (const auto& [pair, n] : both) {
    const auto [g, w] = pair;
    const double iou = double(n) / (object_pixels[g] + part_pixels[w] - n);
    if (iou < 0.5) continue;
    EXPECT_GE(iou, 0.99) << "object " << g << ", part " << w;
    EXPECT_TRUE(matched.emplace(w, g).second) << "part " << w << " is two objects";
  }
  EXPECT_EQ(int(matched.size()), scene.n);
  // The CSV: each object's score is its mean green over all its pixels, its area its pixel count.
  cv::Mat stats, centroids;
  std::istringstream csv(slurp(out + "/large_objects.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "id,class,score,area,centroid_x,centroid_y,x1,y1,x2,y2,prob_green");
  int rows = 0;
  while (std::getline(csv, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string v; std::getline(fields, v, ',');) f.push_back(v);
    ASSERT_EQ(f.size(), 11u) << line;
    const int id = std::stoi(f[0]);
    int part = 0;
    for (const auto& [w, g] : matched)
      if (g == id) part = w;
    ASSERT_GT(part, 0) << line;
    double green = 0, sx = 0;
    for (int y = 0; y < 256; ++y)
      for (int x = 0; x < 352; ++x)
        if (scene.parts.at<int32_t>(y, x) == part) {
          green += scene.image.at<cv::Vec3b>(y, x)[1] / 255.0;
          sx += x + 0.5;
        }
    EXPECT_EQ(std::stod(f[3]), part_pixels[part]) << line;
    EXPECT_NEAR(std::stod(f[2]), green / part_pixels[part], 1e-5) << line;
    EXPECT_NEAR(std::stod(f[4]), sx / part_pixels[part], 1e-6) << line;
    ++rows;
  }
  EXPECT_EQ(rows, scene.n);
  const auto geojson = nlohmann::json::parse(slurp(out + "/large_objects.geojson"));
  EXPECT_EQ(int(geojson["features"].size()), scene.n);
  // The store holds the joined objects too, each once, with the CSV's areas.
  r =
      run("/usr/bin/python3 -c \"import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("
          "'SELECT COUNT(*), SUM(area) FROM annotations').fetchone())\" " +
          out + "/large_objects.db");
  ASSERT_EQ(r.code, 0) << r.output;
  int64_t total = 0;
  for (const auto& [part, n] : part_pixels) total += n;
  EXPECT_NE(r.output.find("(" + std::to_string(scene.n) + ", " + std::to_string(total) + ".0)"),
            std::string::npos)
      << r.output;
  for (int ranks : {2, 3}) {
    const std::string other = root_ + "/out_large" + std::to_string(ranks);
    r = run(kCtrun + " --nproc_per_node " + std::to_string(ranks) + " --master_port 0 " + kTiler + args +
            other);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* file :
         {"large_objects.geojson", "large_objects.csv", "large_objects.db", "large_instances.tif"})
      EXPECT_TRUE(slurp(other + "/" + file) == slurp(out + "/" + file)) << ranks << " ranks: " << file;
  }
}

// An object taller than the band of rows the owner holds to join objects (three window heights) is counted
// in objects_at_window_edge, with a warning, and left out whole: none of its pixels is written, and the
// objects beside it are.
TEST_F(Pipeline, AnObjectTallerThanTheJoinBandIsCountedAndLeftOut) {
  const std::string dir = root_ + "/instances_tall", out = root_ + "/out_instances_tall";
  fs::create_directories(dir);
  cv::Mat image(256, 96, CV_8UC3, cv::Scalar::all(40));
  image(cv::Rect(40, 10, 6, 200)).setTo(cv::Scalar::all(230));  // 200 rows: more than 3 x 64
  image(cv::Rect(60, 100, 30, 6)).setTo(cv::Scalar::all(230));  // apart from it
  writeImage(dir + "/tall.tif", image, SampleType::kU8);
  auto r = run(kTiler + " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
               "/samples/models/instances.pt --task instances --window 64 --threads 1 --save instances "
               "--no_progress -o " +
               out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("taller than the 192 rows of the map held to join them"), std::string::npos)
      << r.output;
  const auto e = *imageEntry(report(out), "tall.tif");
  EXPECT_EQ(e["objects"], 1) << e;
  EXPECT_EQ(e["objects_at_window_edge"], 1) << e;
  cv::Mat got = ImageReader::open(out + "/tall_instances.tif")->readRegion({0, 0, 96, 256});
  EXPECT_EQ(cv::countNonZero(got(cv::Rect(40, 10, 6, 200))), 0);
  EXPECT_EQ(cv::countNonZero(got), 30 * 6);
}

// --save objects_store: TIAToolbox's SQLiteStore of the discs as Python's sqlite3 and SQLiteStore's own SQL
// read it (tests/objects_store_check.py): each object once, its area its pixel count, its R-tree box its
// outline's; the same bytes on 1 and 2 ranks.
TEST_F(Pipeline, InstancesStoreIsTiatoolboxsLayoutOnAnyWorldSize) {
  const DiscScene scene = discScene();
  const std::string dir = root_ + "/instances_store";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", scene.image, SampleType::kU8);
  const std::string args = " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
                           "/samples/models/instances.pt --task instances --window 128 --overlap 0.5 "
                           "--threads 1 --save objects,objects_store --no_progress -o ";
  const std::string out = root_ + "/out_store1", other = root_ + "/out_store2";
  auto r = run(kTiler + args + out);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("/usr/bin/python3 " + std::string(TILER_TEST_SOURCE_DIR) + "/tests/objects_store_check.py " + out +
          "/discs_objects.db 0,0,300,260");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["integrity"], "ok");
  ASSERT_EQ(int(j["rows"].size()), scene.n);
  std::multiset<double> want_areas, got_areas;
  for (int k = 1; k <= scene.n; ++k) want_areas.insert(cv::countNonZero(scene.parts == k));
  for (const auto& row : j["rows"]) {
    got_areas.insert(row["area"].get<double>());
    EXPECT_EQ(row["properties"]["area"], row["area"]);
    EXPECT_DOUBLE_EQ(row["cx"].get<double>(), row["geometry_cx"].get<double>());
    EXPECT_DOUBLE_EQ(row["properties"]["centroid_x"].get<double>(), row["cx"].get<double>());
  }
  EXPECT_EQ(got_areas, want_areas);
  EXPECT_EQ(int(j["bbox_keys"].size()), scene.n);  // the whole image's box finds them all
  r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + args + other);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(slurp(other + "/discs_objects.db") == slurp(out + "/discs_objects.db"));
}

// A mask over the left half (x < 150): the windows of columns 0 and 1 (128 px at a stride of 64) run, those
// of columns 2 to 4 do not, so exactly the parts whose centroid lies in columns 0 and 1's cores (x < 160) are
// found.
TEST_F(Pipeline, MaskedInstancesAreThoseOfTheWindowsThatRan) {
  const DiscScene scene = discScene();
  const std::string dir = root_ + "/instances_masked", out = root_ + "/out_instances_masked";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", scene.image, SampleType::kU8);
  cv::Mat half(scene.image.rows, scene.image.cols, CV_8U, cv::Scalar(0));
  half.colRange(0, half.cols / 2).setTo(255);
  cv::imwrite(root_ + "/left_half.png", half);
  auto r =
      run(kTiler + " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
          "/samples/models/instances.pt --task instances --window 128 --overlap 0.5 --threads 1 --mask " +
          root_ + "/left_half.png --mask_fraction 0.5 --save instances --no_progress -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  cv::Mat stats, centroids, want;
  cv::Mat grey;
  cv::cvtColor(scene.image, grey, cv::COLOR_RGB2GRAY);
  const int n = cv::connectedComponentsWithStats(grey > 100, want, stats, centroids, 8, CV_32S) - 1;
  int kept = 0;
  for (int k = 1; k <= n; ++k) {
    if (centroids.at<double>(k, 0) + 0.5 < 160) {
      ++kept;
    } else {
      want.setTo(0, want == k);
    }
  }
  ASSERT_GT(kept, 0);
  ASSERT_LT(kept, n);
  expectSameObjects(out + "/discs_instances.tif", want, kept);
  EXPECT_EQ(imageEntry(report(out), "discs.tif")->at("objects"), kept);
}

// At a coarser resolution (--mpp): the objects of the image as processed, each at its level-0 place.
TEST_F(Pipeline, InstancesAtACoarserResolutionAreInLevel0Pixels) {
  const DiscScene scene = discScene();
  const std::string dir = root_ + "/instances_mpp", out = root_ + "/out_instances_mpp";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", scene.image, SampleType::kU8);
  auto r = run(kTiler + " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
               "/samples/models/instances.pt --task instances --window 64 --overlap 0.5 --input_mpp 0.25 "
               "--mpp 0.5 --threads 1 --save objects_csv,instances --no_progress -o " +
               out);
  ASSERT_EQ(r.code, 0) << r.output;
  // The TIFF is the processed image's size; the CSV's centroids are the level-0 parts' centroids.
  cv::Mat tiff = ImageReader::open(out + "/discs_instances.tif")->readRegion({0, 0, 150, 130});
  EXPECT_EQ(tiff.size(), cv::Size(150, 130));
  cv::Mat stats, centroids, labels;
  cv::Mat grey;
  cv::cvtColor(scene.image, grey, cv::COLOR_RGB2GRAY);
  cv::connectedComponentsWithStats(grey > 100, labels, stats, centroids, 8, CV_32S);
  std::istringstream csv(slurp(out + "/discs_objects.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "id,class,score,area,centroid_x,centroid_y,x1,y1,x2,y2");
  std::vector<int> found(size_t(scene.n + 1), 0);
  while (std::getline(csv, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string v; std::getline(fields, v, ',');) f.push_back(v);
    ASSERT_GE(f.size(), 6u) << line;
    const double cx = std::stod(f[4]), cy = std::stod(f[5]), area = std::stod(f[3]);
    for (int k = 1; k <= scene.n; ++k)
      if (std::hypot(cx - centroids.at<double>(k, 0) - 0.5, cy - centroids.at<double>(k, 1) - 0.5) < 1.0) {
        ++found[size_t(k)];
        EXPECT_NEAR(area, stats.at<int>(k, cv::CC_STAT_AREA), 0.1 * stats.at<int>(k, cv::CC_STAT_AREA) + 8)
            << line;
      }
  }
  for (int k = 1; k <= scene.n; ++k) EXPECT_EQ(found[size_t(k)], 1) << "part " << k;
}

// What an instance model must not give: each is a clear error, of the model (exit 1) or of the image (exit
// 2), and nothing is half-written.
TEST_F(Pipeline, InstanceMapsThatMakeNoSenseAreClearErrors) {
  const std::string dir = root_ + "/instances_bad";
  fs::create_directories(dir);
  writeImage(dir + "/grey.tif", cv::Mat(96, 96, CV_8UC3, cv::Scalar::all(200)), SampleType::kU8);
  const auto tiler = [&](const std::string& name, const std::string& forward, const std::string& extra = "") {
    return run(kTiler + " -i " + dir + " -m " + saveDetector(root_ + "/" + name + ".pt", forward) + " -o " +
               root_ + "/out_" + name + " --task instances --window 64 --threads 1 --no_progress" + extra);
  };
  auto r = tiler("inst_half", "def forward(self, x):\n    return x.mean([1], True) * 0.5\n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("grey.tif': window 0 (column 0, row 0): pixel (0, 0) of the instance map is 0.39"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/out_inst_half/grey_objects.geojson"));
  EXPECT_TRUE(fs::is_empty(root_ + "/out_inst_half/") ||
              !fs::exists(root_ + "/out_inst_half/grey_objects.geojson.partial"));
  r = tiler("inst_huge", "def forward(self, x):\n    return x.mean([1], True) * 0.0 + 4294967296.0\n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("of the instance map is 4294967296, not an object id"), std::string::npos)
      << r.output;
  r = tiler("inst_vector", "def forward(self, x):\n    return x.mean([2, 3])\n");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--task instances needs an instance map [batch, 1 + K, h, w]"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("the output is [1, 3]"), std::string::npos) << r.output;
  const std::string ids = "def forward(self, x):\n    return (x.mean([1], True) > 0.5).float()\n";
  r = tiler("inst_tta", ids, " --tta flip");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--tta is for maps and vectors, not --task instances' ids"), std::string::npos)
      << r.output;
  r = tiler("inst_act", ids, " --activation sigmoid");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("would turn --task instances' ids into fractions"), std::string::npos) << r.output;
  r = tiler("inst_classes", ids, " --classes a,b");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--classes names 2 class(es), the model gives 0 class channel(s)"),
            std::string::npos)
      << r.output;
  // --save instances says the task. The one object fills every window: each window sees it cut by its
  // edges inside the image, and their parts are joined into the one object.
  r = run(kTiler + " -i " + dir + " -m " + root_ + "/inst_tta.pt -o " + root_ +
          "/out_inst_saved --save instances --window 64 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 0) << r.output;
  const auto e = *imageEntry(report(root_ + "/out_inst_saved"), "grey.tif");
  EXPECT_EQ(e["objects"], 1) << e;
  EXPECT_EQ(e["objects_at_window_edge"], 0) << e;
  EXPECT_EQ(
      cv::countNonZero(
          ImageReader::open(root_ + "/out_inst_saved/grey_instances.tif")->readRegion({0, 0, 96, 96}) == 1),
      96 * 96);
  r = run(kTiler + " -i " + dir + " -m " + root_ + "/inst_tta.pt -o " + root_ +
          "/out_inst_coco --task instances --save coco --window 64 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--save coco is an output of --task detect, not of --task instances"),
            std::string::npos)
      << r.output;
}

// Ids are read as the model gives them: int64 ids past float32's 2^24 stay apart (16777216 and 16777217 are
// one float), and 2^31 - 1 is an id.
TEST_F(Pipeline, InstanceIdsPastFloatsRangeStayApart) {
  const std::string dir = root_ + "/instances_int", out = root_ + "/out_instances_int";
  fs::create_directories(dir);
  writeImage(dir + "/grey.tif", cv::Mat(96, 96, CV_8UC3, cv::Scalar::all(200)), SampleType::kU8);
  // Three 8x4 objects side by side in every window's middle.
  const std::string model = saveDetector(root_ + "/int_ids.pt",
                                         "def forward(self, x):\n"
                                         "    ids = (x[:, :1] * 0).long()\n"
                                         "    ids[:, :, 24:28, 28:36] = 2147483647\n"
                                         "    ids[:, :, 28:32, 28:36] = 16777216\n"
                                         "    ids[:, :, 32:36, 28:36] = 16777217\n"
                                         "    return ids\n");
  auto r = run(kTiler + " -i " + dir + " -m " + model + " -o " + out +
               " --task instances --window 64 --threads 1 --save objects_csv --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto e = *imageEntry(report(out), "grey.tif");
  EXPECT_EQ(e["objects"], 12) << e;  // 3 in each of the 2 x 2 windows
  std::istringstream csv(slurp(out + "/grey_objects.csv"));
  std::string line;
  std::getline(csv, line);
  while (std::getline(csv, line))
    EXPECT_NE(line.find(",,,32,"), std::string::npos) << line;  // 32 pixels each
}

// An instance model whose maps have another scale than its windows runs on MONAI's grid by default (the
// lattice lays windows out in input pixels: every image failed with "a lattice grid is for per-window
// models"); asking for the lattice with it, or for what only a stitched map takes, stops at set-up (exit 1),
// before any image.
TEST_F(Pipeline, InstanceModelsAtAnotherScaleAndMapFlagsAreSettledAtSetUp) {
  const std::string dir = root_ + "/instances_scaled";
  fs::create_directories(dir);
  cv::Mat disc(96, 96, CV_8UC3, cv::Scalar::all(0));
  cv::circle(disc, {48, 48}, 10, cv::Scalar::all(255), -1);
  writeImage(dir + "/disc.tif", disc, SampleType::kU8);
  const std::string ids = "(x.mean([1], True) > 0.5).float()";
  const std::string doubled =
      saveDetector(root_ + "/inst_x2.pt", "def forward(self, x):\n    return " + ids +
                                              ".repeat_interleave(2, 2).repeat_interleave(2, 3)\n");
  const std::string halved = saveDetector(root_ + "/inst_half_scale.pt",
                                          "def forward(self, x):\n    return " + ids + "[:, :, ::2, ::2]\n");
  const auto tiler = [&](const std::string& model, const std::string& out, const std::string& extra = "") {
    return run(kTiler + " -i " + dir + " -m " + model + " -o " + root_ + "/" + out +
               " --task instances --window 64 --threads 1 --no_progress" + extra);
  };
  const std::vector<std::pair<std::string, std::string>> scaled = {{doubled, "out_inst_x2"},
                                                                   {halved, "out_inst_half_scale"}};
  for (const auto& [model, out] : scaled) {
    auto r = tiler(model, out);
    EXPECT_EQ(r.code, 0) << r.output;
    const nlohmann::json written = report(root_ + "/" + out);
    const auto* e = imageEntry(written, "disc.tif");
    ASSERT_NE(e, nullptr) << r.output;
    EXPECT_EQ((*e)["objects"], 1) << *e;
    r = tiler(model, out + "_lattice", " --edge lattice");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("--edge lattice needs maps of the window's size; '" + model + "' gives maps at"),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(root_ + "/" + out + "_lattice/disc_objects.geojson"));
  }
  for (const std::string flag : {"--blend crop", "--format png", "--probs_dtype u8", "--stitch device"}) {
    auto r = tiler(doubled, "out_inst_flag", " " + flag);
    EXPECT_EQ(r.code, 1) << flag << "\n" << r.output;
    const std::string name = flag.substr(0, flag.find(' '));
    EXPECT_NE(r.output.find(name + " is for a stitched map (--task segment); --task instances finds objects"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
}  // namespace tiler::e2e
