// writers/wsinfer: classify's class scores as WSInfer writes them, so that the tools written for a WSInfer
// results directory read tiler's unchanged: model-outputs-csv/<stem>.csv (wsinfer/modellib/run_inference.py:
// minx,miny,width,height,prob_<class>... of each patch, pandas' to_csv of float64 values) and
// model-outputs-geojson/<stem>.geojson (wsinfer/write_geojson.py: one Polygon Feature a patch, properties
// isLocked, measurements {prob_<class>: value}, objectType "tile", as Python's json.dump writes them).
// WSInfer's patches come column by column (itertools.product of x, then y: y varies fastest), so an image's
// rows are held until its last window and written in that order. WSInfer's feature ids are random UUIDs; here
// they are derived from the stem and the place, so that every run and world size writes the same bytes.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <tuple>

#include "tiler/io/readers/remote_input.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {

std::unique_ptr<WindowRowOutput> openWsinferCsv(const RowContext& context);
std::unique_ptr<WindowRowOutput> openWsinferGeojson(const RowContext& context);

namespace {

// Python's repr of a double (what pandas' to_csv and json.dump write): the shortest digits that read back,
// with ".0" on an integral value ("1.0", not "1").
std::string pythonFloat(double v) {
  std::string text = fmt::format("{}", v);
  if (text.find_first_of(".eEnN") == std::string::npos) text += ".0";
  return text;
}

// A value as json.dump writes it (NaN and Infinity, which JSON lacks, as Python writes them).
std::string jsonFloat(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return pythonFloat(v);
}

// The rows of one image's windows in WSInfer's order: held until the image's last window, then written
// column by column, each column top to bottom.
class ColumnOrder : public WindowRowOutput {
 public:
  using Write = std::function<void(const WindowPlace&, const std::vector<float>&)>;
  // `end`: what the file holds after its rows.
  ColumnOrder(std::unique_ptr<OutputWriter> file, size_t values, Write write, std::function<void()> end = {})
      : file_(std::move(file)), values_(values), write_(std::move(write)), end_(std::move(end)) {}
  void feed(const WindowPlace& place, const float* v) override {
    rows_.push_back({place, std::vector<float>(v, v + values_)});
  }
  void finish() override {
    std::stable_sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) {
      return std::tie(a.place.column, a.place.row) < std::tie(b.place.column, b.place.row);
    });
    for (const Row& row : rows_) write_(row.place, row.values);
    rows_.clear();
    if (end_) end_();
    file_->finish();
  }
  void commit(std::vector<std::string>& renamed) override { file_->commit(renamed); }

 private:
  struct Row {
    WindowPlace place;
    std::vector<float> values;
  };
  std::unique_ptr<OutputWriter> file_;
  size_t values_;
  Write write_;
  std::function<void()> end_;
  std::vector<Row> rows_;
};

// 64 bits of a splitmix64 step: the UUID's bits from the stem's hash and the window's place.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// An RFC 9562 version 8 (vendor-specific) UUID: the stem's and the place's, the same in every run.
std::string placeUuid(uint64_t stem_hash, const WindowPlace& p) {
  uint64_t hi = mix(stem_hash ^ mix(uint64_t(p.x))), lo = mix(hi ^ mix(uint64_t(p.y) + 0x51ull));
  hi = (hi & ~0xf000ull) | 0x8000ull;                         // version 8
  lo = (lo & 0x3fffffffffffffffull) | 0x8000000000000000ull;  // variant 10
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", hi >> 32, (hi >> 16) & 0xffff, hi & 0xffff,
                     lo >> 48, lo & 0xffffffffffffull);
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

// model-outputs-csv/<stem>.csv: WSInfer's columns; a probability as pandas writes a float64 (WSInfer's
// float32 scores widened), NaN as an empty field.
std::unique_ptr<WindowRowOutput> openWsinferCsv(const RowContext& c) {
  std::vector<std::string> columns = {"minx", "miny", "width", "height"};
  for (const auto& k : c.classes) columns.push_back("prob_" + k.name);
  auto file = std::make_unique<CsvFile>(c.path, columns);
  CsvFile& csv = *file;
  return std::make_unique<ColumnOrder>(
      std::move(file), c.classes.size(), [&csv](const WindowPlace& p, const std::vector<float>& v) {
        std::string line = fmt::format("{},{},{},{}", p.x, p.y, p.width, p.height);
        for (const float value : v) line += "," + (std::isnan(value) ? "" : pythonFloat(double(value)));
        csv.row(line);
      });
}

// model-outputs-geojson/<stem>.geojson: write_geojson.py's FeatureCollection, its keys in its order; the
// box from (maxx, miny) around to itself, its coordinates floats as pandas' rows hold them.
std::unique_ptr<WindowRowOutput> openWsinferGeojson(const RowContext& c) {
  auto file = std::make_unique<TextFile>(c.path);
  TextFile& text = *file;
  text.write(R"({"type": "FeatureCollection", "features": [)");
  std::vector<std::string> keys;
  for (const auto& k : c.classes)
    keys.push_back(nlohmann::json("prob_" + k.name).dump(-1, ' ', /*ensure_ascii=*/true));
  const uint64_t stem = fnv1a(inputStem(c.image.input));
  return std::make_unique<ColumnOrder>(
      std::move(file), c.classes.size(),
      [&text, keys, stem, first = true](const WindowPlace& p, const std::vector<float>& v) mutable {
        const std::string x0 = pythonFloat(double(p.x)), y0 = pythonFloat(double(p.y)),
                          x1 = pythonFloat(double(p.x + p.width)), y1 = pythonFloat(double(p.y + p.height));
        std::string feature = fmt::format(
            R"({}{{"type": "Feature", "id": "{}", "geometry": {{"type": "Polygon", "coordinates": )"
            R"([[[{}, {}], [{}, {}], [{}, {}], [{}, {}], [{}, {}]]]}}, "properties": {{"isLocked": true, )"
            R"("measurements": {{)",
            first ? "" : ", ", placeUuid(stem, p), x1, y0, x1, y1, x0, y1, x0, y0, x1, y0);
        for (size_t k = 0; k < keys.size(); ++k)
          feature += (k ? ", " : "") + keys[k] + ": " + jsonFloat(double(v[k]));
        feature += R"(}, "objectType": "tile"}})";
        text.write(feature);
        first = false;
      },
      [&text] { text.write("]}"); });
}

}  // namespace tiler
