#include "tiler/writers/instances.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <unordered_map>

#include "tiler/core/error.hpp"
#include "tiler/writers/blend.hpp"
#include "tiler/writers/objects_store.hpp"

namespace fs = std::filesystem;

namespace tiler {

namespace {

// The four directions of a boundary edge (y down), in clockwise order: a right turn is the next one.
enum Direction : uint8_t { kRight = 0, kDown = 1, kLeft = 2, kUp = 3 };
constexpr int kStepX[4] = {1, 0, -1, 0}, kStepY[4] = {0, 1, 0, -1};

struct Edge {
  int64_t from = 0;  // vertex index: y (width + 1) + x
  uint8_t dir = kRight;
  int64_t inside = 0;  // the pixel on its right (the part's), y width + x
};

// The 4-connected part of every pixel of the mask (-1: out), numbered in raster order of first pixels.
std::vector<int32_t> labelParts(const uint8_t* mask, int64_t width, int64_t height, int32_t& parts) {
  std::vector<int32_t> part(size_t(width * height), -1);
  std::vector<int64_t> stack;
  parts = 0;
  for (int64_t p = 0; p < width * height; ++p) {
    if (!mask[p] || part[size_t(p)] >= 0) continue;
    part[size_t(p)] = parts;
    stack.push_back(p);
    while (!stack.empty()) {
      const int64_t q = stack.back();
      stack.pop_back();
      const int64_t x = q % width, y = q / width;
      for (int d = 0; d < 4; ++d) {
        const int64_t nx = x + kStepX[d], ny = y + kStepY[d];
        if (nx < 0 || ny < 0 || nx >= width || ny >= height) continue;
        const int64_t n = ny * width + nx;
        if (mask[n] && part[size_t(n)] < 0) {
          part[size_t(n)] = parts;
          stack.push_back(n);
        }
      }
    }
    ++parts;
  }
  return part;
}

// A closed walk cut into simple loops at the vertices it passes twice: each time a vertex comes again, the
// loop since its first pass is one (a walk along pixel edges passes a vertex at most twice, and its loops
// nest, never cross); what remains is the last.
std::vector<std::vector<int64_t>> splitAtRepeatedVertices(const std::vector<int64_t>& walk) {
  std::vector<std::vector<int64_t>> loops;
  std::vector<int64_t> open;
  std::unordered_map<int64_t, size_t> place;  // vertex -> its index in `open`
  for (int64_t v : walk) {
    const auto [it, fresh] = place.try_emplace(v, open.size());
    if (fresh) {
      open.push_back(v);
      continue;
    }
    const size_t first = it->second;
    loops.emplace_back(open.begin() + std::ptrdiff_t(first), open.end());
    for (size_t i = first + 1; i < open.size(); ++i) place.erase(open[i]);
    open.resize(first + 1);
  }
  loops.push_back(std::move(open));
  return loops;
}

}  // namespace

double ringArea(const OutlineRing& ring) {
  double twice = 0;
  for (size_t i = 0; i < ring.size(); ++i) {
    const auto& a = ring[i];
    const auto& b = ring[(i + 1) % ring.size()];
    twice += double(a[0]) * b[1] - double(b[0]) * a[1];
  }
  return twice / 2;
}

std::vector<OutlinePolygon> traceOutlines(const uint8_t* mask, int64_t width, int64_t height) {
  const auto in = [&](int64_t x, int64_t y) {
    return x >= 0 && y >= 0 && x < width && y < height && mask[y * width + x] != 0;
  };
  const int64_t stride = width + 1;
  // Every pixel side between in and out, directed with the pixel on its right, in raster order.
  std::vector<Edge> edges;
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) {
      if (!in(x, y)) continue;
      const int64_t p = y * width + x;
      if (!in(x, y - 1)) edges.push_back({y * stride + x, kRight, p});
      if (!in(x + 1, y)) edges.push_back({y * stride + x + 1, kDown, p});
      if (!in(x, y + 1)) edges.push_back({(y + 1) * stride + x + 1, kLeft, p});
      if (!in(x - 1, y)) edges.push_back({(y + 1) * stride + x, kUp, p});
    }
  // At most two edges leave a vertex (two parts meeting at a corner).
  std::unordered_map<int64_t, std::array<int64_t, 2>> leaving;
  leaving.reserve(edges.size());
  for (size_t e = 0; e < edges.size(); ++e) {
    auto [it, fresh] = leaving.try_emplace(edges[e].from, std::array<int64_t, 2>{int64_t(e), -1});
    if (!fresh) it->second[1] = int64_t(e);
  }
  int32_t parts = 0;
  const std::vector<int32_t> part = labelParts(mask, width, height, parts);
  std::vector<OutlinePolygon> polygons(static_cast<size_t>(parts));
  std::vector<bool> used(edges.size(), false);
  std::vector<int64_t> corners;  // the vertices where a boundary turns, in its order
  for (size_t start = 0; start < edges.size(); ++start) {
    if (used[start]) continue;
    corners.clear();
    size_t e = start;
    while (!used[e]) {
      used[e] = true;
      const Edge& edge = edges[e];
      const int64_t to = edge.from + kStepX[edge.dir] + kStepY[edge.dir] * stride;
      const auto& next = leaving.at(to);
      // Where two pixels meet at a corner, turn right: the boundary keeps to its own 4-connected part.
      size_t n = size_t(next[0]);
      if (next[1] >= 0 && edges[n].dir != (edge.dir + 1) % 4) n = size_t(next[1]);
      if (edges[n].dir != edge.dir) corners.push_back(to);
      e = n;
    }
    // A boundary passes a corner twice where two of its part's pixels meet there across background: split
    // there, it is simple rings that touch at that point (the outer ring and a hole, or two holes), as
    // GEOS's validity wants, never one ring that touches itself.
    OutlinePolygon& polygon = polygons[size_t(part[size_t(edges[start].inside)])];
    for (const std::vector<int64_t>& loop : splitAtRepeatedVertices(corners)) {
      OutlineRing ring;
      ring.reserve(loop.size());
      for (int64_t v : loop) ring.push_back({int32_t(v % stride), int32_t(v / stride)});
      std::rotate(ring.begin(),
                  std::min_element(
                      ring.begin(), ring.end(),
                      [](const auto& a, const auto& b) { return a[1] != b[1] ? a[1] < b[1] : a[0] < b[0]; }),
                  ring.end());
      // A part's outer ring is the one ring of positive area: it comes first.
      if (ringArea(ring) > 0)
        polygon.insert(polygon.begin(), std::move(ring));
      else
        polygon.push_back(std::move(ring));
    }
  }
  return polygons;
}

std::vector<WindowObject> objectsOfWindow(const double* values, int64_t channels, int64_t height,
                                          int64_t width, const Rect& inside,
                                          const std::function<std::string()>& where) {
  const int64_t plane = height * width, classes = channels - 1;
  const int64_t x0 = std::max<int64_t>(inside.x, 0), x1 = std::min(inside.right(), width);
  std::vector<WindowObject> objects;
  std::unordered_map<int64_t, size_t> index;  // id -> objects[]
  std::vector<double> sum_x, sum_y;
  for (int64_t y = std::max<int64_t>(inside.y, 0); y < std::min(inside.bottom(), height); ++y) {
    int64_t run_id = 0, run_start = 0;
    size_t run_object = 0;
    for (int64_t x = x0; x <= x1; ++x) {
      int64_t id = 0;
      if (x < x1) {
        const double v = values[y * width + x];
        TILER_CHECK(v >= 0 && v < 2147483648.0 && v == std::floor(v), IoError,
                    where() << "pixel (" << x << ", " << y << ") of the instance map is "
                            << fmt::format("{}", v)
                            << ", not an object id (a whole number in [0, 2^31), 0 for background)");
        id = int64_t(v);
      }
      if (id == run_id) continue;
      if (run_id != 0) objects[run_object].runs.push_back({int32_t(y), int32_t(run_start), int32_t(x)});
      run_id = id;
      run_start = x;
      if (id == 0) continue;
      auto [it, fresh] = index.try_emplace(id, objects.size());
      if (fresh) {
        WindowObject o;
        o.id = id;
        o.x0 = x;
        o.y0 = y;
        o.x1 = x + 1;
        o.y1 = y + 1;
        o.class_means.assign(size_t(classes), 0.0);
        objects.push_back(std::move(o));
        sum_x.push_back(0);
        sum_y.push_back(0);
      }
      run_object = it->second;
    }
  }
  // Measurements from the runs: counts, bounds, centroids, class sums.
  for (size_t i = 0; i < objects.size(); ++i) {
    WindowObject& o = objects[i];
    for (const auto& [y, a, b] : o.runs) {
      const int64_t n = b - a;
      o.pixels += n;
      o.x0 = std::min<int64_t>(o.x0, a);
      o.x1 = std::max<int64_t>(o.x1, b);
      o.y1 = std::max<int64_t>(o.y1, y + 1);
      sum_x[i] += double(n) * (double(a) + double(b)) / 2;  // pixel centres a + 0.5 ... b - 0.5
      sum_y[i] += double(n) * (double(y) + 0.5);
      for (int64_t k = 0; k < classes; ++k) {
        const double* row = values + (k + 1) * plane + int64_t(y) * width;
        for (int64_t x = a; x < b; ++x) o.class_means[size_t(k)] += row[x];
      }
    }
    o.cx = sum_x[i] / double(o.pixels);
    o.cy = sum_y[i] / double(o.pixels);
    for (double& m : o.class_means) m /= double(o.pixels);
  }
  return objects;
}

InstanceOutputs::InstanceOutputs(const CatalogImage& image, InstanceOptions options)
    : image_(image), options_(std::move(options)), order_(image) {
  TILER_CHECK(options_.channels >= 1 && options_.height > 0 && options_.width > 0, ConfigError,
              "--task instances needs a map of at least one channel");
  fs::create_directories(fs::path(image.outputs.begin()->second).parent_path());
  const auto saved = [&](const char* kind) {
    return std::find(options_.kinds.begin(), options_.kinds.end(), kind) != options_.kinds.end();
  };
  if (saved("objects")) geojson_ = openObjectsGeojson(image, geo_);
  if (saved("objects_store")) store_ = std::make_unique<ObjectsStore>(image.outputs.at("objects_store"));
  if (saved("objects_csv")) {
    std::vector<std::string> columns = {"id",         "class", "score", "area", "centroid_x",
                                        "centroid_y", "x1",    "y1",    "x2",   "y2"};
    for (const ClassInfo& c : options_.classes) columns.push_back("prob_" + c.name);
    csv_ = std::make_unique<CsvFile>(image.outputs.at("objects_csv"), columns);
  }
  if (saved("instances")) {
    out_w_ = options_.scale.apply(image.info.width);
    out_h_ = options_.scale.apply(image.info.height);
    WriterOptions wo = options_.tiff;
    wo.nearest = true;  // reduced levels keep ids, never mean them
    raster_ = std::make_unique<ImageOutput>(std::make_unique<ImageWriter>(
        image.outputs.at("instances"), out_w_, out_h_, 1, SampleType::kU32, wo));
    band_ = cv::Mat::zeros(int(options_.height), int(out_w_), CV_32S);
  }
}

InstanceOutputs::~InstanceOutputs() = default;

WindowObjects keepWindowObjects(const CatalogImage& image, const InstanceOptions& options, int64_t window,
                                const double* values) {
  const WindowGrid& grid = image.grid;
  const Rect place = grid.imageWindow(window);
  const size_t column = size_t(window % grid.columns()), row = size_t(window / grid.columns());
  const auto where = [&] {
    return fmt::format("'{}': window {} (column {}, row {}): ", image.input, window, column, row);
  };
  const double s = options.scale.value();
  const int64_t h = options.height, w = options.width;
  const auto saved = [&](const char* kind) {
    return std::find(options.kinds.begin(), options.kinds.end(), kind) != options.kinds.end();
  };
  const bool outlines = saved("objects") || saved("objects_store");
  // The window's output pixels that are the image's (a lattice window or a small image's reaches past it):
  // an object is what the model found there, as the instance TIFF holds it; padding is no one's.
  const int64_t ox = options.scale.apply(place.x), oy = options.scale.apply(place.y);
  const Rect inside{-ox, -oy, options.scale.apply(grid.imageWidth()),
                    options.scale.apply(grid.imageHeight())};
  WindowObjects out;
  for (int64_t c = 0; c < options.channels; ++c)
    for (int64_t y = std::max<int64_t>(inside.y, 0); y < std::min(inside.bottom(), h); ++y)
      for (int64_t x = std::max<int64_t>(inside.x, 0); x < std::min(inside.right(), w); ++x)
        out.non_finite += !std::isfinite(values[(c * h + y) * w + x]);
  for (WindowObject& o : objectsOfWindow(values, options.channels, h, w, inside, where)) {
    const double cx = o.cx / s, cy = o.cy / s;  // processing pixels in the window
    if (!inWindowCore(grid.startsX(), grid.windowWidth(), column, double(grid.startsX()[column]) + cx) ||
        !inWindowCore(grid.startsY(), grid.windowHeight(), row, double(grid.startsY()[row]) + cy))
      continue;
    // Cut by a window edge inside the image: this window saw a part of it, so no window keeps it.
    if ((o.x0 == 0 && place.x > 0) || (o.y0 == 0 && place.y > 0) ||
        (o.x1 == w && place.right() < grid.imageWidth()) ||
        (o.y1 == h && place.bottom() < grid.imageHeight())) {
      ++out.cut;
      continue;
    }
    KeptObject k;
    if (outlines) {
      // The object's mask in its box with a border of one pixel.
      const int64_t bw = o.x1 - o.x0 + 2, bh = o.y1 - o.y0 + 2;
      std::vector<uint8_t> mask(size_t(bw * bh), 0);
      for (const auto& [y, a, b] : o.runs)
        std::fill_n(mask.begin() + (y - o.y0 + 1) * bw + (a - o.x0 + 1), b - a, uint8_t(1));
      k.outlines = traceOutlines(mask.data(), bw, bh);
    }
    if (!o.class_means.empty()) k.k = highestClass(o.class_means.data(), o.class_means.size());
    if (k.k >= 0) k.score = o.class_means[size_t(k.k)];
    k.object = std::move(o);
    out.kept.push_back(std::move(k));
  }
  return out;
}

namespace {

// Plain values and arrays of them, in the machine's byte order (every rank of a job runs on one kind of
// machine, as the process group's tensors assume).
class RecordWriter {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <typename T>
  void putAll(const std::vector<T>& v) {
    put(int64_t(v.size()));
    bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class RecordReader {
 public:
  RecordReader(const std::string& bytes, const std::string& where) : bytes_(bytes), where_(where) {}
  template <typename T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  template <typename T>
  std::vector<T> getAll() {
    const auto n = get<int64_t>();
    TILER_CHECK(n >= 0 && uint64_t(n) <= (bytes_.size() - at_) / sizeof(T), IoError,
                where_ << "a record of window objects is cut short");
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), bytes_.data() + at_, size_t(n) * sizeof(T));  // never a null destination
    at_ += size_t(n) * sizeof(T);
    return v;
  }
  // A count of things each at least a byte long: never more than the record's bytes.
  int64_t count() {
    const auto n = get<int64_t>();
    TILER_CHECK(n >= 0 && uint64_t(n) <= bytes_.size(), IoError,
                where_ << "a record of window objects is corrupt");
    return n;
  }
  bool atEnd() const { return at_ == bytes_.size(); }

 private:
  void need(size_t n) const {
    TILER_CHECK(bytes_.size() - at_ >= n, IoError, where_ << "a record of window objects is cut short");
  }
  const std::string& bytes_;
  const std::string& where_;
  size_t at_ = 0;
};

}  // namespace

std::string encodeWindowObjects(const WindowObjects& objects) {
  RecordWriter w;
  w.put(objects.cut);
  w.put(objects.non_finite);
  w.put(int64_t(objects.kept.size()));
  for (const KeptObject& k : objects.kept) {
    const WindowObject& o = k.object;
    for (int64_t v : {o.id, o.pixels, o.x0, o.y0, o.x1, o.y1}) w.put(v);
    w.put(o.cx);
    w.put(o.cy);
    w.putAll(o.class_means);
    w.putAll(o.runs);
    w.put(int32_t(k.k));
    w.put(k.score);
    w.put(int64_t(k.outlines.size()));
    for (const OutlinePolygon& polygon : k.outlines) {
      w.put(int64_t(polygon.size()));
      for (const OutlineRing& ring : polygon) w.putAll(ring);
    }
  }
  return w.take();
}

WindowObjects decodeWindowObjects(const std::string& bytes, const std::string& where) {
  RecordReader r(bytes, where);
  WindowObjects objects;
  objects.cut = r.get<int64_t>();
  objects.non_finite = r.get<int64_t>();
  const int64_t n = r.count();
  for (int64_t i = 0; i < n; ++i) {
    KeptObject k;
    WindowObject& o = k.object;
    for (int64_t* v : {&o.id, &o.pixels, &o.x0, &o.y0, &o.x1, &o.y1}) *v = r.get<int64_t>();
    o.cx = r.get<double>();
    o.cy = r.get<double>();
    o.class_means = r.getAll<double>();
    o.runs = r.getAll<std::array<int32_t, 3>>();
    k.k = r.get<int32_t>();
    k.score = r.get<double>();
    const int64_t polygons = r.count();
    for (int64_t p = 0; p < polygons; ++p) {
      OutlinePolygon& polygon = k.outlines.emplace_back();
      const int64_t rings = r.count();
      for (int64_t q = 0; q < rings; ++q) polygon.push_back(r.getAll<std::array<int32_t, 2>>());
    }
    objects.kept.push_back(std::move(k));
  }
  TILER_CHECK(r.atEnd(), IoError, where << "a record of window objects has bytes after its last object");
  return objects;
}

void InstanceOutputs::add(int64_t window, const float* values) {
  const std::vector<double> map(values, values + options_.channels * options_.height * options_.width);
  take(window, keepWindowObjects(image_, options_, window, map.data()));
}

void InstanceOutputs::addRecord(int64_t window, const std::string& record) {
  const std::string where = "'" + image_.input + "': window " + std::to_string(window) + ": ";
  WindowObjects objects = decodeWindowObjects(record, where);
  // What the writers index by: as many class means as classes, the class their highest names.
  const auto classes = size_t(options_.channels - 1);
  for (const KeptObject& k : objects.kept)
    TILER_CHECK(k.object.class_means.size() == classes &&
                    k.k == highestClass(k.object.class_means.data(), classes) && k.object.pixels > 0,
                IoError,
                where << "a record of window objects does not fit this image's " << classes << " classes");
  take(window, std::move(objects));
}

void InstanceOutputs::take(int64_t window, WindowObjects objects) {
  TILER_CHECK(!done(), IoError, "'" << image_.input << "': window " << window << " arrived after the last");
  non_finite_ += objects.non_finite;
  // Only the kept objects wait for their turn.
  order_.take(window, std::move(objects), [this](int64_t w, const WindowObjects& o) { write(w, o); });
}

void InstanceOutputs::write(int64_t window, const WindowObjects& objects) {
  const Rect rect = image_.grid.imageWindow(window);
  if (raster_) advanceRaster(std::max<int64_t>(options_.scale.apply(rect.y), 0));
  cut_ += objects.cut;
  for (const KeptObject& k : objects.kept) {
    ++objects_;
    writeFeature(k, rect);
    if (raster_) paint(k, rect);
  }
}

void InstanceOutputs::writeFeature(const KeptObject& kept, const Rect& rect) {
  const WindowObject& o = kept.object;
  const double d = image_.resolution.downsample, s = options_.scale.value();
  // Window output pixels to level-0 pixels.
  const auto level0x = [&](double u) { return (double(rect.x) + u / s) * d; };
  const auto level0y = [&](double v) { return (double(rect.y) + v / s) * d; };
  const double area = double(o.pixels) * (d / s) * (d / s);
  const double cx = level0x(o.cx), cy = level0y(o.cy);
  const std::string id = std::to_string(objects_);
  if (geojson_) {
    std::string coords;
    for (const OutlinePolygon& polygon : kept.outlines) {
      coords += coords.empty() ? "[" : ",[";
      for (size_t r = 0; r < polygon.size(); ++r) {
        coords += r == 0 ? "[" : ",[";
        const OutlineRing& ring = polygon[r];
        for (size_t i = 0; i <= ring.size(); ++i) {  // closed: the first vertex again
          const auto& p = ring[i % ring.size()];
          std::array<double, 2> at = {level0x(double(o.x0 - 1 + p[0])), level0y(double(o.y0 - 1 + p[1]))};
          if (geo_) at = geo_->apply(at[0], at[1]);
          coords += fmt::format("{}[{},{}]", i ? "," : "", at[0], at[1]);
        }
        coords += "]";
      }
      coords += "]";
    }
    const bool multi = kept.outlines.size() > 1;
    GeoJsonFeature feature;
    feature.id = objects_;
    feature.geometry = fmt::format("{{\"type\": \"{}\", \"coordinates\": {}}}",
                                   multi ? "MultiPolygon" : "Polygon", multi ? "[" + coords + "]" : coords);
    feature.object_type = "detection";
    feature.measurements =
        GeoJsonMeasurements().add("area", area).add("centroid_x", cx).add("centroid_y", cy);
    // Scores as floats (what the model gave); one that is not a finite float is left out. An object whose
    // class scores are all NaN has no class.
    ClassInfo c;
    if (kept.k >= 0) {
      c = objectClass(kept.k, options_.classes);
      feature.classification = &c;
      feature.measurements->add("score", float(kept.score));
    }
    for (size_t k = 0; k < o.class_means.size(); ++k)
      feature.measurements->add("prob_" + options_.classes[k].name, float(o.class_means[k]));
    geojson_->writer.add(feature);
  }
  if (store_) {
    // The outlines in level-0 pixels, untransformed (a store is in the image's pixels).
    std::vector<StorePolygon> polygons;
    for (const OutlinePolygon& polygon : kept.outlines) {
      StorePolygon& p = polygons.emplace_back();
      for (const OutlineRing& ring : polygon) {
        StoreRing& r = p.emplace_back();
        r.reserve(ring.size());
        for (const auto& v : ring)
          r.push_back({level0x(double(o.x0 - 1 + v[0])), level0y(double(o.y0 - 1 + v[1]))});
      }
    }
    nlohmann::ordered_json properties;
    if (kept.k >= 0) {
      properties["type"] = objectClass(kept.k, options_.classes).name;
      properties["score"] = storeNumber(float(kept.score));
    }
    properties["area"] = area;
    properties["centroid_x"] = cx;
    properties["centroid_y"] = cy;
    for (size_t k = 0; k < o.class_means.size(); ++k)
      properties["prob_" + options_.classes[k].name] = storeNumber(float(o.class_means[k]));
    store_->add(objects_, polygons, properties);
  }
  if (csv_) {
    std::string row = fmt::format("{},{},{},{},{},{},{},{},{},{}", id,
                                  kept.k >= 0 ? csvField(objectClass(kept.k, options_.classes).name) : "",
                                  kept.k >= 0 ? fmt::format("{}", float(kept.score)) : "", area, cx, cy,
                                  level0x(double(o.x0)), level0y(double(o.y0)), level0x(double(o.x1)),
                                  level0y(double(o.y1)));
    for (double m : o.class_means) row += fmt::format(",{}", float(m));
    csv_->row(row);
  }
}

void InstanceOutputs::advanceRaster(int64_t to) {
  to = std::min(to, out_h_);
  while (band_top_ < to) {
    const int rows = int(std::min<int64_t>(to - band_top_, band_.rows));
    raster_->image().writeRows(band_.rowRange(0, rows));
    // The rows still open move up; those freed below are cleared.
    const size_t row_bytes = band_.step[0];
    std::memmove(band_.data, band_.data + size_t(rows) * row_bytes, size_t(band_.rows - rows) * row_bytes);
    std::memset(band_.data + size_t(band_.rows - rows) * row_bytes, 0, size_t(rows) * row_bytes);
    band_top_ += rows;
  }
}

void InstanceOutputs::paint(const KeptObject& kept, const Rect& rect) {
  const int64_t ox = options_.scale.apply(rect.x), oy = options_.scale.apply(rect.y);
  const auto id = int32_t(uint32_t(objects_));  // the TIFF's uint32, in an int32 matrix
  for (const auto& [y, a, b] : kept.object.runs) {
    const int64_t gy = oy + y;
    if (gy < 0 || gy >= out_h_) continue;
    TILER_CHECK(gy >= band_top_ && gy < band_top_ + band_.rows, IoError,
                "'" << image_.input << "': row " << gy << " of the instance map is outside its open band");
    auto* row = band_.ptr<int32_t>(int(gy - band_top_));
    // An earlier object keeps a pixel two windows' objects both claim.
    for (int64_t x = std::max<int64_t>(ox + a, 0); x < std::min<int64_t>(ox + b, out_w_); ++x)
      if (row[x] == 0) row[x] = id;
  }
}

std::vector<std::string> InstanceOutputs::commit() {
  TILER_CHECK(done(), IoError,
              "'" << image_.input << "': " << order_.written() << " of " << image_.plannedWindows()
                  << " windows written");
  if (raster_) advanceRaster(out_h_);
  return commitWriters({geojson_.get(), csv_.get(), store_.get(), raster_.get()});
}

bool InstanceOutputs::injectTileFault() {
  return store_ && store_->failAsFullDisk();
}

std::optional<std::array<int64_t, 2>> InstanceOutputs::objects() const {
  return std::array<int64_t, 2>{objects_, cut_};
}

}  // namespace tiler
