#include "tiler/view/objects.hpp"

#if TILER_WITH_VIEW
#include <sqlite3.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

// The most bytes one object's decompressed geometry may take: a bound on what a corrupt store can ask for.
constexpr uLongf kMaxGeometryBytes = uLongf(64) << 20;

// Reads a little- or big-endian WKB value of type T at `at`, advancing it; false past the end.
struct WkbReader {
  const uint8_t* data;
  size_t size, at = 0;
  bool little = true;
  template <typename T>
  bool read(T& out) {
    if (at + sizeof(T) > size) return false;
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, data + at, sizeof(T));
    if (!little)
      for (size_t k = 0; k < sizeof(T) / 2; ++k) std::swap(bytes[k], bytes[sizeof(T) - 1 - k]);
    std::memcpy(&out, bytes, sizeof(T));
    at += sizeof(T);
    return true;
  }
  // A geometry's rings (a polygon's, each of a multipolygon's; a line string as one ring), appended.
  bool geometry(nlohmann::json& rings, int depth = 0) {
    uint8_t order = 0;
    uint32_t type = 0;
    if (depth > 2 || !read(order)) return false;
    little = order == 1;
    if (!read(type)) return false;
    type %= 1000;  // ISO Z/M variants are not written; their 2-D part would be misread
    auto ring = [this](nlohmann::json& out) {
      uint32_t n = 0;
      if (!read(n) || n > (size - at) / 16) return false;
      nlohmann::json points = nlohmann::json::array();
      for (uint32_t k = 0; k < n; ++k) {
        double x = 0, y = 0;
        if (!read(x) || !read(y)) return false;
        points.push_back({x, y});
      }
      out.push_back(std::move(points));
      return true;
    };
    if (type == 1) {  // point: a ring of one
      double x = 0, y = 0;
      if (!read(x) || !read(y)) return false;
      rings.push_back({{x, y}});
      return true;
    }
    if (type == 2) return ring(rings);
    if (type == 3) {
      uint32_t n = 0;
      if (!read(n) || n > size) return false;
      for (uint32_t k = 0; k < n; ++k)
        if (!ring(rings)) return false;
      return true;
    }
    if (type == 4 || type == 5 || type == 6 || type == 7) {
      uint32_t n = 0;
      if (!read(n) || n > size) return false;
      for (uint32_t k = 0; k < n; ++k)
        if (!geometry(rings, depth + 1)) return false;
      return true;
    }
    return false;
  }
};

// A property string's class: properties' "type" (TIAToolbox's) or "class", else "".
std::string classOf(const unsigned char* text) {
  if (!text) return "";
  const auto p = nlohmann::json::parse(reinterpret_cast<const char*>(text), nullptr, false);
  if (!p.is_object()) return "";
  for (const char* key : {"type", "class"})
    if (p.contains(key) && p[key].is_string()) return p[key].get<std::string>();
  return "";
}

struct Statement {
  sqlite3_stmt* s = nullptr;
  ~Statement() { sqlite3_finalize(s); }
};

}  // namespace

ObjectStore::ObjectStore(const std::string& path) : path_(path) {
  // immutable: SQLite takes no locks and writes nothing (no journal beside a read-only job's files).
  const std::string uri = "file:" + path + "?mode=ro&immutable=1";
  const int rc = sqlite3_open_v2(uri.c_str(), &db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
  if (rc != SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    TILER_THROW(IoError, "'" << path << "': cannot open the objects store: " << why);
  }
  Statement s;
  const char* sql = "SELECT value FROM metadata WHERE key = 'compression'";
  if (sqlite3_prepare_v2(db_, sql, -1, &s.s, nullptr) != SQLITE_OK) {
    const std::string why = sqlite3_errmsg(db_);
    sqlite3_close(db_);
    TILER_THROW(IoError, "'" << path << "': not an annotation store (no metadata table: " << why << ")");
  }
  if (sqlite3_step(s.s) == SQLITE_ROW) {
    const auto* v = sqlite3_column_text(s.s, 0);
    // TIAToolbox stores metadata as JSON ("\"zlib\"").
    compressed_ = v && std::strstr(reinterpret_cast<const char*>(v), "zlib") != nullptr;
  }
}

ObjectStore::~ObjectStore() {
  sqlite3_close(db_);
}

int64_t ObjectStore::count() {
  std::lock_guard<std::mutex> lock(mutex_);
  Statement s;
  TILER_CHECK(sqlite3_prepare_v2(db_, "SELECT COUNT(*) FROM annotations", -1, &s.s, nullptr) == SQLITE_OK,
              IoError, "'" << path_ << "': " << sqlite3_errmsg(db_));
  return sqlite3_step(s.s) == SQLITE_ROW ? sqlite3_column_int64(s.s, 0) : 0;
}

nlohmann::json ObjectStore::sampled(const Rect& area, int64_t limit) {
  // kCells x kCells cells, each its first objects (by centroid, so none twice): an even spread of the area
  // whatever the store's row order, each cell a bounded R-tree walk.
  constexpr int64_t kCells = 16;
  const int64_t per_cell = std::max<int64_t>(1, limit / (kCells * kCells));
  const char* sql =
      "SELECT a.cx, a.cy, a.properties FROM rtree r JOIN annotations a ON a.id = r.id "
      "WHERE r.max_x >= ?1 AND r.min_x <= ?2 AND r.max_y >= ?3 AND r.min_y <= ?4 "
      "AND a.cx >= ?1 AND a.cx < ?2 AND a.cy >= ?3 AND a.cy < ?4 LIMIT ?5";
  Statement s;
  TILER_CHECK(sqlite3_prepare_v2(db_, sql, -1, &s.s, nullptr) == SQLITE_OK, IoError,
              "'" << path_ << "': not an annotation store: " << sqlite3_errmsg(db_));
  nlohmann::json points = nlohmann::json::array();
  nlohmann::json cells = nlohmann::json::array();
  const double cw = double(area.w) / double(kCells), ch = double(area.h) / double(kCells);
  for (int64_t j = 0; j < kCells; ++j) {
    for (int64_t i = 0; i < kCells; ++i) {
      const double x0 = double(area.x) + double(i) * cw, y0 = double(area.y) + double(j) * ch;
      sqlite3_reset(s.s);
      sqlite3_bind_double(s.s, 1, x0);
      sqlite3_bind_double(s.s, 2, x0 + cw);
      sqlite3_bind_double(s.s, 3, y0);
      sqlite3_bind_double(s.s, 4, y0 + ch);
      sqlite3_bind_int64(s.s, 5, per_cell + 1);
      int64_t found = 0;
      int rc;
      while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) {
        if (found++ < per_cell)
          points.push_back({sqlite3_column_double(s.s, 0), sqlite3_column_double(s.s, 1),
                            classOf(sqlite3_column_text(s.s, 2))});
      }
      TILER_CHECK(rc == SQLITE_DONE, IoError, "'" << path_ << "': " << sqlite3_errmsg(db_));
      cells.push_back(found > per_cell);
    }
  }
  return {
      {"mode", "centroids"}, {"cells", kCells}, {"full", std::move(cells)}, {"points", std::move(points)}};
}

nlohmann::json ObjectStore::query(const Rect& area, int64_t limit) {
  std::lock_guard<std::mutex> lock(mutex_);
  const char* sql =
      "SELECT a.id, a.cx, a.cy, a.geometry, a.properties FROM rtree r JOIN annotations a ON a.id = r.id "
      "WHERE r.max_x >= ?1 AND r.min_x <= ?2 AND r.max_y >= ?3 AND r.min_y <= ?4 LIMIT ?5";
  Statement s;
  TILER_CHECK(sqlite3_prepare_v2(db_, sql, -1, &s.s, nullptr) == SQLITE_OK, IoError,
              "'" << path_ << "': not an annotation store: " << sqlite3_errmsg(db_));
  sqlite3_bind_double(s.s, 1, double(area.x));
  sqlite3_bind_double(s.s, 2, double(area.right()));
  sqlite3_bind_double(s.s, 3, double(area.y));
  sqlite3_bind_double(s.s, 4, double(area.bottom()));
  // Outlines are asked for first; past `limit` hits the answer is centroids, the count from the R-tree.
  sqlite3_bind_int64(s.s, 5, limit + 1);
  struct Row {
    int64_t id;
    double cx, cy;
    std::vector<uint8_t> geometry;
    std::string cls;
  };
  std::vector<Row> rows;
  int rc;
  while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) {
    Row r{sqlite3_column_int64(s.s, 0),
          sqlite3_column_double(s.s, 1),
          sqlite3_column_double(s.s, 2),
          {},
          classOf(sqlite3_column_text(s.s, 4))};
    const auto* blob = static_cast<const uint8_t*>(sqlite3_column_blob(s.s, 3));
    r.geometry.assign(blob, blob + sqlite3_column_bytes(s.s, 3));
    rows.push_back(std::move(r));
  }
  TILER_CHECK(rc == SQLITE_DONE, IoError, "'" << path_ << "': " << sqlite3_errmsg(db_));
  if (int64_t(rows.size()) > limit) return sampled(area, limit);
  nlohmann::json objects = nlohmann::json::array();
  for (auto& r : rows) {
    nlohmann::json rings = nlohmann::json::array();
    if (r.geometry.empty()) {
      rings.push_back({{r.cx, r.cy}});  // TIAToolbox keeps a point as its centroid alone
    } else {
      std::vector<uint8_t> wkb;
      if (compressed_) {
        uLongf size = uLongf(r.geometry.size()) * 8 + 1024;
        int z = Z_BUF_ERROR;
        while (size <= kMaxGeometryBytes) {
          wkb.resize(size);
          uLongf got = size;
          z = uncompress(wkb.data(), &got, r.geometry.data(), uLong(r.geometry.size()));
          if (z != Z_BUF_ERROR) {
            wkb.resize(got);
            break;
          }
          size *= 4;
        }
        TILER_CHECK(z == Z_OK, IoError,
                    "'" << path_ << "': object " << r.id << "'s geometry is not zlib data");
      } else {
        wkb = std::move(r.geometry);
      }
      WkbReader reader{wkb.data(), wkb.size()};
      TILER_CHECK(reader.geometry(rings), IoError,
                  "'" << path_ << "': object " << r.id << "'s geometry is not WKB this viewer reads");
    }
    objects.push_back({{"id", r.id}, {"class", r.cls}, {"rings", std::move(rings)}});
  }
  return {{"mode", "outlines"}, {"count", objects.size()}, {"objects", std::move(objects)}};
}

}  // namespace tiler

#endif  // TILER_WITH_VIEW
