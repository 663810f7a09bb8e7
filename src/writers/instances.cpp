#include "tiler/writers/instances.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
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
  makeParentDirectory(image.outputs.begin()->second);
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
  out_w_ = options_.scale.apply(image.info.width);
  out_h_ = options_.scale.apply(image.info.height);
  band_rows_ = kJoinBandWindows * options_.height;
  joins_ = std::make_unique<Joins>();
  if (saved("instances")) {
    WriterOptions wo = options_.tiff;
    wo.nearest = true;  // reduced levels keep ids, never mean them
    raster_ = std::make_unique<ImageOutput>(std::make_unique<ImageWriter>(
        image.outputs.at("instances"), out_w_, out_h_, 1, SampleType::kU32, wo));
    band_ = cv::Mat::zeros(int(band_rows_), int(out_w_), CV_32S);
  }
}

InstanceOutputs::~InstanceOutputs() = default;

namespace {

// The object's mask in its box with a border of one pixel, outlined (runs in the box's pixels).
std::vector<OutlinePolygon> outlineRuns(const std::vector<std::array<int32_t, 3>>& runs, int64_t x0,
                                        int64_t y0, int64_t x1, int64_t y1) {
  const int64_t bw = x1 - x0 + 2, bh = y1 - y0 + 2;
  std::vector<uint8_t> mask(size_t(bw * bh), 0);
  for (const auto& [y, a, b] : runs)
    std::fill_n(mask.begin() + (y - y0 + 1) * bw + (a - x0 + 1), b - a, uint8_t(1));
  return traceOutlines(mask.data(), bw, bh);
}

// An object's box from its runs (the owner's, never a record's word for it).
void boxRuns(WindowObject& o) {
  o.x0 = o.y0 = std::numeric_limits<int64_t>::max();
  o.x1 = o.y1 = std::numeric_limits<int64_t>::min();
  for (const auto& [y, a, b] : o.runs) {
    o.x0 = std::min<int64_t>(o.x0, a);
    o.x1 = std::max<int64_t>(o.x1, b);
    o.y0 = std::min<int64_t>(o.y0, y);
    o.y1 = std::max<int64_t>(o.y1, y + 1);
  }
}

// The output pixels [first, last) of window `i` along an axis (`starts` in padded processing pixels, `size`
// the window's, `out` its output pixels) whose centres lie in its core: the one place both the rank that ran
// the window and the owner read a core from, so they agree to the pixel.
std::array<int64_t, 2> coreSpan(const std::vector<int64_t>& starts, int64_t size, size_t i, double s,
                                int64_t out) {
  int64_t first = out, last = 0;
  for (int64_t p = 0; p < out; ++p)
    if (inWindowCore(starts, size, i, double(starts[i]) + (double(p) + 0.5) / s)) {
      first = std::min(first, p);
      last = p + 1;
    }
  return {std::min(first, last), last};
}

// Window `window`'s core in its output pixels.
Rect windowCore(const WindowGrid& grid, const InstanceOptions& options, int64_t window) {
  const size_t column = size_t(window % grid.columns()), row = size_t(window / grid.columns());
  const double s = options.scale.value();
  const auto x = coreSpan(grid.startsX(), grid.windowWidth(), column, s, options.width);
  const auto y = coreSpan(grid.startsY(), grid.windowHeight(), row, s, options.height);
  return {x[0], y[0], x[1] - x[0], y[1] - y[0]};
}

// Whether some window of the grid that sees a pixel of [a0, a1) (the image's output pixels along one axis)
// sees it touch one of its edges that lie inside the image (`extent` output pixels): that window cuts it.
bool cutAlong(const std::vector<int64_t>& starts, int64_t pad, const Scale& scale, int64_t out,
              int64_t extent, int64_t a0, int64_t a1) {
  const auto begin = [&](int64_t start) { return scale.apply(start - pad); };
  // The windows that reach past a0 (their starts ascend), up to the first that starts at or after a1.
  auto it = std::partition_point(starts.begin(), starts.end(),
                                 [&](int64_t start) { return begin(start) + out <= a0; });
  for (; it != starts.end() && begin(*it) < a1; ++it) {
    const int64_t first = begin(*it), end = first + out;
    if ((a0 <= first && first > 0) || (a1 >= end && end < extent)) return true;
  }
  return false;
}

}  // namespace

WindowObjects keepWindowObjects(const CatalogImage& image, const InstanceOptions& options, int64_t window,
                                const double* values) {
  const WindowGrid& grid = image.grid;
  const Rect place = grid.imageWindow(window);
  const size_t column = size_t(window % grid.columns()), row = size_t(window / grid.columns());
  const auto where = [&] {
    return fmt::format("'{}': window {} (column {}, row {}): ", image.input, window, column, row);
  };
  const double s = options.scale.value();
  const int64_t h = options.height, w = options.width, plane = h * w, classes = options.channels - 1;
  const auto saved = [&](const char* kind) {
    return std::find(options.kinds.begin(), options.kinds.end(), kind) != options.kinds.end();
  };
  const bool outlines = saved("objects") || saved("objects_store");
  // The window's output pixels that are the image's (a lattice window or a small image's reaches past it):
  // an object is what the model found there, as the instance TIFF holds it; padding is no one's.
  const int64_t ox = options.scale.apply(place.x), oy = options.scale.apply(place.y);
  const int64_t out_w = options.scale.apply(grid.imageWidth()),
                out_h = options.scale.apply(grid.imageHeight());
  const Rect inside{-ox, -oy, out_w, out_h};
  const Rect core = windowCore(grid, options, window);
  WindowObjects out;
  for (int64_t c = 0; c < options.channels; ++c)
    for (int64_t y = std::max<int64_t>(inside.y, 0); y < std::min(inside.bottom(), h); ++y)
      for (int64_t x = std::max<int64_t>(inside.x, 0); x < std::min(inside.right(), w); ++x)
        out.non_finite += !std::isfinite(values[(c * h + y) * w + x]);
  for (WindowObject& o : objectsOfWindow(values, options.channels, h, w, inside, where)) {
    const double cx = o.cx / s, cy = o.cy / s;  // processing pixels in the window
    const bool centred =
        inWindowCore(grid.startsX(), grid.windowWidth(), column, double(grid.startsX()[column]) + cx) &&
        inWindowCore(grid.startsY(), grid.windowHeight(), row, double(grid.startsY()[row]) + cy);
    // Cut by this window's edge inside the image, or by another's that sees a pixel of it (its box's): the
    // owner joins the windows' parts of it.
    const bool cut_here = (o.x0 == 0 && place.x > 0) || (o.y0 == 0 && place.y > 0) ||
                          (o.x1 == w && place.right() < grid.imageWidth()) ||
                          (o.y1 == h && place.bottom() < grid.imageHeight());
    const bool cut_elsewhere =
        !cut_here &&
        (cutAlong(grid.startsX(), grid.padLeft(), options.scale, w, out_w, ox + o.x0, ox + o.x1) ||
         cutAlong(grid.startsY(), grid.padTop(), options.scale, h, out_h, oy + o.y0, oy + o.y1));
    if (cut_here || (cut_elsewhere && !centred)) {
      WindowPart part;
      part.whole = !cut_here;
      part.core_sums.assign(size_t(classes), 0.0);
      for (const auto& [y, a, b] : o.runs) {
        if (y < core.y || y >= core.bottom()) continue;
        const int64_t first = std::max<int64_t>(a, core.x), end = std::min<int64_t>(b, core.right());
        if (first >= end) continue;
        part.core_pixels += end - first;
        part.core_sx += double(end - first) * (double(first) + double(end)) / 2;
        part.core_sy += double(end - first) * (double(y) + 0.5);
        for (int64_t k = 0; k < classes; ++k) {
          const double* at = values + (k + 1) * plane + int64_t(y) * w;
          for (int64_t x = first; x < end; ++x) part.core_sums[size_t(k)] += at[x];
        }
      }
      part.object = std::move(o);
      out.parts.push_back(std::move(part));
      continue;
    }
    if (!centred) continue;
    KeptObject k;
    if (outlines) k.outlines = outlineRuns(o.runs, o.x0, o.y0, o.x1, o.y1);
    if (!o.class_means.empty()) k.k = highestClass(o.class_means.data(), o.class_means.size());
    if (k.k >= 0) k.score = o.class_means[size_t(k.k)];
    k.shared = cut_elsewhere;
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

namespace {

void putObject(RecordWriter& w, const WindowObject& o) {
  for (int64_t v : {o.id, o.pixels, o.x0, o.y0, o.x1, o.y1}) w.put(v);
  w.put(o.cx);
  w.put(o.cy);
  w.putAll(o.class_means);
  w.putAll(o.runs);
}

WindowObject getObject(RecordReader& r) {
  WindowObject o;
  for (int64_t* v : {&o.id, &o.pixels, &o.x0, &o.y0, &o.x1, &o.y1}) *v = r.get<int64_t>();
  o.cx = r.get<double>();
  o.cy = r.get<double>();
  o.class_means = r.getAll<double>();
  o.runs = r.getAll<std::array<int32_t, 3>>();
  return o;
}

}  // namespace

std::string encodeWindowObjects(const WindowObjects& objects) {
  RecordWriter w;
  w.put(objects.non_finite);
  w.put(int64_t(objects.kept.size()));
  for (const KeptObject& k : objects.kept) {
    putObject(w, k.object);
    w.put(int32_t(k.k));
    w.put(k.score);
    w.put(uint8_t(k.shared));
    w.put(int64_t(k.outlines.size()));
    for (const OutlinePolygon& polygon : k.outlines) {
      w.put(int64_t(polygon.size()));
      for (const OutlineRing& ring : polygon) w.putAll(ring);
    }
  }
  w.put(int64_t(objects.parts.size()));
  for (const WindowPart& p : objects.parts) {
    putObject(w, p.object);
    w.put(uint8_t(p.whole));
    w.put(p.core_pixels);
    w.put(p.core_sx);
    w.put(p.core_sy);
    w.putAll(p.core_sums);
  }
  return w.take();
}

WindowObjects decodeWindowObjects(const std::string& bytes, const std::string& where) {
  RecordReader r(bytes, where);
  WindowObjects objects;
  objects.non_finite = r.get<int64_t>();
  const int64_t n = r.count();
  for (int64_t i = 0; i < n; ++i) {
    KeptObject k;
    k.object = getObject(r);
    k.k = r.get<int32_t>();
    k.score = r.get<double>();
    k.shared = r.get<uint8_t>() != 0;
    const int64_t polygons = r.count();
    for (int64_t p = 0; p < polygons; ++p) {
      OutlinePolygon& polygon = k.outlines.emplace_back();
      const int64_t rings = r.count();
      for (int64_t q = 0; q < rings; ++q) polygon.push_back(r.getAll<std::array<int32_t, 2>>());
    }
    objects.kept.push_back(std::move(k));
  }
  const int64_t parts = r.count();
  for (int64_t i = 0; i < parts; ++i) {
    WindowPart p;
    p.object = getObject(r);
    p.whole = r.get<uint8_t>() != 0;
    p.core_pixels = r.get<int64_t>();
    p.core_sx = r.get<double>();
    p.core_sy = r.get<double>();
    p.core_sums = r.getAll<double>();
    objects.parts.push_back(std::move(p));
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
  for (const WindowPart& p : objects.parts)
    TILER_CHECK(p.object.class_means.size() == classes && p.core_sums.size() == classes &&
                    p.object.pixels > 0 && !p.object.runs.empty(),
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

struct InstanceOutputs::Joins {
  // A window's part as the owner holds it: in the image's output pixels.
  struct Part {
    int64_t group = 0;
    bool whole = false;   // the view of a window that saw it whole
    WindowObject object;  // runs, box and centroid in the image's output pixels
    Rect core;            // its window's core
    int64_t core_pixels = 0;
    double core_sx = 0, core_sy = 0;
    std::vector<double> core_sums;
  };

  // Parts joined so far: an object not yet complete. `parts` in the order they came (ids ascend within it
  // after each join); rows [top, bottom) of the image's output pixels hold its parts' pixels.
  struct Group {
    std::vector<int64_t> parts;
    int64_t top = 0, bottom = 0;
    bool too_tall = false;  // its rows left the band: counted once complete, never written
    bool written = false;   // one of its parts is a kept object, written when its window came
    bool open() const { return !too_tall && !written; }
  };

  // A window whose parts later windows may still meet: its output pixels in the image, its parts' ids.
  struct Window {
    Rect rect;
    std::vector<int64_t> parts;
  };

  std::map<int64_t, Part> parts;    // by id, in the order they came
  std::map<int64_t, Group> groups;  // by their first part's id: complete ones go in that order
  std::vector<Window> windows;      // in window order
  int64_t next = 0;

  // Joins the groups of parts p and q (the later group into the earlier).
  void join(int64_t p, int64_t q) {
    int64_t a = parts.at(p).group, b = parts.at(q).group;
    if (a == b) return;
    if (b < a) std::swap(a, b);
    Group& into = groups.at(a);
    Group& from = groups.at(b);
    for (int64_t id : from.parts) {
      const auto it = parts.find(id);
      if (it != parts.end()) it->second.group = a;
    }
    into.parts.insert(into.parts.end(), from.parts.begin(), from.parts.end());
    into.top = std::min(into.top, from.top);
    into.bottom = std::max(into.bottom, from.bottom);
    into.too_tall = into.too_tall || from.too_tall;
    into.written = into.written || from.written;
    groups.erase(b);
  }

  // The parts of windows `a` and `b` that are one object: where a 4-connected piece of one's pixels in the
  // region both windows see lies at least half in a part of the other, those two are joined. A model that
  // labels each window's objects alike where windows overlap gives whole pieces in one part of each, so an
  // object's parts chain to one group; one that draws a boundary a little differently in two windows still
  // joins its object, never a neighbour a few pixels of it reach into.
  void match(const Window& a, const Window& b) {
    const int64_t x0 = std::max(a.rect.x, b.rect.x), x1 = std::min(a.rect.right(), b.rect.right());
    const int64_t y0 = std::max(a.rect.y, b.rect.y), y1 = std::min(a.rect.bottom(), b.rect.bottom());
    if (x0 >= x1 || y0 >= y1) return;
    const int64_t w = x1 - x0, h = y1 - y0;
    // Each window's parts in the region: the index + 1 of the part in its window's list, 0 for none.
    const auto raster = [&](const Window& win) {
      std::vector<int32_t> at;
      for (size_t i = 0; i < win.parts.size(); ++i) {
        const auto it = parts.find(win.parts[i]);
        if (it == parts.end()) continue;
        if (at.empty()) at.assign(size_t(w * h), 0);
        for (const auto& [y, first, end] : it->second.object.runs) {
          if (y < y0 || y >= y1) continue;
          for (int64_t x = std::max<int64_t>(first, x0); x < std::min<int64_t>(end, x1); ++x)
            at[size_t((y - y0) * w + x - x0)] = int32_t(i + 1);
        }
      }
      return at;
    };
    const std::vector<int32_t> la = raster(a), lb = raster(b);
    if (la.empty() || lb.empty()) return;
    const auto pieces = [&](const std::vector<int32_t>& mine, const std::vector<int32_t>& theirs,
                            const Window& my, const Window& their) {
      std::vector<bool> seen(mine.size(), false);
      std::vector<int64_t> stack, piece;
      std::map<int32_t, int64_t> counts;
      for (size_t p = 0; p < mine.size(); ++p) {
        if (mine[p] == 0 || seen[p]) continue;
        piece.clear();
        counts.clear();
        seen[p] = true;
        stack.push_back(int64_t(p));
        while (!stack.empty()) {
          const int64_t q = stack.back();
          stack.pop_back();
          piece.push_back(q);
          ++counts[theirs[size_t(q)]];
          const int64_t x = q % w, y = q / w;
          for (int d = 0; d < 4; ++d) {
            const int64_t nx = x + kStepX[d], ny = y + kStepY[d];
            if (nx < 0 || ny < 0 || nx >= w || ny >= h) continue;
            const int64_t n = ny * w + nx;
            if (!seen[size_t(n)] && mine[size_t(n)] == mine[p]) {
              seen[size_t(n)] = true;
              stack.push_back(n);
            }
          }
        }
        for (const auto& [label, count] : counts)
          if (label > 0 && 2 * count >= int64_t(piece.size()))
            join(my.parts[size_t(mine[p] - 1)], their.parts[size_t(label - 1)]);
      }
    };
    pieces(la, lb, a, b);
    pieces(lb, la, b, a);
  }
};

void InstanceOutputs::write(int64_t window, const WindowObjects& objects) {
  const Rect rect = image_.grid.imageWindow(window);
  const int64_t top = std::max<int64_t>(options_.scale.apply(rect.y), 0);
  const int64_t bottom = std::min<int64_t>(options_.scale.apply(rect.y) + options_.height, out_h_);
  // No window from this one on reaches above its top: the objects that end there are complete.
  finishJoins(top);
  giveUpTall(top, bottom);
  if (raster_) advanceRaster(std::min(top, openTop()));
  for (const KeptObject& k : objects.kept) writeObject(k, rect);
  addParts(window, objects);
}

void InstanceOutputs::writeObject(const KeptObject& kept, const Rect& rect) {
  ++objects_;
  writeFeature(kept, rect);
  if (raster_) paint(kept, rect);
}

void InstanceOutputs::addParts(int64_t window, const WindowObjects& objects) {
  Joins& j = *joins_;
  const Rect place = image_.grid.imageWindow(window);
  const int64_t ox = options_.scale.apply(place.x), oy = options_.scale.apply(place.y);
  const Rect core = [&] {
    const Rect c = windowCore(image_.grid, options_, window);
    return Rect{ox + c.x, oy + c.y, c.w, c.h};
  }();
  Joins::Window here{{ox, oy, options_.width, options_.height}, {}};
  // A part in the image's output pixels, its own group.
  const auto add = [&](const WindowObject& object) -> Joins::Part& {
    const int64_t id = j.next++;
    Joins::Part& part = j.parts[id];
    part.group = id;
    part.object = object;
    WindowObject& o = part.object;
    for (auto& [y, first, end] : o.runs) {
      y = int32_t(y + oy);
      first = int32_t(first + ox);
      end = int32_t(end + ox);
    }
    boxRuns(o);
    o.cx += double(ox);
    o.cy += double(oy);
    part.core = core;
    j.groups[id] = Joins::Group{{id}, o.y0, o.y1, false};
    here.parts.push_back(id);
    return part;
  };
  for (const KeptObject& k : objects.kept)
    if (k.shared) {
      add(k.object);
      j.groups.at(here.parts.back()).written = true;
    }
  for (const WindowPart& p : objects.parts) {
    Joins::Part& part = add(p.object);
    part.whole = p.whole;
    part.core_pixels = p.core_pixels;
    part.core_sx = p.core_sx + double(ox) * double(p.core_pixels);
    part.core_sy = p.core_sy + double(oy) * double(p.core_pixels);
    part.core_sums = p.core_sums;
  }
  if (here.parts.empty()) return;
  for (const Joins::Window& earlier : j.windows) j.match(earlier, here);
  j.windows.push_back(std::move(here));
}

void InstanceOutputs::finishJoins(int64_t before) {
  Joins& j = *joins_;
  // Windows that end above `before` meet no later window: their parts that wait for nothing else go.
  j.windows.erase(std::remove_if(j.windows.begin(), j.windows.end(),
                                 [&](const Joins::Window& w) {
                                   if (w.rect.bottom() > before) return false;
                                   for (int64_t id : w.parts) {
                                     const auto it = j.parts.find(id);
                                     if (it != j.parts.end() && !j.groups.at(it->second.group).open())
                                       j.parts.erase(it);
                                   }
                                   return true;
                                 }),
                  j.windows.end());
  std::vector<int64_t> complete;
  for (const auto& [id, group] : j.groups)
    if (group.bottom <= before) complete.push_back(id);
  for (int64_t id : complete) finishGroup(id);
}

void InstanceOutputs::giveUpTall(int64_t top, int64_t bottom) {
  for (auto& [id, group] : joins_->groups) {
    if (!group.open() || group.top >= bottom - band_rows_) continue;
    // Its rows no longer fit the band: it is counted once complete; its parts are kept only while a later
    // window may still meet them, so that what joins it is left out too.
    group.too_tall = true;
    for (int64_t part : group.parts) {
      const auto it = joins_->parts.find(part);
      if (it != joins_->parts.end() && it->second.object.y1 <= top) joins_->parts.erase(it);
    }
  }
}

int64_t InstanceOutputs::openTop() const {
  int64_t top = std::numeric_limits<int64_t>::max();
  for (const auto& [id, group] : joins_->groups)
    if (group.open()) top = std::min(top, group.top);
  return top;
}

void InstanceOutputs::finishGroup(int64_t id) {
  Joins& j = *joins_;
  Joins::Group group = std::move(j.groups.at(id));
  j.groups.erase(id);
  std::sort(group.parts.begin(), group.parts.end());
  std::vector<const Joins::Part*> parts;
  for (int64_t p : group.parts) {
    const auto it = j.parts.find(p);
    if (it != j.parts.end()) parts.push_back(&it->second);
  }
  const auto forget = [&] {
    for (int64_t p : group.parts) j.parts.erase(p);
  };
  // Joined to a kept object (written whole when its window came), or too tall for the band (counted).
  if (!group.open()) {
    cut_ += !group.written;
    forget();
    return;
  }
  // The view of the first window that saw it whole, else each window's part within that window's core.
  const Joins::Part* whole = nullptr;
  for (const Joins::Part* p : parts)
    if (p->whole && whole == nullptr) whole = p;
  KeptObject k;
  WindowObject& o = k.object;
  if (whole != nullptr) {
    o = whole->object;
  } else {
    o.class_means.assign(size_t(options_.channels - 1), 0.0);
    double sx = 0, sy = 0;
    for (const Joins::Part* p : parts) {
      for (const auto& [y, first, end] : p->object.runs) {
        if (y < p->core.y || y >= p->core.bottom()) continue;
        const int64_t a = std::max<int64_t>(first, p->core.x), b = std::min<int64_t>(end, p->core.right());
        if (a < b) o.runs.push_back({y, int32_t(a), int32_t(b)});
      }
      o.pixels += p->core_pixels;
      sx += p->core_sx;
      sy += p->core_sy;
      for (size_t c = 0; c < o.class_means.size(); ++c) o.class_means[c] += p->core_sums[c];
    }
    std::sort(o.runs.begin(), o.runs.end());
    if (o.runs.empty() || o.pixels <= 0) {
      forget();
      return;
    }
    boxRuns(o);
    o.cx = sx / double(o.pixels);
    o.cy = sy / double(o.pixels);
    for (double& m : o.class_means) m /= double(o.pixels);
  }
  if (geojson_ || store_) k.outlines = outlineRuns(o.runs, o.x0, o.y0, o.x1, o.y1);
  if (!o.class_means.empty()) k.k = highestClass(o.class_means.data(), o.class_means.size());
  if (k.k >= 0) k.score = o.class_means[size_t(k.k)];
  forget();
  // In the image's output pixels: the image's own place.
  writeObject(k, Rect{});
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
  finishJoins(std::numeric_limits<int64_t>::max());
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
