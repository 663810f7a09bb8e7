// Instance objects: outlines exact to the pixel edges (areas equal pixel counts, holes kept, parts that meet
// at a corner apart), objects measured from their pixels, ids that are no ids refused, and each object kept
// once, by the window whose core holds its centroid, in any arrival order, into GeoJSON, CSV and a uint32
// TIFF equal to the image's own objects; objects cut by a window edge counted, never duplicated.
#include "tiler/instances.hpp"

#include <gtest/gtest.h>
#include <opencv2/imgproc.hpp>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "test_util.hpp"
#include "tiler/error.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

double polygonArea(const OutlinePolygon& polygon) {
  double area = 0;
  for (const auto& ring : polygon) area += ringArea(ring);
  return area;
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
      EXPECT_GT(ringArea(polygon[0]), 0);
      for (size_t r = 1; r < polygon.size(); ++r) EXPECT_LT(ringArea(polygon[r]), 0);
      got.insert(int64_t(polygonArea(polygon)));
    }
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

TEST(Instances, ObjectsOfAWindowAreMeasuredFromTheirPixels) {
  // 6x4, ids then two class channels: object 7 is an L of 4 pixels, object 3 two pixels apart.
  const std::vector<float> ids = {0, 7, 0, 0, 0, 3,  //
                                  0, 7, 0, 0, 0, 0,  //
                                  0, 7, 7, 0, 0, 0,  //
                                  0, 0, 0, 0, 3, 0};
  std::vector<float> values = ids;
  for (int k = 0; k < 2; ++k)
    for (size_t i = 0; i < ids.size(); ++i) values.push_back(ids[i] == 7 ? float(k) : float(1 - k) + 0.5f);
  const auto objects = objectsOfWindow(values.data(), 3, 4, 6, [] { return std::string("here: "); });
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

TEST(Instances, AnIdThatIsNoIdFailsNamingItsPixel) {
  for (float bad : {0.5f, -1.0f, std::numeric_limits<float>::quiet_NaN(), 2147483648.0f,
                    std::numeric_limits<float>::infinity()}) {
    std::vector<float> ids(12, 0.f);
    ids[7] = bad;
    try {
      objectsOfWindow(ids.data(), 1, 3, 4, [] { return std::string("'x.tif': window 5: "); });
      ADD_FAILURE() << bad << ": no error";
    } catch (const IoError& e) {
      EXPECT_NE(e.message().find("'x.tif': window 5: pixel (3, 1) of the instance map is "),
                std::string::npos)
          << e.message();
    }
  }
  std::vector<float> largest(4, 2147483520.0f);  // the largest float below 2^31 is an id
  EXPECT_EQ(objectsOfWindow(largest.data(), 1, 2, 2, [] { return std::string(); })[0].id, 2147483520);
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
std::vector<float> windowMap(const Scene& s, int64_t w) {
  const Rect r = s.img.grid.imageWindow(w);
  std::vector<float> map(3 * 16 * 16, 0.f);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x) {
      const int64_t gx = r.x + x, gy = r.y + y;
      if (gx < 0 || gy < 0 || gx >= 40 || gy >= 30) continue;
      const int id = s.global.at<int32_t>(int(gy), int(gx));
      if (id == 0) continue;
      map[size_t(y * 16 + x)] = float(id * 10 + w % 7 + 1);
      map[size_t(256 + y * 16 + x)] = float(id) / 10;
      map[size_t(512 + y * 16 + x)] = -float(id) / 10;
    }
  return map;
}

InstanceOptions instanceOptions() {
  InstanceOptions o;
  o.kinds = {"objects", "objects_csv", "instances"};
  o.channels = 3;
  o.height = o.width = 16;
  o.classes = {{"near", {255, 0, 0}, true}, {"far", {0, 0, 255}, true}};
  return o;
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
        out.add(w, windowMap(s, w).data());
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
    std::map<int, int> to_scene;
    for (int y = 0; y < 30; ++y)
      for (int x = 0; x < 40; ++x) {
        const int got = tiff.at<int32_t>(y, x), want = s.global.at<int32_t>(y, x);
        ASSERT_EQ(got == 0, want == 0) << x << "," << y;
        if (got == 0) continue;
        ASSERT_EQ(to_scene.emplace(got, want).first->second, want) << x << "," << y;
      }
    EXPECT_EQ(to_scene.size(), 5u);
    const auto j = nlohmann::json::parse(geojson);
    ASSERT_EQ(j["features"].size(), 5u);
    for (const auto& f : j["features"]) {
      const int id = f["id"].get<int>(), scene_id = to_scene.at(id);
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

TEST(Instances, AnObjectLargerThanTheOverlapIsCountedNeverDuplicated) {
  Scene s = scene("instances_large");
  // 14 px wide across windows 8 px apart: every window that sees it sees it cut.
  cv::rectangle(s.global, cv::Rect(13, 10, 14, 4), cv::Scalar(1), cv::FILLED);
  InstanceOutputs out(s.img, instanceOptions());
  for (int64_t w = 0; w < s.img.grid.count(); ++w) out.add(w, windowMap(s, w).data());
  out.commit();
  const auto objects = out.objects();
  // Two windows saw a part of it, each part's centroid in that window's core: both parts are counted.
  EXPECT_EQ((*objects)[0], 0);
  EXPECT_EQ((*objects)[1], 2);
  EXPECT_EQ(nlohmann::json::parse(test::slurp(s.dir + "/slide_objects.geojson"))["features"].size(), 0u);
}

TEST(Instances, ARecordIsTheWindowsObjectsAndNothingElse) {
  Scene s = scene("instances_record");
  // Window 5 (column 1, row 1: image [8, 24) both ways) keeps the disc (centroid (15.5, 14.5): its core is
  // [12, 20) x [12, 19)), not the square (centroid y 21: row 2's).
  cv::circle(s.global, {15, 14}, 3, cv::Scalar(1), cv::FILLED);
  cv::rectangle(s.global, cv::Rect(16, 20, 2, 2), cv::Scalar(2), cv::FILLED);
  std::vector<float> map = windowMap(s, 5);
  map[256 + 14 * 16 + 5] = std::numeric_limits<float>::quiet_NaN();  // a class score
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

TEST(Instances, AnImageThatFailsLeavesNothing) {
  Scene s = scene("instances_fail");
  cv::circle(s.global, {20, 14}, 3, cv::Scalar(1), cv::FILLED);
  {
    InstanceOutputs out(s.img, instanceOptions());
    out.add(0, windowMap(s, 0).data());
    std::vector<float> bad = windowMap(s, 1);
    bad[3] = 0.25f;
    EXPECT_THROW(out.add(1, bad.data()), IoError);
    EXPECT_THROW(out.commit(), IoError);  // not every window came
  }
  for (const auto& entry : fs::directory_iterator(s.dir)) ADD_FAILURE() << "left behind: " << entry.path();
}

}  // namespace
}  // namespace tiler
