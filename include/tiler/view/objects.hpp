// view/objects: a job's objects read by viewport from its annotation store (`<stem>_objects.db`, TIAToolbox's
// SQLiteStore layout: `annotations` (id, key, objtype, cx, cy, geometry, properties, area), the R-tree
// `rtree` (id, min_x, max_x, min_y, max_y) on the same ids, WKB geometry zlib-compressed when `metadata`'s
// compression says so). Promise: a query reads only the R-tree's hits in its rectangle, at most `limit` + 1
// rows: outlines when at most `limit` objects lie there, else centroids spread over the rectangle (at most
// `limit`, a bounded R-tree walk in each of 16 x 16 cells); read-only (the file is opened read-only and
// immutable to SQLite). No LibTorch.
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "tiler/core/grid.hpp"

struct sqlite3;

namespace tiler {

class ObjectStore {
 public:
  // Opens `path` read-only; throws IoError naming it when it is not such a store.
  explicit ObjectStore(const std::string& path);
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // The objects whose bounds meet `area` (level-0 pixels): {"mode": "outlines", "count", "objects": [{"id",
  // "class", "rings": [[[x, y], ...], ...]}]} when at most `limit`, else {"mode": "centroids", "cells": 16,
  // "points": [[x, y, class], ...], "full": [bool a cell, row by row]}: each cell's first limit / 256
  // centroids, "full" where it holds more (a density, not every object).
  nlohmann::json query(const Rect& area, int64_t limit);
  // The number of objects in the store.
  int64_t count();

 private:
  nlohmann::json sampled(const Rect& area, int64_t limit);  // query's centroids, mutex_ held
  std::string path_;
  sqlite3* db_ = nullptr;
  bool compressed_ = false;
  std::mutex mutex_;  // one connection, one query at a time
};

}  // namespace tiler
