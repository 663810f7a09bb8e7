#include "tiler/writers/objects_store.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>
#include <zlib.h>

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

namespace fs = std::filesystem;

namespace tiler {

namespace {

// Objects a transaction: SQLite's page cache holds at most a transaction's changes before they go to the
// file, so this and the cache size bound the memory.
constexpr int64_t kObjectsPerTransaction = 4096;
// SQLiteStore's default, which its metadata names.
constexpr int kZlibLevel = 9;

// SQLiteStore's tables, as its __init__ and SQLiteMetadata make them.
constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS metadata (key TEXT UNIQUE, value TEXT)",
    "REPLACE INTO metadata (key, value) VALUES ('version', '\"1.0.1\"')",
    "REPLACE INTO metadata (key, value) VALUES ('compression', '\"zlib\"')",
    "REPLACE INTO metadata (key, value) VALUES ('compression_level', '9')",
    R"(
            CREATE VIRTUAL TABLE rtree USING rtree(
                id,                      -- Integer primary key
                min_x, max_x,            -- 1st dimension min, max
                min_y, max_y             -- 2nd dimension min, max
            )
            )",
    R"(
            CREATE TABLE annotations(
                id INTEGER PRIMARY KEY,  -- Integer primary key
                key TEXT UNIQUE,         -- Unique identifier (UUID)
                objtype TEXT,            -- Object type
                cx FLOAT NOT NULL,       -- X of centroid/representative point
                cy FLOAT NOT NULL,       -- Y of centroid/representative point
                geometry BLOB,           -- Detailed geometry
                properties TEXT,         -- JSON properties
                area FLOAT NOT NULL      -- Area (for ordering)
            )

            )",
};

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Little-endian WKB of one polygon, its rings closed.
void putPolygon(std::string& out, const StorePolygon& polygon) {
  static_assert(sizeof(double) == 8);
  put<uint8_t>(out, 1);  // little endian (this machine's order: x86-64, aarch64)
  put<uint32_t>(out, 3);
  put<uint32_t>(out, uint32_t(polygon.size()));
  for (const StoreRing& ring : polygon) {
    put<uint32_t>(out, uint32_t(ring.size() + 1));
    for (size_t i = 0; i <= ring.size(); ++i) {
      put(out, ring[i % ring.size()][0]);
      put(out, ring[i % ring.size()][1]);
    }
  }
}

// A ring's shoelace sums: twice its signed area, and the moments giving its centroid.
struct RingSums {
  double area2 = 0, mx = 0, my = 0;
};
RingSums ringSums(const StoreRing& ring) {
  RingSums s;
  for (size_t i = 0; i < ring.size(); ++i) {
    const auto& a = ring[i];
    const auto& b = ring[(i + 1) % ring.size()];
    const double cross = a[0] * b[1] - b[0] * a[1];
    s.area2 += cross;
    s.mx += (a[0] + b[0]) * cross;
    s.my += (a[1] + b[1]) * cross;
  }
  return s;
}

}  // namespace

double storeNumber(float value) {
  return std::strtod(fmt::format("{}", value).c_str(), nullptr);
}

std::string storeWkb(const std::vector<StorePolygon>& polygons) {
  std::string wkb;
  if (polygons.size() == 1) {
    putPolygon(wkb, polygons[0]);
    return wkb;
  }
  put<uint8_t>(wkb, 1);
  put<uint32_t>(wkb, 6);
  put<uint32_t>(wkb, uint32_t(polygons.size()));
  for (const StorePolygon& polygon : polygons) putPolygon(wkb, polygon);
  return wkb;
}

std::vector<StorePolygon> ObjectsStore::box(double x1, double y1, double x2, double y2) {
  return {{{{x1, y1}, {x2, y1}, {x2, y2}, {x1, y2}}}};
}

ObjectsStore::ObjectsStore(std::string path) : path_(std::move(path)) {
  // Created anew, as every output's partial file is (what was there, a link included, replaced).
  const int fd = createFileExclusively(partial());
  TILER_CHECK(fd >= 0, IoError, "'" << partial() << "': cannot create: " << std::strerror(errno));
  ::close(fd);
  try {
    if (sqlite3_open_v2(partial().c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) fail("open");
    // No journal and no syncs while it is written: a failed partial file is removed, never repaired, and
    // finish() syncs it once. One exclusive connection, a bounded page cache.
    exec("PRAGMA journal_mode = OFF");
    exec("PRAGMA synchronous = OFF");
    exec("PRAGMA locking_mode = EXCLUSIVE");
    exec("PRAGMA cache_size = -32768");
    exec("BEGIN");
    for (const char* sql : kSchema) exec(sql);
    // What compress2 does for each geometry, its state made once: a deflate state is some hundreds of KB to
    // allocate and clear, more than a geometry costs to compress.
    zlib_ = new z_stream{};
    TILER_CHECK(deflateInit(zlib_, kZlibLevel) == Z_OK, IoError,
                "'" << partial() << "': zlib failed to start");
    if (sqlite3_prepare_v2(db_, "INSERT INTO annotations VALUES(?, ?, ?, ?, ?, ?, ?, ?)", -1,
                           &insert_annotation_, nullptr) != SQLITE_OK ||
        sqlite3_prepare_v2(db_, "INSERT INTO rtree VALUES(?, ?, ?, ?, ?)", -1, &insert_rtree_, nullptr) !=
            SQLITE_OK)
      fail("prepare");
  } catch (...) {
    // No destructor runs for a constructor that throws.
    close();
    std::error_code ec;
    fs::remove(partial(), ec);
    throw;
  }
}

ObjectsStore::~ObjectsStore() {
  close();
  std::error_code ec;
  if (!committed_) fs::remove(partial(), ec);
}

void ObjectsStore::close() {
  if (zlib_) deflateEnd(zlib_);
  delete zlib_;
  zlib_ = nullptr;
  sqlite3_finalize(insert_annotation_);
  sqlite3_finalize(insert_rtree_);
  insert_annotation_ = insert_rtree_ = nullptr;
  if (db_) sqlite3_close(db_);
  db_ = nullptr;
}

void ObjectsStore::fail(const char* doing) {
  const std::string message = db_ ? sqlite3_errmsg(db_) : "out of memory";
  TILER_THROW(IoError, "'" << partial() << "': the objects store's " << doing << " failed: " << message);
}

void ObjectsStore::exec(const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) == SQLITE_OK) return;
  const std::string message = error ? error : sqlite3_errmsg(db_);
  sqlite3_free(error);
  TILER_THROW(IoError, "'" << partial() << "': the objects store's write failed: " << message);
}

void ObjectsStore::add(int64_t id, const std::vector<StorePolygon>& polygons,
                       const nlohmann::ordered_json& properties) {
  TILER_CHECK(
      db_ && id > last_id_ && !polygons.empty(), IoError,
      "'" << partial() << "': object " << id << " is not an object the store takes after " << last_id_);
  // shapely's measures of the geometry: the area of the shells less the holes', the area-weighted centroid
  // (a geometry without area: its bounds' centre, where a degenerate box's segment has it), the bounds.
  double area = 0, mx = 0, my = 0;
  double min_x = std::numeric_limits<double>::infinity(), min_y = min_x, max_x = -min_x, max_y = -min_x;
  for (const StorePolygon& polygon : polygons)
    for (size_t r = 0; r < polygon.size(); ++r) {
      TILER_CHECK(
          polygon[r].size() >= 3, IoError,
          "'" << partial() << "': object " << id << " has a ring of " << polygon[r].size() << " vertices");
      const RingSums s = ringSums(polygon[r]);
      // A shell counts positive, a hole negative, whichever way each runs.
      const double sign = (r == 0) == (s.area2 >= 0) ? 1.0 : -1.0;
      area += sign * s.area2 / 2;
      mx += sign * s.mx / 6;
      my += sign * s.my / 6;
      for (const auto& p : polygon[r]) {
        min_x = std::min(min_x, p[0]);
        max_x = std::max(max_x, p[0]);
        min_y = std::min(min_y, p[1]);
        max_y = std::max(max_y, p[1]);
      }
    }
  const double cx = area != 0 ? mx / area : (min_x + max_x) / 2;
  const double cy = area != 0 ? my / area : (min_y + max_y) / 2;

  const std::string wkb = storeWkb(polygons);
  std::string compressed(deflateBound(zlib_, uLong(wkb.size())), '\0');
  zlib_->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(wkb.data()));
  zlib_->avail_in = uInt(wkb.size());
  zlib_->next_out = reinterpret_cast<Bytef*>(compressed.data());
  zlib_->avail_out = uInt(compressed.size());
  const bool deflated = deflate(zlib_, Z_FINISH) == Z_STREAM_END;
  compressed.resize(compressed.size() - zlib_->avail_out);
  TILER_CHECK(deflated && deflateReset(zlib_) == Z_OK, IoError,
              "'" << partial() << "': object " << id << ": zlib failed");
  const std::string key = std::to_string(id);
  const std::string json = properties.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  const char* type = polygons.size() == 1 ? "Polygon" : "MultiPolygon";

  sqlite3_stmt* a = insert_annotation_;
  sqlite3_bind_int64(a, 1, id);
  sqlite3_bind_text(a, 2, key.c_str(), int(key.size()), SQLITE_STATIC);
  sqlite3_bind_text(a, 3, type, -1, SQLITE_STATIC);
  sqlite3_bind_double(a, 4, cx);
  sqlite3_bind_double(a, 5, cy);
  sqlite3_bind_blob(a, 6, compressed.data(), int(compressed.size()), SQLITE_STATIC);
  sqlite3_bind_text(a, 7, json.c_str(), int(json.size()), SQLITE_STATIC);
  sqlite3_bind_double(a, 8, area);
  const int a_done = sqlite3_step(a);
  sqlite3_reset(a);
  if (a_done != SQLITE_DONE) fail("write");
  sqlite3_stmt* r = insert_rtree_;
  sqlite3_bind_int64(r, 1, id);
  sqlite3_bind_double(r, 2, min_x);
  sqlite3_bind_double(r, 3, max_x);
  sqlite3_bind_double(r, 4, min_y);
  sqlite3_bind_double(r, 5, max_y);
  const int r_done = sqlite3_step(r);
  sqlite3_reset(r);
  if (r_done != SQLITE_DONE) fail("write");
  last_id_ = id;
  if (++objects_ % kObjectsPerTransaction == 0) {
    exec("COMMIT");
    exec("BEGIN");
  }
}

bool ObjectsStore::failAsFullDisk() {
  // The store may not grow past the pages it has: its next new page fails as on a full disk.
  if (db_) exec("PRAGMA max_page_count = 1");
  return true;
}

void ObjectsStore::finish() {
  TILER_CHECK(db_, IoError, "'" << partial() << "': the objects store is closed");
  exec("COMMIT");
  close();
  const int fd = ::open(partial().c_str(), O_RDONLY);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  TILER_CHECK(synced, IoError, "'" << partial() << "': sync failed: " << std::strerror(err));
}

void ObjectsStore::commit(std::vector<std::string>& renamed) {
  renameFromPartial(path_);
  committed_ = true;
  renamed.push_back(path_);
}

}  // namespace tiler
