// Instance objects: outlines exact to the pixel edges (areas equal pixel counts, holes kept, parts that meet
// at a corner apart), objects measured from their pixels, ids that are no ids refused, and each object kept
// once, by the window whose core holds its centroid, in any arrival order, into GeoJSON, CSV and a uint32
// TIFF equal to the image's own objects; objects a window edge cuts joined whole (rings and C shapes too),
// those taller than the band counted, never written in pieces.
#include "tiler/writers/instances.hpp"

#include <gtest/gtest.h>
#include <opencv2/imgproc.hpp>

#include <spdlog/fmt/fmt.h>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

double polygonArea(const OutlinePolygon& polygon) {
  double area = 0;
  for (const auto& ring : polygon) area += ringArea(ring);
  return area;
}

// Whether lattice point p lies inside rectilinear `ring` (not on it): a ray to the right crosses its
// vertical sides an odd number of times (each side half-open in y).
bool insideRing(const OutlineRing& ring, std::array<int32_t, 2> p) {
  bool inside = false;
  for (size_t i = 0; i < ring.size(); ++i) {
    const auto& a = ring[i];
    const auto& b = ring[(i + 1) % ring.size()];
    if (a[0] == b[0] && a[0] > p[0] && std::min(a[1], b[1]) <= p[1] && p[1] < std::max(a[1], b[1]))
      inside = !inside;
  }
  return inside;
}

// What GEOS would find wrong with an outline along pixel edges, empty when it is valid: every ring simple
// (no lattice point passed twice, so it neither crosses nor touches itself), the outer ring first and
// positive, holes negative with every corner inside or on it, and no pixel side on two rings (rings may
// share points only).
std::string outlineProblem(const OutlinePolygon& polygon) {
  if (polygon.empty() || ringArea(polygon[0]) <= 0) return "no outer ring first";
  std::set<std::array<int32_t, 3>> sides;  // (x, y, 0 across / 1 down) of every unit side
  std::set<std::array<int32_t, 2>> outer;  // the lattice points on the outer ring
  for (size_t r = 0; r < polygon.size(); ++r) {
    const OutlineRing& ring = polygon[r];
    if (ring.size() < 4)
      return "ring " + std::to_string(r) + " has " + std::to_string(ring.size()) + " corners";
    if (r > 0 && ringArea(ring) >= 0) return "hole " + std::to_string(r) + " is not negative";
    std::set<std::array<int32_t, 2>> passed;
    for (size_t i = 0; i < ring.size(); ++i) {
      auto p = ring[i];
      const auto& b = ring[(i + 1) % ring.size()];
      if ((p[0] != b[0]) == (p[1] != b[1]))
        return "ring " + std::to_string(r) + " has a side that is not a pixel edge";
      if (r > 0 && !insideRing(polygon[0], p) && !outer.count(p))
        return "hole " + std::to_string(r) + " reaches outside the outer ring";
      const int32_t dx = b[0] > p[0] ? 1 : b[0] < p[0] ? -1 : 0, dy = b[1] > p[1] ? 1 : b[1] < p[1] ? -1 : 0;
      for (; p != b; p = {p[0] + dx, p[1] + dy}) {
        if (!passed.insert(p).second)
          return "ring " + std::to_string(r) + " passes (" + std::to_string(p[0]) + ", " +
                 std::to_string(p[1]) + ") twice";
        const std::array<int32_t, 3> side = {std::min(p[0], p[0] + dx), std::min(p[1], p[1] + dy), dy != 0};
        if (!sides.insert(side).second) return "two rings share a side";
      }
    }
    if (r == 0) outer = passed;
  }
  return "";
}

// A mask from rows of '#' (in) and '.' (out).
std::vector<uint8_t> drawnMask(const std::vector<std::string>& rows) {
  std::vector<uint8_t> mask;
  for (const std::string& row : rows)
    for (char c : row) mask.push_back(c == '#');
  return mask;
}

TEST(Instances, OutlinesFollowPixelEdgesKeepHolesAndPartsThatMeetAtACornerApart) {
  // A 3x3 square with a hole in the middle: one polygon, an outer ring of 4 corners and a hole of 4.
  const std::vector<uint8_t> ring = {1, 1, 1, 1, 0, 1, 1, 1, 1};
  auto polygons = traceOutlines(ring.data(), 3, 3);
  ASSERT_EQ(polygons.size(), 1u);
  ASSERT_EQ(polygons[0].size(), 2u);
  EXPECT_EQ(polygons[0][0], (OutlineRing{{0, 0}, {3, 0}, {3, 3}, {0, 3}}));
  EXPECT_EQ(ringArea(polygons[0][0]), 9);
  EXPECT_EQ(ringArea(polygons[0][1]), -1);
  // Two pixels that meet only at a corner: two parts, each its own square.
  const std::vector<uint8_t> diagonal = {1, 0, 0, 1};
  polygons = traceOutlines(diagonal.data(), 2, 2);
  ASSERT_EQ(polygons.size(), 2u);
  EXPECT_EQ(polygons[0], (OutlinePolygon{{{0, 0}, {1, 0}, {1, 1}, {0, 1}}}));
  EXPECT_EQ(polygons[1], (OutlinePolygon{{{1, 1}, {2, 1}, {2, 2}, {1, 2}}}));
  EXPECT_TRUE(traceOutlines(diagonal.data(), 0, 0).empty());
  // Random masks: one polygon per 4-connected part, each with the part's pixel count as its area.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int w = 1 + int(rng() % 23), h = 1 + int(rng() % 19);
    const double density = 0.2 + 0.6 * double(rng() % 100) / 100.0;
    cv::Mat mask(h, w, CV_8U);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) mask.at<uint8_t>(y, x) = double(rng() % 1000) / 1000.0 < density;
    cv::Mat parts;
    const int n = cv::connectedComponents(mask, parts, 4, CV_32S) - 1;
    polygons = traceOutlines(mask.data, w, h);
    ASSERT_EQ(int(polygons.size()), n) << "trial " << trial;
    std::multiset<int64_t> want, got;
    for (int k = 1; k <= n; ++k) want.insert(cv::countNonZero(parts == k));
    for (const auto& polygon : polygons) {
      EXPECT_EQ(outlineProblem(polygon), "") << "trial " << trial;
      got.insert(int64_t(polygonArea(polygon)));
    }
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

// Background that meets the outside, or other background, only at a corner: the outer ring and holes that
// touch at that point, never a ring that touches itself (shapely and ogrinfo call that "Ring
// Self-intersection").
TEST(Instances, OutlinesWhereBackgroundMeetsAtACornerAreSimpleRingsThatTouch) {
  // A pocket whose corner meets the outside: the outer ring, and the pocket a hole touching it at (2, 2).
  auto polygons = traceOutlines(drawnMask({"###.",  //
                                           "#.#.",  //
                                           "##..",  //
                                           "...."})
                                    .data(),
                                4, 4);
  ASSERT_EQ(polygons.size(), 1u);
  EXPECT_EQ(polygons[0], (OutlinePolygon{{{0, 0}, {3, 0}, {3, 2}, {2, 2}, {2, 3}, {0, 3}},  //
                                         {{1, 1}, {1, 2}, {2, 2}, {2, 1}}}));
  EXPECT_EQ(outlineProblem(polygons[0]), "");
  // A chain of pockets corner to corner out to the outside, background in an X inside a block, two pockets
  // meeting at a corner, a ring whose gap closes at a corner, and parts in an X (each its own polygon) in a
  // frame's hole: each a polygon of simple rings.
  struct Case {
    std::vector<std::string> rows;
    size_t parts, holes;  // the first part's
  };
  const std::vector<Case> cases = {
      {{"#####", "#.###", "##.##", "###.#", "####."}, 1, 3},
      {{"#####", "#.#.#", "##.##", "#.#.#", "#####"}, 1, 5},
      {{"####", "#.##", "##.#", "####"}, 1, 2},
      {{"####.", "#..#.", "#..#.", "###..", "....."}, 1, 1},
      {{"#######", "#.....#", "#.#.#.#", "#..#..#", "#.#.#.#", "#.....#", "#######"}, 6, 1},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const int64_t w = int64_t(cases[c].rows[0].size()), h = int64_t(cases[c].rows.size());
    const std::vector<uint8_t> mask = drawnMask(cases[c].rows);
    polygons = traceOutlines(mask.data(), w, h);
    ASSERT_EQ(polygons.size(), cases[c].parts) << "case " << c;
    EXPECT_EQ(polygons[0].size(), 1 + cases[c].holes) << "case " << c;
    double area = 0;
    for (const OutlinePolygon& polygon : polygons) {
      EXPECT_EQ(outlineProblem(polygon), "") << "case " << c;
      area += polygonArea(polygon);
    }
    EXPECT_EQ(area, double(std::count(mask.begin(), mask.end(), 1))) << "case " << c;
  }
}

TEST(Instances, ObjectsOfAWindowAreMeasuredFromTheirPixels) {
  // 6x4, ids then two class channels: object 7 is an L of 4 pixels, object 3 two pixels apart.
  const std::vector<float> ids = {0, 7, 0, 0, 0, 3,  //
                                  0, 7, 0, 0, 0, 0,  //
                                  0, 7, 7, 0, 0, 0,  //
                                  0, 0, 0, 0, 3, 0};
  std::vector<double> values(ids.begin(), ids.end());
  for (int k = 0; k < 2; ++k)
    for (size_t i = 0; i < ids.size(); ++i) values.push_back(ids[i] == 7 ? double(k) : double(1 - k) + 0.5);
  const auto objects =
      objectsOfWindow(values.data(), 3, 4, 6, {0, 0, 6, 4}, [] { return std::string("here: "); });
  ASSERT_EQ(objects.size(), 2u);
  const WindowObject& l = objects[0];
  EXPECT_EQ(l.id, 7);
  EXPECT_EQ(l.pixels, 4);
  EXPECT_EQ((std::array<int64_t, 4>{l.x0, l.y0, l.x1, l.y1}), (std::array<int64_t, 4>{1, 0, 3, 3}));
  EXPECT_DOUBLE_EQ(l.cx, (1.5 * 3 + 2.5) / 4);
  EXPECT_DOUBLE_EQ(l.cy, (0.5 + 1.5 + 2.5 + 2.5) / 4);
  EXPECT_EQ(l.class_means, (std::vector<double>{0, 1}));
  const WindowObject& two = objects[1];
  EXPECT_EQ(two.id, 3);
  EXPECT_EQ(two.pixels, 2);
  EXPECT_EQ((std::array<int64_t, 4>{two.x0, two.y0, two.x1, two.y1}), (std::array<int64_t, 4>{4, 0, 6, 4}));
  EXPECT_EQ(two.class_means, (std::vector<double>{1.5, 0.5}));
  EXPECT_EQ(two.runs.size(), 2u);
}

TEST(Instances, AnIdThatIsNoIdFailsNamingItsPixelAndValue) {
  for (double bad : {0.5, -1.0, std::numeric_limits<double>::quiet_NaN(), 2147483648.0, 2147483647.5,
                     std::numeric_limits<double>::infinity()}) {
    std::vector<double> ids(12, 0.0);
    ids[7] = bad;
    try {
      objectsOfWindow(ids.data(), 1, 3, 4, {0, 0, 4, 3}, [] { return std::string("'x.tif': window 5: "); });
      ADD_FAILURE() << bad << ": no error";
    } catch (const IoError& e) {
      // The value as it is, never rounded into one that looks like an id.
      EXPECT_NE(e.message().find("'x.tif': window 5: pixel (3, 1) of the instance map is " +
                                 fmt::format("{}", bad) + ", not an object id"),
                std::string::npos)
          << e.message();
    }
  }
  // Every id below 2^31 is one, each its own: 2^24 and 2^24 + 1 (one float) are two objects.
  const std::vector<double> ids = {2147483647, 16777216, 16777217, 0};
  const auto objects = objectsOfWindow(ids.data(), 1, 2, 2, {0, 0, 2, 2}, [] { return std::string(); });
  ASSERT_EQ(objects.size(), 3u);
  EXPECT_EQ(objects[0].id, 2147483647);
  EXPECT_EQ(objects[1].id, 16777216);
  EXPECT_EQ(objects[2].id, 16777217);
  EXPECT_EQ(objects[2].pixels, 1);
}

// A 40x30 image of 16x16 windows at stride 8 (starts 0, 8, 16, 24 by 0, 8, 14), level 0 at twice its
// pixels, and objects drawn into `global` (0: background).
struct Scene {
  CatalogImage img;
  cv::Mat global;  // int32, 30 x 40
  std::string dir;
};

Scene scene(const std::string& name) {
  Scene s;
  s.dir = test::scratchDir(name);
  s.img.input = s.dir + "/slide.png";
  s.img.info.width = 40;
  s.img.info.height = 30;
  s.img.info.format = "png";
  s.img.info.levels = {{80, 60, 1.0}};
  s.img.resolution.downsample = 2.0;
  s.img.grid = WindowGrid(40, 30, GridSpec{16, 16, 0.5, 0.5});
  s.img.outputs["objects"] = s.dir + "/slide_objects.geojson";
  s.img.outputs["objects_csv"] = s.dir + "/slide_objects.csv";
  s.img.outputs["instances"] = s.dir + "/slide_instances.tif";
  s.global = cv::Mat::zeros(30, 40, CV_32S);
  return s;
}

// Window w's map as a model would give it: the objects it sees with ids of its own (global id x 10 + w
// mod 7 + 1), then one class channel (the object's id / 10) and its opposite.
std::vector<double> windowMap(const Scene& s, int64_t w) {
  const Rect r = s.img.grid.imageWindow(w);
  std::vector<double> map(3 * 16 * 16, 0.0);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x) {
      const int64_t gx = r.x + x, gy = r.y + y;
      if (gx < 0 || gy < 0 || gx >= 40 || gy >= 30) continue;
      const int id = s.global.at<int32_t>(int(gy), int(gx));
      if (id == 0) continue;
      map[size_t(y * 16 + x)] = double(id * 10 + w % 7 + 1);
      map[size_t(256 + y * 16 + x)] = double(float(id) / 10);
      map[size_t(512 + y * 16 + x)] = -double(float(id) / 10);
    }
  return map;
}

// A map as InstanceOutputs::add takes it (the interface of every window consumer).
std::vector<float> asFloats(const std::vector<double>& map) {
  return std::vector<float>(map.begin(), map.end());
}

InstanceOptions instanceOptions() {
  InstanceOptions o;
  o.kinds = {"objects", "objects_csv", "instances"};
  o.channels = 3;
  o.height = o.width = 16;
  o.classes = {{"near", {255, 0, 0}, true}, {"far", {0, 0, 255}, true}};
  return o;
}

// The scene object of each object of an instance TIFF (an int32 map of `global`'s size): empty, with a
// failure, unless the TIFF has an object exactly where the scene has one, each scene object one TIFF object
// (none split, none written twice).
std::map<int, int> sceneIds(const cv::Mat& tiff, const cv::Mat& global) {
  std::map<int, int> to_scene, to_object;
  if (tiff.type() != CV_32S || tiff.size() != global.size()) {
    ADD_FAILURE() << "the TIFF is not an int32 map of the scene's size";
    return {};
  }
  for (int y = 0; y < global.rows; ++y)
    for (int x = 0; x < global.cols; ++x) {
      const int got = tiff.at<int32_t>(y, x), want = global.at<int32_t>(y, x);
      if ((got == 0) != (want == 0) || (got != 0 && (to_scene.emplace(got, want).first->second != want ||
                                                     to_object.emplace(want, got).first->second != got))) {
        ADD_FAILURE() << "pixel " << x << "," << y << ": object " << got << ", scene object " << want;
        return {};
      }
    }
  return to_scene;
}

TEST(Instances, EachObjectIsKeptOnceByTheWindowWhoseCoreHoldsItsCentroidInAnyOrder) {
  Scene s = scene("instances_core");
  // A disc across four windows' overlaps, a square at the image's corner, an L whose bounding box is not
  // its pixels, two squares touching each other.
  cv::circle(s.global, {20, 14}, 3, cv::Scalar(1), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(36, 26, 4, 4), cv::Scalar(2), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(2, 2, 2, 5), cv::Scalar(3), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(4, 5, 3, 2), cv::Scalar(3), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(28, 4, 3, 3), cv::Scalar(4), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(31, 4, 3, 3), cv::Scalar(5), cv::FILLED);
  std::string first_csv, first_geojson;
  for (int pass = 0; pass < 2; ++pass) {
    // Maps found by the owner in order, then records made by the ranks that ran the windows, backwards.
    InstanceOutputs out(s.img, instanceOptions());
    for (int64_t k = 0; k < s.img.grid.count(); ++k) {
      const int64_t w = pass == 0 ? k : s.img.grid.count() - 1 - k;
      if (pass == 0)
        out.add(w, asFloats(windowMap(s, w)).data());
      else
        out.addRecord(
            w, encodeWindowObjects(keepWindowObjects(s.img, instanceOptions(), w, windowMap(s, w).data())));
    }
    EXPECT_TRUE(out.done());
    EXPECT_EQ(out.heldWindows(), 0u);
    EXPECT_EQ(out.commit().size(), 3u);
    EXPECT_EQ(out.objects(), (std::array<int64_t, 2>{5, 0}));
    const std::string csv = test::slurp(s.dir + "/slide_objects.csv");
    const std::string geojson = test::slurp(s.dir + "/slide_objects.geojson");
    // The instance TIFF: the scene's objects, renumbered 1.. in the order their windows kept them.
    cv::Mat tiff = ImageReader::open(s.dir + "/slide_instances.tif")->readRegion({0, 0, 40, 30});
    ASSERT_EQ(tiff.type(), CV_32S);
    const std::map<int, int> to_scene = sceneIds(tiff, s.global);
    EXPECT_EQ(to_scene.size(), 5u);
    const auto j = nlohmann::json::parse(geojson);
    ASSERT_EQ(j["features"].size(), 5u);
    for (const auto& f : j["features"]) {
      const int id = f["id"].get<int>(), scene_id = to_scene.at(id);
      EXPECT_EQ(f["properties"]["id"], id) << "the id as a property too, where GeoPandas reads it";
      const double pixels = double(cv::countNonZero(s.global == scene_id));
      // Level 0 is twice the image: areas four times the pixel count, the outline's area the same.
      EXPECT_EQ(f["properties"]["measurements"]["area"].get<double>(), 4 * pixels);
      double outline = 0;
      for (const auto& ring : f["geometry"]["coordinates"]) {
        OutlineRing r;
        for (const auto& p : ring) r.push_back({int32_t(p[0].get<double>()), int32_t(p[1].get<double>())});
        r.pop_back();
        outline += ringArea(r);
      }
      EXPECT_EQ(outline, 4 * pixels) << f.dump();
      EXPECT_EQ(f["properties"]["classification"]["name"], "near");
      EXPECT_EQ(f["properties"]["measurements"]["prob_near"].get<float>(), float(scene_id) / 10);
    }
    if (pass == 0) {
      first_csv = csv;
      first_geojson = geojson;
      // The disc (r 3, 29 pixels) with its centroid at pixel (20.5, 14.5), level 0 (41, 29).
      EXPECT_NE(csv.find(",near,0.1,116,41,29,"), std::string::npos) << csv;
    } else {
      EXPECT_EQ(csv, first_csv);
      EXPECT_EQ(geojson, first_geojson);
    }
    for (const char* f : {"/slide_objects.csv", "/slide_objects.geojson", "/slide_instances.tif"})
      fs::remove(s.dir + f);
  }
}

TEST(Instances, AnObjectLargerThanTheOverlapIsJoinedOnceWhole) {
  Scene s = scene("instances_large");
  // 14 px wide across windows 8 px apart: every window that sees it sees it cut.
  cv::rectangle(s.global, cv::Rect(13, 10, 14, 4), cv::Scalar(1), cv::FILLED);
  InstanceOutputs out(s.img, instanceOptions());
  for (int64_t w = 0; w < s.img.grid.count(); ++w) out.add(w, asFloats(windowMap(s, w)).data());
  out.commit();
  EXPECT_EQ(out.objects(), (std::array<int64_t, 2>{1, 0}));
  const auto j = nlohmann::json::parse(test::slurp(s.dir + "/slide_objects.geojson"));
  ASSERT_EQ(j["features"].size(), 1u);
  EXPECT_EQ(j["features"][0]["properties"]["measurements"]["area"].get<double>(), 4 * 14 * 4);
  cv::Mat tiff = ImageReader::open(s.dir + "/slide_instances.tif")->readRegion({0, 0, 40, 30});
  EXPECT_EQ(cv::countNonZero(tiff == 1), 14 * 4);
  EXPECT_EQ(cv::countNonZero(tiff), 14 * 4);
}

TEST(Instances, ARecordIsTheWindowsObjectsAndNothingElse) {
  Scene s = scene("instances_record");
  // Window 5 (column 1, row 1: image [8, 24) both ways) keeps the disc (centroid (15.5, 14.5): its core is
  // [12, 20) x [12, 19)), not the square (centroid y 21: row 2's).
  cv::circle(s.global, {15, 14}, 3, cv::Scalar(1), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(16, 20, 2, 2), cv::Scalar(2), cv::FILLED);
  std::vector<double> map = windowMap(s, 5);
  map[256 + 14 * 16 + 5] = std::numeric_limits<double>::quiet_NaN();  // a class score
  const WindowObjects objects = keepWindowObjects(s.img, instanceOptions(), 5, map.data());
  ASSERT_EQ(objects.kept.size(), 1u);
  EXPECT_EQ(objects.non_finite, 1);
  const std::string record = encodeWindowObjects(objects);
  const WindowObjects back = decodeWindowObjects(record, "here: ");
  EXPECT_EQ(encodeWindowObjects(back), record);
  EXPECT_EQ(back.kept[0].object.runs, objects.kept[0].object.runs);
  EXPECT_EQ(back.kept[0].outlines, objects.kept[0].outlines);
  EXPECT_EQ(back.kept[0].object.class_means.size(), 2u);
  EXPECT_EQ(back.non_finite, 1);
  // Cut short anywhere, or with bytes to spare: an error naming where, never a crash.
  for (size_t n : {size_t(0), size_t(7), size_t(30), record.size() / 2, record.size() - 1}) {
    try {
      decodeWindowObjects(record.substr(0, n), "'x.tif': window 5: ");
      ADD_FAILURE() << n << " bytes: no error";
    } catch (const IoError& e) {
      EXPECT_NE(e.message().find("'x.tif': window 5: a record of window objects"), std::string::npos)
          << e.message();
    }
  }
  EXPECT_THROW(decodeWindowObjects(record + "x", "here: "), IoError);
  // Ids alone (no class channels): empty arrays travel too.
  InstanceOptions ids_only = instanceOptions();
  ids_only.channels = 1;
  ids_only.classes.clear();
  const WindowObjects plain = keepWindowObjects(s.img, ids_only, 5, map.data());
  ASSERT_EQ(plain.kept.size(), 1u);
  EXPECT_TRUE(plain.kept[0].object.class_means.empty());
  EXPECT_EQ(encodeWindowObjects(decodeWindowObjects(encodeWindowObjects(plain), "here: ")),
            encodeWindowObjects(plain));
  // A record made for a model of other classes does not reach the writers.
  InstanceOptions one_class = instanceOptions();
  one_class.channels = 2;
  one_class.classes.pop_back();
  InstanceOutputs out(s.img, one_class);
  try {
    out.addRecord(5, record);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("window 5: a record of window objects does not fit this image's 1 classes"),
              std::string::npos)
        << e.message();
  }
}

// Every window of the scene through records, as the pipeline sends them (`edit` changes each window's map
// first), committed.
void writeScene(const Scene& s, const std::function<void(int64_t, std::vector<double>&)>& edit = {}) {
  InstanceOutputs out(s.img, instanceOptions());
  for (int64_t w = 0; w < s.img.grid.count(); ++w) {
    std::vector<double> map = windowMap(s, w);
    if (edit) edit(w, map);
    out.addRecord(w, encodeWindowObjects(keepWindowObjects(s.img, instanceOptions(), w, map.data())));
  }
  out.commit();
}

// Draws rows of '#' into the scene as object `id`, from (x, y).
void drawObject(Scene& s, int x, int y, const std::vector<std::string>& rows, int id) {
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t c = 0; c < rows[r].size(); ++c)
      if (rows[r][c] == '#') s.global.at<int32_t>(y + int(r), x + int(c)) = id;
}

// A GeoJSON outline back in the scene's pixels (level 0 is twice them).
std::vector<OutlinePolygon> scenePolygons(const nlohmann::json& geometry) {
  const bool multi = geometry["type"] == "MultiPolygon";
  std::vector<OutlinePolygon> polygons;
  for (const auto& rings :
       multi ? geometry["coordinates"] : nlohmann::json::array({geometry["coordinates"]})) {
    OutlinePolygon& polygon = polygons.emplace_back();
    for (const auto& ring : rings) {
      OutlineRing& r = polygon.emplace_back();
      for (const auto& p : ring)
        r.push_back({int32_t(p[0].get<double>() / 2), int32_t(p[1].get<double>() / 2)});
      EXPECT_EQ(r.front(), r.back()) << "a GeoJSON ring is closed";
      r.pop_back();
    }
  }
  return polygons;
}

// A scene of `width` x `height` pixels in windows of 16 at a stride of 8 (an overlap of 8), level 0 at twice
// its pixels.
Scene largeScene(const std::string& name, int width, int height) {
  Scene s = scene(name);
  s.img.info.width = width;
  s.img.info.height = height;
  s.img.info.levels = {{2 * width, 2 * height, 1.0}};
  s.img.grid = WindowGrid(width, height, GridSpec{16, 16, 0.5, 0.5});
  s.global = cv::Mat::zeros(height, width, CV_32S);
  return s;
}

// Window w's map as a connected-components model gives it: every 8-connected piece of an object that the
// window sees is an object of its own (ids 1, 2, ... in the window), then a class channel that grows with
// the image's x (x / width) and its complement, so that an object's score is the mean over all its pixels.
std::vector<double> componentMap(const Scene& s, int64_t w) {
  const Rect r = s.img.grid.imageWindow(w);
  std::vector<double> map(3 * 16 * 16, 0.0);
  cv::Mat view = cv::Mat::zeros(16, 16, CV_32S);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x) {
      const int64_t gx = r.x + x, gy = r.y + y;
      if (gx < 0 || gy < 0 || gx >= s.global.cols || gy >= s.global.rows) continue;
      view.at<int32_t>(y, x) = s.global.at<int32_t>(int(gy), int(gx));
      map[size_t(256 + y * 16 + x)] = double(gx) / s.global.cols;
      map[size_t(512 + y * 16 + x)] = 1 - double(gx) / s.global.cols;
    }
  std::set<int> ids(view.begin<int32_t>(), view.end<int32_t>());
  int next = 1;
  for (int id : ids) {
    if (id == 0) continue;
    cv::Mat pieces;
    const int n = cv::connectedComponents(view == id, pieces, 8, CV_32S);
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x)
        if (pieces.at<int32_t>(y, x) > 0) map[size_t(y * 16 + x)] = next + pieces.at<int32_t>(y, x) - 1;
    next += n - 1;
  }
  return map;
}

// The scene's objects through records in the given order of windows, committed.
void writeComponents(const Scene& s, bool backwards) {
  InstanceOutputs out(s.img, instanceOptions());
  const int64_t n = s.img.grid.count();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t w = backwards ? n - 1 - k : k;
    out.addRecord(
        w, encodeWindowObjects(keepWindowObjects(s.img, instanceOptions(), w, componentMap(s, w).data())));
  }
  EXPECT_EQ(out.heldWindows(), 0u);
  out.commit();
}

// Objects of up to three overlaps, a ring whose two sides a window sees apart and a C whose arms a window
// sees apart (they meet only in a neighbouring window), two such objects that touch, and a small one: each
// written once, whole, its measurements those of all its pixels, in any order the windows arrive.
TEST(Instances, ObjectsLargerThanTheOverlapAreJoinedWholeWhateverTheirShape) {
  Scene s = largeScene("instances_join", 72, 48);
  cv::rectangle(s.global, cv::Rect(44, 4, 14, 24), cv::Scalar(1), cv::FILLED);  // a ring 3 px thick
  cv::rectangle(s.global, cv::Rect(47, 7, 8, 18), cv::Scalar(0), cv::FILLED);
  drawObject(s, 8, 26,
             {"########################", "########################", "########################", "###",
              "###", "###", "###", "###", "###", "###", "###", "########################",
              "########################", "########################"},
             2);  // a C open to the right, 24 x 14
  cv::rectangle(s.global, cv::Rect(2, 42, 24, 4), cv::Scalar(3), cv::FILLED);   // a bar of three overlaps
  cv::rectangle(s.global, cv::Rect(24, 12, 10, 6), cv::Scalar(4), cv::FILLED);  // two that touch
  cv::rectangle(s.global, cv::Rect(34, 12, 10, 6), cv::Scalar(5), cv::FILLED);
  cv::circle(s.global, {64, 40}, 2, cv::Scalar(6), cv::FILLED);  // seen whole
  // The ring's sides and the C's arms are apart in some window.
  const auto pieces = [&](int64_t w, int id) {
    const std::vector<double> map = componentMap(s, w);
    std::set<double> found;
    const Rect r = s.img.grid.imageWindow(w);
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x)
        if (s.global.at<int32_t>(int(r.y + y), int(r.x + x)) == id) found.insert(map[size_t(y * 16 + x)]);
    return found.size();
  };
  EXPECT_EQ(pieces(1 * 8 + 5, 1), 2u);  // column 5 (x 40..55), row 1 (y 8..23)
  EXPECT_EQ(pieces(3 * 8 + 2, 2), 2u);  // column 2 (x 16..31), row 3 (y 24..39)
  std::string first_csv, first_geojson;
  for (bool backwards : {false, true}) {
    writeComponents(s, backwards);
    const std::string csv = test::slurp(s.dir + "/slide_objects.csv");
    const std::string geojson = test::slurp(s.dir + "/slide_objects.geojson");
    cv::Mat tiff = ImageReader::open(s.dir + "/slide_instances.tif")->readRegion({0, 0, 72, 48});
    // The TIFF is the scene: one object for each of the scene's, none split, none twice.
    const std::map<int, int> to_scene = sceneIds(tiff, s.global);
    EXPECT_EQ(to_scene.size(), 6u);
    const auto j = nlohmann::json::parse(geojson);
    ASSERT_EQ(j["features"].size(), 6u);
    for (const auto& f : j["features"]) {
      const int id = f["id"].get<int>(), scene_id = to_scene.at(id);
      const cv::Mat mask = s.global == scene_id;
      const double pixels = double(cv::countNonZero(mask));
      const auto& m = f["properties"]["measurements"];
      EXPECT_EQ(m["area"].get<double>(), 4 * pixels) << scene_id;
      double outline = 0;
      for (const OutlinePolygon& polygon : scenePolygons(f["geometry"])) {
        EXPECT_EQ(outlineProblem(polygon), "") << f["geometry"].dump();
        outline += polygonArea(polygon);
      }
      EXPECT_EQ(4 * outline, 4 * pixels) << scene_id;
      // Centroid and score of all its pixels (level 0 twice the scene).
      double sx = 0, sy = 0, score = 0;
      for (int y = 0; y < 48; ++y)
        for (int x = 0; x < 72; ++x)
          if (mask.at<uint8_t>(y, x)) {
            sx += x + 0.5;
            sy += y + 0.5;
            score += double(x) / 72;
          }
      EXPECT_NEAR(m["centroid_x"].get<double>(), 2 * sx / pixels, 1e-9) << scene_id;
      EXPECT_NEAR(m["centroid_y"].get<double>(), 2 * sy / pixels, 1e-9) << scene_id;
      EXPECT_NEAR(m["prob_near"].get<double>(), score / pixels, 1e-6) << scene_id;
    }
    if (!backwards) {
      first_csv = csv;
      first_geojson = geojson;
    } else {
      EXPECT_EQ(csv, first_csv);
      EXPECT_EQ(geojson, first_geojson);
    }
    for (const char* f : {"/slide_objects.csv", "/slide_objects.geojson", "/slide_instances.tif"})
      fs::remove(s.dir + f);
  }
}

// The owner holds kJoinBandWindows window heights of rows to join objects in: an object taller than that
// is counted and left out, never written in pieces, and the objects beside it are written as ever.
TEST(Instances, AnObjectTallerThanTheBandIsCountedNotWrittenInPieces) {
  Scene s = largeScene("instances_band", 40, 80);
  ASSERT_EQ(kJoinBandWindows * 16, 48);
  cv::rectangle(s.global, cv::Rect(18, 10, 4, 50), cv::Scalar(1), cv::FILLED);  // 50 rows tall
  cv::rectangle(s.global, cv::Rect(26, 40, 12, 3), cv::Scalar(2), cv::FILLED);  // cut, joined
  cv::rectangle(s.global, cv::Rect(2, 70, 3, 3), cv::Scalar(3), cv::FILLED);    // whole
  cv::rectangle(s.global, cv::Rect(2, 16, 4, 32), cv::Scalar(4), cv::FILLED);   // two window heights, cut
  InstanceOutputs out(s.img, instanceOptions());
  for (int64_t w = 0; w < s.img.grid.count(); ++w)
    out.addRecord(
        w, encodeWindowObjects(keepWindowObjects(s.img, instanceOptions(), w, componentMap(s, w).data())));
  out.commit();
  EXPECT_EQ(out.objects(), (std::array<int64_t, 2>{3, 1}));
  cv::Mat tiff = ImageReader::open(s.dir + "/slide_instances.tif")->readRegion({0, 0, 40, 80});
  EXPECT_EQ(cv::countNonZero(tiff(cv::Rect(18, 10, 4, 50))), 0) << "no piece of the tall object";
  EXPECT_EQ(cv::countNonZero(tiff), 12 * 3 + 3 * 3 + 4 * 32);
  EXPECT_EQ(nlohmann::json::parse(test::slurp(s.dir + "/slide_objects.geojson"))["features"].size(), 3u);
}

TEST(Instances, EveryOutlineWrittenIsValidAsGeosJudgesIt) {
  Scene s = scene("instances_valid");
  // Pockets in a chain to the outside, background in an X, one object of parts that meet at corners, and
  // one of a frame with such parts in its hole.
  drawObject(s, 2, 2, {"#####", "#.###", "##.##", "###.#", "####."}, 1);
  drawObject(s, 12, 3, {"#####", "#.#.#", "##.##", "#.#.#", "#####"}, 2);
  drawObject(s, 22, 3, {"#.#", ".#.", "#.#"}, 3);
  drawObject(s, 2, 14, {"#######", "#.....#", "#.#.#.#", "#..#..#", "#.#.#.#", "#.....#", "#######"}, 4);
  writeScene(s);
  const std::string path = s.dir + "/slide_objects.geojson";
  const auto j = nlohmann::json::parse(test::slurp(path));
  ASSERT_EQ(j["features"].size(), 4u);
  for (const auto& f : j["features"]) {
    double area = 0;
    for (const OutlinePolygon& polygon : scenePolygons(f["geometry"])) {
      EXPECT_EQ(outlineProblem(polygon), "") << f["geometry"].dump();
      area += polygonArea(polygon);
    }
    EXPECT_EQ(4 * area, f["properties"]["measurements"]["area"].get<double>());
  }
  // As a consumer's GEOS reads the file (ogrinfo's ST_IsValid, as shapely's is_valid).
  const std::vector<std::string> reasons = test::geometryValidity(path);
  if (reasons.empty())
    GTEST_SKIP() << "no ogrinfo with SpatiaLite here: checked by the test's own rules only";
  EXPECT_EQ(reasons, std::vector<std::string>(4, "Valid Geometry"));
}

TEST(Instances, ScoresThatAreNoNumbersAreLeftOutAndNeverWin) {
  EXPECT_EQ(highestClass(std::vector<double>{NAN, 0.2, NAN}.data(), 3), 1);
  EXPECT_EQ(highestClass(std::vector<double>{NAN, NAN}.data(), 2), -1);
  EXPECT_EQ(highestClass(std::vector<double>{0.5, 0.5}.data(), 2), 0);
  EXPECT_EQ(highestClass(std::vector<double>{-INFINITY, NAN, -INFINITY}.data(), 3), 0);
  EXPECT_EQ(highestClass(std::vector<float>{0.1f, INFINITY}.data(), 2), 1);
  EXPECT_EQ(highestClass<double>(nullptr, 0), -1);
  Scene s = scene("instances_nan");
  // Squares of 4, 9 and 16 pixels: every score NaN; "near" NaN; "near" infinite.
  cv::rectangle(s.global, cv::Rect(2, 2, 2, 2), cv::Scalar(1), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(12, 3, 3, 3), cv::Scalar(2), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(22, 3, 4, 4), cv::Scalar(3), cv::FILLED);
  writeScene(s, [](int64_t, std::vector<double>& map) {
    for (size_t p = 0; p < 256; ++p) {
      const int scene_id = int(map[p]) / 10;  // the window's id is scene id x 10 + 1..7
      if (scene_id == 1) map[256 + p] = map[512 + p] = NAN;
      if (scene_id == 2) map[256 + p] = NAN;
      if (scene_id == 3) map[256 + p] = INFINITY;
    }
  });
  // Strict JSON (Python's json.load, nlohmann): no nan or inf tokens.
  const std::string geojson = test::slurp(s.dir + "/slide_objects.geojson");
  const auto j = nlohmann::json::parse(geojson);
  ASSERT_EQ(j["features"].size(), 3u);
  for (const auto& f : j["features"]) {
    const auto& m = f["properties"]["measurements"];
    const double area = m["area"].get<double>();
    EXPECT_FALSE(m.contains("prob_near")) << f.dump();
    if (area == 16) {  // no number among its scores: no class
      EXPECT_FALSE(f["properties"].contains("classification")) << f.dump();
      EXPECT_FALSE(m.contains("score")) << f.dump();
      EXPECT_FALSE(m.contains("prob_far")) << f.dump();
    } else if (area == 36) {  // NaN never wins
      EXPECT_EQ(f["properties"]["classification"]["name"], "far") << f.dump();
      EXPECT_EQ(m["score"].get<float>(), -0.2f) << f.dump();
      EXPECT_EQ(m["prob_far"].get<float>(), -0.2f) << f.dump();
    } else {  // infinity wins, and is left out as NaN is
      EXPECT_EQ(area, 64);
      EXPECT_EQ(f["properties"]["classification"]["name"], "near") << f.dump();
      EXPECT_FALSE(m.contains("score")) << f.dump();
      EXPECT_EQ(m["prob_far"].get<float>(), -0.3f) << f.dump();
    }
  }
  // The CSV says the same: no class, and the scores as they are.
  const std::string csv = test::slurp(s.dir + "/slide_objects.csv");
  EXPECT_NE(csv.find(",,,16,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",near,inf,64,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",nan,nan\n"), std::string::npos) << csv;
}

// A lattice window reaches past the image's right and bottom edges, where a model may find an object going
// on (here: padding that repeats the edge): an object is its pixels inside the image alone.
TEST(Instances, AnObjectAtTheImagesEdgeIsItsPixelsInsideTheImage) {
  Scene s = scene("instances_edge");
  s.img.grid = WindowGrid(40, 30, GridSpec{16, 16, 0.5, 0.5, true});  // x starts 0 .. 32, y 0 .. 24
  ASSERT_EQ(s.img.grid.imageWindow(s.img.grid.count() - 1).right(), 48);
  cv::rectangle(s.global, cv::Rect(36, 26, 4, 4), cv::Scalar(1), cv::FILLED);  // the corner
  cv::rectangle(s.global, cv::Rect(37, 10, 3, 4), cv::Scalar(2), cv::FILLED);  // the right edge
  cv::rectangle(s.global, cv::Rect(10, 27, 4, 3), cv::Scalar(3), cv::FILLED);  // the bottom edge
  const auto replicate = [&](int64_t w, std::vector<double>& map) {
    const Rect r = s.img.grid.imageWindow(w);
    for (int64_t y = 0; y < 16; ++y)
      for (int64_t x = 0; x < 16; ++x) {
        const int64_t ix = std::min<int64_t>(x, 39 - r.x), iy = std::min<int64_t>(y, 29 - r.y);
        for (int c = 0; c < 3; ++c) map[size_t(c * 256 + y * 16 + x)] = map[size_t(c * 256 + iy * 16 + ix)];
      }
  };
  // The corner's window: 16 pixels, not the 12 x 14 the model saw.
  const int64_t corner = s.img.grid.count() - 1;
  std::vector<double> map = windowMap(s, corner);
  replicate(corner, map);
  map[256 + 15 * 16 + 15] = NAN;  // a score in the padding is no one's
  const WindowObjects objects = keepWindowObjects(s.img, instanceOptions(), corner, map.data());
  ASSERT_EQ(objects.kept.size(), 1u);
  const WindowObject& o = objects.kept[0].object;
  EXPECT_EQ(o.pixels, 16);
  EXPECT_EQ((std::array<int64_t, 4>{o.x0, o.y0, o.x1, o.y1}), (std::array<int64_t, 4>{4, 2, 8, 6}));
  EXPECT_EQ(polygonArea(objects.kept[0].outlines.at(0)), 16);
  EXPECT_EQ(objects.non_finite, 0);
  // Every output: the scene's objects, their areas, boxes and outlines inside the image.
  writeScene(s, replicate);
  const auto j = nlohmann::json::parse(test::slurp(s.dir + "/slide_objects.geojson"));
  ASSERT_EQ(j["features"].size(), 3u);
  std::multiset<double> areas;
  for (const auto& f : j["features"]) {
    double outline = 0;
    for (const OutlinePolygon& polygon : scenePolygons(f["geometry"])) {
      for (const OutlineRing& ring : polygon)
        for (const auto& p : ring) EXPECT_TRUE(p[0] <= 40 && p[1] <= 30) << f["geometry"].dump();
      outline += polygonArea(polygon);
    }
    areas.insert(f["properties"]["measurements"]["area"].get<double>());
    EXPECT_EQ(4 * outline, f["properties"]["measurements"]["area"].get<double>());
  }
  EXPECT_EQ(areas, (std::multiset<double>{4 * 16, 4 * 12, 4 * 12}));
  std::istringstream csv(test::slurp(s.dir + "/slide_objects.csv"));
  std::string line;
  std::getline(csv, line);
  while (std::getline(csv, line)) {
    std::vector<double> v;
    std::istringstream fields(line.substr(line.find(",near,") + 6));
    for (std::string field; std::getline(fields, field, ',');) v.push_back(std::stod(field));
    // score, area, centroid, x1, y1, x2, y2 in level-0 pixels (80 x 60)
    EXPECT_TRUE(v.at(6) <= 80 && v.at(7) <= 60) << line;
  }
  cv::Mat tiff = ImageReader::open(s.dir + "/slide_instances.tif")->readRegion({0, 0, 40, 30});
  EXPECT_EQ(cv::countNonZero(tiff), 16 + 12 + 12);
}

TEST(Instances, AnImageThatFailsLeavesNothing) {
  Scene s = scene("instances_fail");
  cv::circle(s.global, {20, 14}, 3, cv::Scalar(1), cv::FILLED);
  {
    InstanceOutputs out(s.img, instanceOptions());
    out.add(0, asFloats(windowMap(s, 0)).data());
    std::vector<float> bad = asFloats(windowMap(s, 1));
    bad[3] = 0.25f;
    EXPECT_THROW(out.add(1, bad.data()), IoError);
    EXPECT_THROW(out.commit(), IoError);  // not every window came
  }
  for (const auto& entry : fs::directory_iterator(s.dir)) ADD_FAILURE() << "left behind: " << entry.path();
}

}  // namespace
}  // namespace tiler
