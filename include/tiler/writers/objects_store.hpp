// writers/objects_store: an image's objects as an SQLite annotation store in TIAToolbox's SQLiteStore layout
// (tiatoolbox/annotation/storage.py, store version 1.0.1), so that its SQLiteStore, its viewer and plain SQL
// query them by viewport (--save objects_store, <stem>_objects.db). No LibTorch.
// Promise: the tables are SQLiteStore's own: `metadata` (key, value as JSON: version "1.0.1", compression
// "zlib", compression_level 9), the R-tree `rtree` (id, min_x, max_x, min_y, max_y) and `annotations` (id,
// key, objtype, cx, cy, geometry, properties, area); a row is what SQLiteStore's _make_token and _append
// make of the object: its geometry as shapely's WKB (little endian, rings closed; a Polygon, or a
// MultiPolygon for several parts) compressed by zlib, its centroid, area and bounds as shapely computes them
// from that geometry, its properties as compact JSON in the order given, and its key the object's id in
// decimal. Objects are inserted in the order given (ids increasing), committed every few thousand, so the
// memory is SQLite's bounded page cache whatever the object count, and the same objects in the same order
// make the same bytes. The file is written under "<path>.partial" and appears only through the commit
// protocol (output_file.hpp); destroyed uncommitted, it is removed. Every failure (a full disk included) is
// an IoError naming the file and SQLite's message.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tiler/writers/output_file.hpp"

struct sqlite3;
struct sqlite3_stmt;
struct z_stream_s;

namespace tiler {

// A ring's vertices (level-0 pixels), not closed; a polygon: its outer ring, then its holes.
using StoreRing = std::vector<std::array<double, 2>>;
using StorePolygon = std::vector<StoreRing>;

// A float (a model's score) as the double its shortest decimal form names (0.9, not 0.8999999761581421), as
// the GeoJSON writes it; NaN and infinities stay so (JSON null).
double storeNumber(float value);
// The geometry as shapely writes its WKB: a Polygon for one polygon, a MultiPolygon for more.
std::string storeWkb(const std::vector<StorePolygon>& polygons);

class ObjectsStore : public OutputWriter {
 public:
  // Creates "<path>.partial" anew (what was there, a link included, is replaced, never followed) with the
  // store's tables.
  explicit ObjectsStore(std::string path);
  ~ObjectsStore() override;
  ObjectsStore(const ObjectsStore&) = delete;
  ObjectsStore& operator=(const ObjectsStore&) = delete;

  // One object: its id (> every earlier one's), geometry (at least one polygon of at least three vertices)
  // and properties (a JSON object).
  void add(int64_t id, const std::vector<StorePolygon>& polygons, const nlohmann::ordered_json& properties);
  // The axis-aligned box [x1, x2] x [y1, y2] as its polygon.
  static std::vector<StorePolygon> box(double x1, double y1, double x2, double y2);
  // Commits, closes and syncs to disk (still under its partial name).
  void finish() override;
  void commit(std::vector<std::string>& renamed) override;
  // TILER_FAULT: from now on the store cannot grow by a page, as on a full disk (SQLite's SQLITE_FULL).
  bool failAsFullDisk() override;
  std::string partial() const { return path_ + ".partial"; }
  int64_t objects() const { return objects_; }

 private:
  void exec(const char* sql);
  [[noreturn]] void fail(const char* doing);
  void close();

  std::string path_;
  sqlite3* db_ = nullptr;                      // owned
  sqlite3_stmt* insert_annotation_ = nullptr;  // owned
  sqlite3_stmt* insert_rtree_ = nullptr;       // owned
  z_stream_s* zlib_ = nullptr;  // owned: one deflate state reset for each geometry (compress2's bytes)
  int64_t objects_ = 0, last_id_ = 0;
  bool committed_ = false;
};

}  // namespace tiler
