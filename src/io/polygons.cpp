#include "tiler/io/polygons.hpp"

#if TILER_WITH_GDAL
#include <cpl_conv.h>
#include <gdal.h>
#include <gdal_alg.h>
#include <ogr_api.h>
#include <ogr_srs_api.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/core/version.hpp"
#include "tiler/io/geojson.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace tiler {

#if TILER_WITH_GDAL
namespace {

// Multiplies every coordinate of a GeoJSON geometry's "coordinates" (nested arrays of [x, y]) by `factor`.
void scaleCoordinates(nlohmann::json& coords, double factor) {
  if (coords.is_number()) {
    coords = coords.get<double>() * factor;
    return;
  }
  for (auto& c : coords) scaleCoordinates(c, factor);
}

// GDAL's messages go into tiler's errors, not to stderr.
struct QuietGdal {
  QuietGdal() { CPLPushErrorHandler(CPLQuietErrorHandler); }
  ~QuietGdal() { CPLPopErrorHandler(); }
};

struct DatasetCloser {
  void operator()(void* ds) const { GDALClose(ds); }
};

struct OwnedFd {
  int fd;
  ~OwnedFd() { ::close(fd); }
};

// GeoJSON's name of a CRS ("urn:ogc:def:crs:EPSG::32633"), "" when it has no authority code.
std::string crsName(OGRSpatialReferenceH srs) {
  if (srs == nullptr) return "";
  OSRAutoIdentifyEPSG(srs);
  const char* authority = OSRGetAuthorityName(srs, nullptr);
  const char* code = OSRGetAuthorityCode(srs, nullptr);
  return authority && code ? std::string("urn:ogc:def:crs:") + authority + "::" + code : "";
}

}  // namespace

std::optional<GeoFrame> geoFrameOf(const std::string& image_path) {
  GDALAllRegister();
  const QuietGdal quiet;
  std::unique_ptr<void, DatasetCloser> raster(
      GDALOpenEx(image_path.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY, nullptr, nullptr, nullptr));
  if (!raster) return std::nullopt;
  GeoFrame frame;
  if (GDALGetGeoTransform(raster.get(), frame.gt.data()) != CE_None) return std::nullopt;
  frame.crs = crsName(const_cast<OGRSpatialReferenceH>(GDALGetSpatialRef(raster.get())));
  if (frame.crs.empty()) return std::nullopt;
  return frame;
}

std::optional<std::vector<uint8_t>> sceneMaskOf(const std::string& image_path, int width, int height) {
  if (isRemoteInput(image_path)) return std::nullopt;
  GDALAllRegister();
  const QuietGdal quiet;
  // A .msk beside the image is found by listing its directory, which remote inputs turn off process-wide.
  const std::string readdir = CPLGetThreadLocalConfigOption("GDAL_DISABLE_READDIR_ON_OPEN", "");
  CPLSetThreadLocalConfigOption("GDAL_DISABLE_READDIR_ON_OPEN", "FALSE");
  struct Restore {
    std::string value;
    ~Restore() {
      CPLSetThreadLocalConfigOption("GDAL_DISABLE_READDIR_ON_OPEN", value.empty() ? nullptr : value.c_str());
    }
  } restore{readdir};
  std::unique_ptr<void, DatasetCloser> raster(
      GDALOpenEx(image_path.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY, nullptr, nullptr, nullptr));
  if (!raster || GDALGetRasterCount(raster.get()) < 1) return std::nullopt;
  GDALRasterBandH band = GDALGetRasterBand(raster.get(), 1);
  const int flags = GDALGetMaskFlags(band);
  if (!(flags & GMF_PER_DATASET) || (flags & (GMF_ALL_VALID | GMF_ALPHA | GMF_NODATA))) return std::nullopt;
  std::vector<uint8_t> mask(size_t(width) * size_t(height));
  if (GDALRasterIO(GDALGetMaskBand(band), GF_Read, 0, 0, GDALGetRasterXSize(raster.get()),
                   GDALGetRasterYSize(raster.get()), mask.data(), width, height, GDT_Byte, 0, 0) != CE_None)
    TILER_THROW(IoError, "'" << image_path << "': its mask cannot be read: " << CPLGetLastErrorMsg());
  return mask;
}

int64_t writePolygons(const std::string& labels_path, const std::string& geojson_path,
                      const PolygonOptions& o) {
  GDALAllRegister();
  const QuietGdal quiet;
  CPLErrorReset();
  std::unique_ptr<void, DatasetCloser> raster(GDALOpen(labels_path.c_str(), GA_ReadOnly));
  TILER_CHECK(raster, IoError,
              "'" << labels_path << "': GDAL cannot open the labels: " << CPLGetLastErrorMsg());
  GDALRasterBandH band = GDALGetRasterBand(raster.get(), 1);
  double gt[6] = {0, 1, 0, 0, 0, 1};
  const bool georeferenced =
      GDALGetGeoTransform(raster.get(), gt) == CE_None && GDALGetSpatialRef(raster.get());
  // The polygons gather in an in-memory layer: one feature per region, nothing per pixel.
  // Through the GDAL dataset API (the OGR_Dr_/OGR_DS_ calls are deprecated and crash in GDAL 3.10): the
  // vector "Memory" driver, merged into "MEM" from GDAL 3.11.
  GDALDriverH memory = GDALGetDriverByName("Memory");
  if (memory == nullptr) memory = GDALGetDriverByName("MEM");
  TILER_CHECK(memory, IoError, "GDAL has no in-memory vector driver");
  std::unique_ptr<void, DatasetCloser> source(GDALCreate(memory, "polygons", 0, 0, 0, GDT_Unknown, nullptr));
  TILER_CHECK(source, IoError, "GDAL cannot make an in-memory layer: " << CPLGetLastErrorMsg());
  OGRLayerH layer = GDALDatasetCreateLayer(source.get(), "polygons", nullptr, wkbPolygon, nullptr);
  OGRFieldDefnH field = OGR_Fld_Create("class", OFTInteger);
  OGR_L_CreateField(layer, field, TRUE);
  OGR_Fld_Destroy(field);
  // The band is its own mask: class 0 makes no polygon.
  if (GDALPolygonize(band, band, layer, 0, nullptr, nullptr, nullptr) != CE_None)
    TILER_THROW(IoError, "'" << labels_path << "': polygonizing failed: " << CPLGetLastErrorMsg());

  // Created anew like every output (a link planted at the name is replaced, never followed).
  const int fd = createFileExclusively(geojson_path);
  TILER_CHECK(fd >= 0, IoError, "'" << geojson_path << "': cannot create: " << std::strerror(errno));
  const OwnedFd owned{fd};
  std::string out;
  // Written a few features at a time, so that memory holds the polygons, not their text.
  const auto drain = [&](size_t above) {
    if (out.size() <= above) return;
    TILER_CHECK(writeAll(fd, out), IoError,
                "'" << geojson_path << "': writing failed: " << std::strerror(errno));
    out.clear();
  };
  GeoJsonWriter writer([&out](const std::string& text) { out += text; },
                       georeferenced ? crsName(GDALGetSpatialRef(raster.get())) : "");
  // Plain images: polygonize's coordinates are label pixels; users want the input's level-0 pixels.
  const double factor = georeferenced ? 1.0 : o.input_pixels_per_label_pixel;
  const double tolerance =
      o.simplify * (georeferenced ? std::abs(gt[1]) : 1.0 / o.input_pixels_per_label_pixel);
  OGR_L_ResetReading(layer);
  for (OGRFeatureH f; (f = OGR_L_GetNextFeature(layer)) != nullptr; OGR_F_Destroy(f)) {
    const int k = OGR_F_GetFieldAsInteger(f, 0);
    OGRGeometryH geometry = OGR_F_GetGeometryRef(f);
    OGRGeometryH simplified = tolerance > 0 ? OGR_G_SimplifyPreserveTopology(geometry, tolerance) : nullptr;
    char* text = OGR_G_ExportToJson(simplified ? simplified : geometry);
    nlohmann::json g = nlohmann::json::parse(text);
    VSIFree(text);
    if (simplified) OGR_G_DestroyGeometry(simplified);
    if (factor != 1.0) scaleCoordinates(g["coordinates"], factor);
    ClassInfo c{
        k < int(o.named.size()) ? o.named[size_t(k)].name : defaultClassName(k), {255, 255, 255}, true};
    if (k < int(o.palette.size())) c.color = o.palette[size_t(k)];
    GeoJsonFeature feature;
    feature.geometry = g.dump();
    feature.properties = "\"class\": " + std::to_string(k) + ", \"name\": " + nlohmann::json(c.name).dump();
    feature.classification = &c;
    writer.add(feature);
    drain(1 << 20);
  }
  writer.finish();
  drain(0);
  TILER_CHECK(::fsync(fd) == 0, IoError,
              "'" << geojson_path << "': writing failed: " << std::strerror(errno));
  return writer.features();
}

#else
std::optional<GeoFrame> geoFrameOf(const std::string&) {
  return std::nullopt;
}

std::optional<std::vector<uint8_t>> sceneMaskOf(const std::string&, int, int) {
  return std::nullopt;
}

int64_t writePolygons(const std::string&, const std::string& geojson_path, const PolygonOptions&) {
  requireFeature("gdal", "'" + geojson_path + "' (--save polygons)");
  return 0;
}
#endif

}  // namespace tiler
