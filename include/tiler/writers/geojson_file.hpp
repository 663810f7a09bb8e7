// writers/geojson_file: a GeoJSON output (--save polygons' tiles and objects kinds: tiles, objects): a
// TextFile under its partial name written through the one GeoJSON writer (geojson.hpp), committed by the
// commit protocol (output_file.hpp). No LibTorch.
#pragma once

#include <string>
#include <vector>

#include "tiler/io/geojson.hpp"
#include "tiler/writers/output_file.hpp"

namespace tiler {

struct GeoJsonFile : public OutputWriter {
  explicit GeoJsonFile(const std::string& path, const std::string& crs = "")
      : file(path), writer([this](const std::string& text) { file.write(text); }, crs) {}
  GeoJsonFile(const GeoJsonFile&) = delete;
  GeoJsonFile& operator=(const GeoJsonFile&) = delete;
  // Closes the collection and the file (still under its partial name).
  void finish() override {
    writer.finish();
    file.finish();
  }
  void commit(std::vector<std::string>& renamed) override { file.commit(renamed); }
  TextFile file;
  GeoJsonWriter writer;  // writes into `file`
};

}  // namespace tiler
