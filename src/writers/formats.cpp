#include "tiler/writers/formats.hpp"

#include <cstring>

#include "tiler/core/error.hpp"
#include "tiler/core/version.hpp"

namespace tiler {

// Each format's opener, defined beside its writer (a new format: its file, and its declaration and row here).
std::unique_ptr<MapWriter> openLabelsWriter(const std::string& path, const MapOutput& output);
std::unique_ptr<MapWriter> openProbsWriter(const std::string& path, const MapOutput& output);
std::unique_ptr<MapWriter> openPolygonsWriter(const std::string& path, const MapOutput& output);
std::unique_ptr<MapWriter> openZarrWriter(const std::string& path, const MapOutput& output);
std::unique_ptr<WindowRowOutput> openFeatures(const RowContext& context);
std::unique_ptr<WindowRowOutput> openFeaturesTensor(const RowContext& context);
std::unique_ptr<WindowRowOutput> openClassCsv(const RowContext& context);
std::unique_ptr<WindowRowOutput> openTiles(const RowContext& context);
std::unique_ptr<WindowRowOutput> openHeatmap(const RowContext& context);
std::unique_ptr<WindowRowOutput> openWsinferCsv(const RowContext& context);
std::unique_ptr<WindowRowOutput> openWsinferGeojson(const RowContext& context);
std::unique_ptr<WindowRowOutput> openTilesStore(const RowContext& context);
std::unique_ptr<BoxOutput> openBoxesGeojson(const CatalogImage& image, const std::string& path, double width,
                                            double height);
std::unique_ptr<BoxOutput> openBoxesCsv(const CatalogImage& image, const std::string& path, double width,
                                        double height);
std::unique_ptr<BoxOutput> openBoxesStore(const CatalogImage& image, const std::string& path, double width,
                                          double height);
std::unique_ptr<BoxOutput> openCoco(const CatalogImage& image, const std::string& path, double width,
                                    double height);

namespace {

std::vector<OutputFormat> makeFormats() {
  using C = Consumes;
  std::vector<OutputFormat> formats = {
      {{"labels", "{stem}_labels.{format}", false, {}, true},
       C::kMapLabels,
       "the class map: argmax (uint8 up to 256 classes, uint16 from 257; one channel: the threshold)",
       "",
       "",
       "--format png is assembled in memory: at most 2^28 pixels (tif: none, tiled BigTIFF)",
       {openLabelsWriter}},
      {{"probs", "{stem}_probs.tif", false, {}, true},
       C::kMapValues,
       "the stitched map's values, C bands (--probs_dtype f32, f16 or u8)",
       "",
       "",
       "",
       {openProbsWriter}},
      // Traced from a scratch labels TIFF of its own when labels are not saved.
      {{"polygons", "{stem}_polygons.geojson", false, {".labels.tif"}, true},
       C::kMapLabels,
       "the labels' regions as GeoJSON polygons (QuPath annotations)",
       "gdal",
       "labels",
       "",
       {openPolygonsWriter}},
      {{"zarr", "{stem}.ome.zarr", true, {}, false, ".zattrs"},
       C::kMapValues,
       "an OME-NGFF 0.4 store: labels and probabilities as multiscale arrays",
       "",
       "",
       "",
       {openZarrWriter}},
      {{"features", "{stem}.h5"},
       C::kWindowVectors,
       "the features and the windows' coordinates as TRIDENT's and CLAM's HDF5",
       "hdf5",
       "",
       "",
       {nullptr, openFeatures}},
      // The rows go to a scratch file until the archive is written.
      {{"features_pt", "{stem}.pt", false, {".rows"}},
       C::kWindowVectors,
       "the features as one float32 tensor, as torch.save writes it",
       "",
       "",
       "",
       {nullptr, openFeaturesTensor}},
      {{"csv", "{stem}.csv"},
       C::kWindowScores,
       "WSInfer's table: minx,miny,width,height,prob_<class>...",
       "",
       "",
       "",
       {nullptr, openClassCsv}},
      {{"tiles", "{stem}_tiles.geojson"},
       C::kWindowScores,
       "QuPath tile objects classified by their highest score",
       "",
       "",
       "",
       {nullptr, openTiles}},
      {{"heatmap", "{stem}_heatmap.tif"},
       C::kWindowScores,
       "K float bands, one pixel a window",
       "",
       "",
       "",
       {nullptr, openHeatmap}},
      {{"wsinfer_csv", "model-outputs-csv/{stem}.csv"},
       C::kWindowScores,
       "WSInfer's results table (its columns, windows column by column, as its tools read it; "
       "--wsinfer_layout)",
       "",
       "",
       "",
       {nullptr, openWsinferCsv}},
      {{"wsinfer_geojson", "model-outputs-geojson/{stem}.geojson"},
       C::kWindowScores,
       "WSInfer's tiles GeoJSON (write_geojson.py's features and properties; --wsinfer_layout)",
       "",
       "",
       "",
       {nullptr, openWsinferGeojson}},
      {{"objects", "{stem}_objects.geojson"},
       C::kObjects,
       "QuPath detections: each object's outline (a box, or an instance's traced polygon) and class",
       "",
       "",
       "",
       {nullptr, nullptr, openBoxesGeojson}},
      {{"objects_csv", "{stem}_objects.csv"},
       C::kObjects,
       "one row an object: id, class, score and its measurements",
       "",
       "",
       "",
       {nullptr, nullptr, openBoxesCsv}},
      // classify writes its windows (row), detect its boxes (box), instances its outlines itself.
      {{"objects_store", "{stem}_objects.db"},
       C::kStoredObjects,
       "TIAToolbox's SQLiteStore (SQLite: WKB geometry, JSON properties, an R-tree) of the objects, or of "
       "the "
       "classified windows as boxes",
       "",
       "",
       "",
       {nullptr, openTilesStore, openBoxesStore}},
      {{"coco", "{stem}_coco.json"},
       C::kBoxes,
       "the boxes as a COCO detection file",
       "",
       "",
       "",
       {nullptr, nullptr, openCoco}},
      {{"instances", "{stem}_instances.tif", false, {}, true},
       C::kInstanceMap,
       "the objects' ids as a uint32 image",
       "",
       "",
       "ids up to 2^32 - 1",
       {}},
  };
  for (size_t i = 0; i < formats.size(); ++i) {
    if (!*formats[i].after) continue;
    bool earlier = false;
    for (size_t j = 0; j < i; ++j)
      earlier = earlier || std::strcmp(formats[j].naming.name, formats[i].after) == 0;
    TILER_CHECK(earlier, ConfigError,
                "format '" << formats[i].naming.name << "' reads '" << formats[i].after
                           << "', which is not an earlier row of writers/formats");
  }
  return formats;
}

}  // namespace

const char* consumesWords(Consumes consumes) {
  switch (consumes) {
    case Consumes::kMapValues:
      return "a stitched map's values";
    case Consumes::kMapLabels:
      return "a stitched class map's labels";
    case Consumes::kWindowScores:
      return "class scores a window";
    case Consumes::kWindowVectors:
      return "a feature vector a window";
    case Consumes::kBoxes:
      return "boxes";
    case Consumes::kObjects:
      return "objects";
    case Consumes::kInstanceMap:
      return "an instance map";
    case Consumes::kStoredObjects:
      return "objects, or classified windows";
  }
  return "?";
}

const std::vector<OutputFormat>& outputFormats() {
  static const std::vector<OutputFormat> formats = makeFormats();
  return formats;
}

const OutputFormat* findOutputFormat(const std::string& kind) {
  const std::string bare = bareKind(kind);
  for (const OutputFormat& format : outputFormats())
    if (bare == format.naming.name) return &format;
  return nullptr;
}

void requireFormatFeature(const std::string& kind) {
  const OutputFormat* format = findOutputFormat(kind);
  if (format != nullptr && *format->feature) requireFeature(format->feature, "--save " + kind);
}

const OutputKind& outputNaming(const std::string& kind) {
  const OutputFormat* format = findOutputFormat(kind);
  TILER_CHECK(format != nullptr, ConfigError, "no output kind '" << kind << "'");
  return format->naming;
}

}  // namespace tiler
