// polygons: GeoJSON outlines of the classes of a labels raster, and where an image lies on the earth.
// Promise: writePolygons() reads a labels raster line by line through GDAL's polygonizer (memory: a few rows
// plus the polygons found) and writes one GeoJSON Feature per 4-connected region of each class other than 0,
// holes kept, exact pixel-edge outlines (areas equal pixel counts) unless simplified, with the properties
// QuPath imports (`class`, `name`, `classification {name, color}`). Coordinates: the raster's CRS when it is
// georeferenced (its EPSG code in the file's `crs`), else level-0 pixels of the input (x right, y down).
// Throws IoError naming the file. No LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tiler/io/classes.hpp"

namespace tiler {

struct PolygonOptions {
  std::vector<std::array<uint8_t, 3>> palette;  // colour of class k (labelPalette)
  std::vector<ClassInfo> named;                 // names (else "class k")
  double input_pixels_per_label_pixel = 1.0;    // model output scale 1/s: s (plain images only)
  double simplify = 0.0;                        // tolerance in input pixels; 0: exact outlines
};

// Where an image's level-0 pixels lie on the earth, as GDAL reads its georeferencing: pixel (x, y) is at
// (gt[0] + x gt[1] + y gt[2], gt[3] + x gt[4] + y gt[5]) in `crs`, GeoJSON's name of the CRS
// ("urn:ogc:def:crs:EPSG::32633"). nullopt for an image without a CRS, or in a build without GDAL.
struct GeoFrame {
  std::array<double, 6> gt{0, 1, 0, 0, 0, 1};
  std::string crs;
  std::array<double, 2> apply(double x, double y) const {
    return {gt[0] + x * gt[1] + y * gt[2], gt[3] + x * gt[4] + y * gt[5]};
  }
};
std::optional<GeoFrame> geoFrameOf(const std::string& image_path);
// The image's own mask as GDAL sees it (a TIFF's internal mask, a `.msk` sidecar: a mask band of the
// dataset, not its alpha or nodata), drawn at width x height (row-major, 0 outside, 255 inside); nullopt
// when it has none, for a remote input, or without GDAL.
std::optional<std::vector<uint8_t>> sceneMaskOf(const std::string& image_path, int width, int height);

// Returns the number of features written.
int64_t writePolygons(const std::string& labels_path, const std::string& geojson_path,
                      const PolygonOptions& o);

}  // namespace tiler
