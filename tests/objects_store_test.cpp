// writers/objects_store: TIAToolbox's SQLiteStore layout as Python's sqlite3 reads it (tests/
// objects_store_check.py: tables, metadata, rows measured from their WKB, SQLiteStore's bbox SQL), and as
// TIAToolbox's own SQLiteStore reads it where its source is given (TILER_TIATOOLBOX_SOURCE: a checkout of
// TissueImageAnalytics/tiatoolbox; shapely from python3-shapely); the same objects make the same bytes; a
// full disk, a refusal or a store destroyed uncommitted leaves nothing under the final name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/writers/objects_store.hpp"

namespace fs = std::filesystem;
using namespace tiler;

namespace {

const std::string kPython = "/usr/bin/python3";

std::string bytesOf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Three objects: a 10 x 10 square with a 4 x 4 hole, two squares as one object, a box; then `extra` small
// boxes in a row along y = 1000.
void writeObjects(ObjectsStore& store, int extra = 0) {
  const StorePolygon holed = {{{100, 100}, {110, 100}, {110, 110}, {100, 110}},
                              {{103, 103}, {103, 107}, {107, 107}, {107, 103}}};
  store.add(1, {holed}, {{"type", "nucleus"}, {"score", storeNumber(0.9f)}, {"area", 84.0}});
  const StorePolygon a = {{{200, 200}, {202, 200}, {202, 202}, {200, 202}}};
  const StorePolygon b = {{{204, 200}, {205, 200}, {205, 201}, {204, 201}}};
  store.add(2, {a, b}, {{"type", "stroma"}, {"score", storeNumber(0.5f)}, {"area", 5.0}, {"prob_x", 0.25}});
  store.add(5, ObjectsStore::box(1000.5, 10.25, 1010.5, 30.25), {{"type", "tumour"}, {"area", 200.0}});
  for (int i = 0; i < extra; ++i)
    store.add(6 + i, ObjectsStore::box(4.0 * i, 1000, 4.0 * i + 3, 1003), {{"type", "small"}, {"area", 9.0}});
}

nlohmann::json check(const std::string& store, const std::string& bbox) {
  std::string command =
      kPython + " " + TILER_TEST_SOURCE_DIR + "/tests/objects_store_check.py '" + store + "' " + bbox;
  if (const char* source = std::getenv("TILER_TIATOOLBOX_SOURCE"))
    command += std::string(" '") + source + "'";
  const auto r = test::runCommand(command);
  EXPECT_EQ(r.code, 0) << r.output;
  return nlohmann::json::parse(r.output.substr(r.output.find('{')));
}

}  // namespace

TEST(ObjectsStore, HasTiatoolboxsLayoutAndRows) {
  const std::string dir = test::scratchDir("objects_store_layout");
  const std::string path = dir + "/a_objects.db";
  {
    ObjectsStore store(path);
    EXPECT_TRUE(fs::exists(path + ".partial"));
    writeObjects(store);
    std::vector<std::string> renamed;
    store.finish();
    EXPECT_FALSE(fs::exists(path));
    store.commit(renamed);
    EXPECT_EQ(renamed, std::vector<std::string>{path});
  }
  EXPECT_FALSE(fs::exists(path + ".partial"));
  const nlohmann::json j = check(path, "95,95,150,150");
  EXPECT_EQ(j["tables"], nlohmann::json({"annotations", "metadata", "rtree", "rtree_node", "rtree_parent",
                                         "rtree_rowid"}));
  EXPECT_EQ(j["metadata"],
            nlohmann::json({{"version", "1.0.1"}, {"compression", "zlib"}, {"compression_level", 9}}));
  EXPECT_EQ(j["columns"],
            nlohmann::json({"id", "key", "objtype", "cx", "cy", "geometry", "properties", "area"}));
  EXPECT_EQ(j["integrity"], "ok");
  const auto& rows = j["rows"];
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& row : rows) {
    SCOPED_TRACE(row.dump());
    // The row's own measures are its geometry's, as SQLiteStore's _make_token takes them.
    EXPECT_EQ(row["key"], std::to_string(row["id"].get<int>()));
    EXPECT_EQ(row["objtype"], row["wkb_type"]);
    EXPECT_NEAR(row["area"].get<double>(), row["geometry_area"].get<double>(), 1e-9);
    EXPECT_NEAR(row["cx"].get<double>(), row["geometry_cx"].get<double>(), 1e-9);
    EXPECT_NEAR(row["cy"].get<double>(), row["geometry_cy"].get<double>(), 1e-9);
    for (int i = 0; i < 4; ++i)  // the R-tree's float32 bounds, rounded outwards
      EXPECT_NEAR(row["rtree"][i].get<double>(), row["geometry_bounds"][i].get<double>(), 1e-4);
    EXPECT_TRUE(row["compact"].get<bool>());
  }
  EXPECT_EQ(rows[0]["objtype"], "Polygon");
  EXPECT_DOUBLE_EQ(rows[0]["area"].get<double>(), 84.0);  // the hole taken out
  EXPECT_DOUBLE_EQ(rows[0]["cx"].get<double>(), 105.0);
  EXPECT_EQ(rows[0]["properties"], nlohmann::json({{"type", "nucleus"}, {"score", 0.9}, {"area", 84.0}}));
  EXPECT_EQ(rows[1]["objtype"], "MultiPolygon");
  EXPECT_DOUBLE_EQ(rows[1]["area"].get<double>(), 5.0);
  EXPECT_NEAR(rows[1]["cx"].get<double>(), (4 * 201.0 + 1 * 204.5) / 5, 1e-12);  // the parts' area-weighted
  EXPECT_EQ(rows[2]["id"], 5);
  EXPECT_EQ(rows[2]["properties"]["type"], "tumour");
  // SQLiteStore's bbox_intersects SQL: the holed square only.
  EXPECT_EQ(j["bbox_keys"], nlohmann::json({"1"}));
  if (!j.contains("tiatoolbox")) {
    std::cout << "TILER_TIATOOLBOX_SOURCE unset: TIAToolbox's own SQLiteStore not tried\n";
    return;
  }
  const auto& t = j["tiatoolbox"];
  EXPECT_EQ(t["count"], 3);
  EXPECT_EQ(t["compression"], "zlib");
  EXPECT_EQ(t["bbox_keys"], nlohmann::json({"1"}));
  EXPECT_EQ(t["intersects_keys"], nlohmann::json({"1"}));
  EXPECT_EQ(t["types"], nlohmann::json({{"1", "nucleus"}}));
  EXPECT_EQ(t["geometry_types"], nlohmann::json({"MultiPolygon", "Polygon"}));
  // Its own token of each annotation it read: the same centroid, area, bounds and geometry bytes.
  EXPECT_EQ(t["token_mismatches"], nlohmann::json::array());
}

TEST(ObjectsStore, TheSameObjectsMakeTheSameBytes) {
  const std::string dir = test::scratchDir("objects_store_bytes");
  std::vector<std::string> files;
  for (const char* name : {"/a.db", "/b.db"}) {
    ObjectsStore store(dir + name);
    writeObjects(store, 5000);  // past a transaction
    std::vector<std::string> renamed;
    store.finish();
    store.commit(renamed);
    files.push_back(bytesOf(dir + name));
  }
  EXPECT_GT(files[0].size(), 100000u);
  EXPECT_TRUE(files[0] == files[1]);
  const nlohmann::json j = check(dir + "/a.db", "0,999,10,1001");
  EXPECT_EQ(j["rows"].size(), 5003u);
  EXPECT_EQ(j["bbox_keys"], nlohmann::json({"6", "7", "8"}));
}

TEST(ObjectsStore, AFullDiskFailsTheWriteAndLeavesNoFile) {
  const std::string dir = test::scratchDir("objects_store_full");
  const std::string path = dir + "/full.db";
  {
    ObjectsStore store(path);
    writeObjects(store);
    EXPECT_TRUE(store.failAsFullDisk());
    try {
      writeObjects(store, 1000);
      store.finish();
      ADD_FAILURE() << "a full disk failed no write";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("full.db.partial"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("full"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

TEST(ObjectsStore, RefusesWhatIsNoObject) {
  const std::string dir = test::scratchDir("objects_store_refusals");
  ObjectsStore store(dir + "/r.db");
  store.add(3, ObjectsStore::box(0, 0, 1, 1), {});
  try {
    store.add(3, ObjectsStore::box(0, 0, 1, 1), {});
    ADD_FAILURE() << "an id not above the last taken";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("object 3"), std::string::npos) << e.what();
  }
  try {
    store.add(4, {{{{0, 0}, {1, 1}}}}, {});
    ADD_FAILURE() << "a ring of two vertices taken";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("2 vertices"), std::string::npos) << e.what();
  }
  try {
    ObjectsStore nowhere(dir + "/no/such/dir/n.db");
    ADD_FAILURE() << "a store made where no directory is";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("n.db.partial"), std::string::npos) << e.what();
  }
}

TEST(ObjectsStore, AStoreDestroyedUncommittedLeavesNothing) {
  const std::string dir = test::scratchDir("objects_store_uncommitted");
  {
    ObjectsStore store(dir + "/u.db");
    writeObjects(store);
    store.finish();
  }
  EXPECT_TRUE(fs::is_empty(dir));
}
