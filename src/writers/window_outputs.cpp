#include "tiler/writers/window_outputs.hpp"

#if TILER_WITH_HDF5
#include <hdf5.h>
#endif
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <spdlog/fmt/fmt.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/core/version.hpp"
#include "tiler/writers/blend.hpp"

namespace fs = std::filesystem;

namespace tiler {

namespace {

// The distance between a grid's first two window starts along one axis (its window when it has one).
int64_t gridStride(const std::vector<int64_t>& starts, int64_t window) {
  return starts.size() > 1 ? starts[1] - starts[0] : window;
}

}  // namespace

WindowPlace placeWindow(const CatalogImage& image, int64_t window) {
  const Rect r = image.grid.imageWindow(window);
  const double d = image.resolution.downsample;
  const auto level0 = [d](int64_t v) { return int64_t(std::llround(double(v) * d)); };
  WindowPlace p;
  p.x = level0(r.x);
  p.y = level0(r.y);
  p.width = level0(r.x + r.w) - p.x;
  p.height = level0(r.y + r.h) - p.y;
  p.column = window % image.grid.columns();
  p.row = window / image.grid.columns();
  return p;
}

std::vector<ClassInfo> classNames(int64_t classes, const std::vector<ClassInfo>& named) {
  std::vector<ClassInfo> out = named;
  for (int64_t k = int64_t(out.size()); k < classes && named.empty(); ++k)
    out.push_back({defaultClassName(int(k)), {}, false});
  // Every class of a classifier is a real class (none is background): those without a colour get the
  // palette's distinct colours, never black.
  for (size_t k = 0; k < out.size(); ++k)
    if (!out[k].colored) out[k].color = distinctColor(int(k));
  return out;
}

std::optional<double> level0Magnification(const CatalogImage& image) {
  if (image.info.objective_power) return image.info.objective_power;
  if (!image.resolution.source_mpp) return std::nullopt;
  // TRIDENT's buckets (mpp -> magnification) for a slide that states only its pixel size.
  const double mpp = *image.resolution.source_mpp;
  for (const auto& [below, power] :
       {std::pair{0.16, 80.0}, {0.3, 40.0}, {0.6, 20.0}, {1.2, 10.0}, {2.4, 5.0}})
    if (mpp < below) return power;
  return std::nullopt;
}

ClassInfo objectClass(int k, const std::vector<ClassInfo>& named) {
  if (k < int(named.size())) return named[size_t(k)];
  return {defaultClassName(k), distinctColor(k), true};
}

std::string csvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

TextFile::TextFile(std::string path) : path_(std::move(path)) {
  const int fd = createFileExclusively(partial());
  TILER_CHECK(fd >= 0, IoError, "'" << partial() << "': cannot create: " << std::strerror(errno));
  file_ = fdopen(fd, "w");
  if (file_ == nullptr) {
    ::close(fd);
    TILER_THROW(IoError, "'" << partial() << "': cannot open: " << std::strerror(errno));
  }
}

TextFile::~TextFile() {
  if (file_) std::fclose(file_);
  std::error_code ec;
  if (!committed_) fs::remove(partial(), ec);
}

void TextFile::write(const void* data, size_t bytes) {
  if (bytes == 0) return;  // data may be null then (an empty tensor's storage)
  TILER_CHECK(std::fwrite(data, 1, bytes, file_) == bytes, IoError,
              "'" << partial() << "': write failed: " << std::strerror(errno));
}

void TextFile::finish(bool durable) {
  const bool ok = std::fflush(file_) == 0 && (!durable || ::fsync(fileno(file_)) == 0);
  const int err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  TILER_CHECK(ok && closed, IoError, "'" << partial() << "': write failed: " << std::strerror(err));
}

void renameFromPartial(const std::string& path) {
  const std::string partial = path + ".partial";
  TILER_CHECK(std::rename(partial.c_str(), path.c_str()) == 0, IoError,
              "'" << path << "': rename from .partial failed: " << std::strerror(errno));
}

void commitFile(ImageWriter& writer, std::vector<std::string>& renamed) {
  writer.commit();
  renamed.push_back(writer.path());
}

std::vector<std::string> commitAllOrNothing(
    const std::function<void(std::vector<std::string>& renamed)>& rename_all) {
  std::vector<std::string> renamed;
  try {
    rename_all(renamed);
  } catch (...) {
    for (const auto& path : renamed) removeTree(path);  // a file, or a store's directory
    throw;
  }
  return renamed;
}

bool inWindowCore(const std::vector<int64_t>& starts, int64_t size, size_t i, double at) {
  const auto twice_centre = [&](size_t k) { return double(2 * starts[k] + size); };
  return (i == 0 || 4 * at >= twice_centre(i - 1) + twice_centre(i)) &&
         (i + 1 == starts.size() || 4 * at < twice_centre(i) + twice_centre(i + 1));
}

namespace {

#if TILER_WITH_HDF5
// Serial libhdf5 (Debian's) is not thread safe: every call of this process goes through one lock (ranks run
// as threads in the tests; one output thread per process otherwise).
std::mutex& hdf5Mutex() {
  static std::mutex m;
  return m;
}

// The outermost and innermost messages of HDF5's error stack ("unable to create file: file exists").
std::string hdf5Error() {
  struct Walk {
    std::string outer, inner;
  } walk;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        auto* w = static_cast<Walk*>(data);
        const std::string desc = e->desc ? e->desc : "";
        if (n == 0) w->outer = desc;
        w->inner = desc;
        return 0;
      },
      &walk);
  H5Eclear2(H5E_DEFAULT);
  if (walk.outer.empty()) return "unknown HDF5 error";
  return walk.inner == walk.outer ? walk.outer : walk.outer + ": " + walk.inner;
}

#endif

}  // namespace

#if TILER_WITH_HDF5
// <stem>.h5: `features` float32 (N, D) and `coords` int64 (N, 2), chunked along N and extended a chunk at a
// time (the last one at finish), attributes on the file and on `coords` (TRIDENT and CLAM read the latter).
class WindowOutputs::FeatureFile {
 public:
  FeatureFile(std::string path, const CatalogImage& image, const WindowOutputOptions& o)
      : path_(std::move(path)), dim_(o.dim) {
    // About 1 MiB of features a chunk: h5py reads a slide's features in a few calls, a row costs no seek.
    // Never more rows than the image has: a whole chunk is allocated in the file, used or not.
    rows_per_chunk_ = std::min(std::clamp<int64_t>((int64_t(1) << 20) / (dim_ * 4), 16, 4096),
                               std::max<int64_t>(1, image.plannedWindows()));
    std::lock_guard<std::mutex> lock(hdf5Mutex());
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    // HDF5 creates the file itself (O_EXCL): a link planted at the partial name is refused, as elsewhere.
    const hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    H5Pset_obj_track_times(fcpl, 0);  // no timestamps: the same vectors give the same bytes
    file_ = H5Fcreate(partial().c_str(), H5F_ACC_EXCL, fcpl, H5P_DEFAULT);
    H5Pclose(fcpl);
    TILER_CHECK(file_ >= 0, IoError, "'" << partial() << "': cannot create: " << hdf5Error());
    try {
      features_ = createDataset("features", H5T_IEEE_F32LE, dim_);
      coords_ = createDataset("coords", H5T_STD_I64LE, 2);
      for (hid_t target : {file_, coords_}) writeAttributes(target, image, o);
      // TRIDENT reads these two on the features themselves.
      attribute(features_, "name", utf8Safe(fs::path(image.input).stem().string()));
      attribute(features_, "encoder", utf8Safe(o.encoder));
    } catch (...) {
      closeAll();
      std::error_code ec;
      fs::remove(partial(), ec);
      throw;
    }
    features_buffer_.reserve(size_t(rows_per_chunk_ * dim_));
    coords_buffer_.reserve(size_t(rows_per_chunk_ * 2));
  }
  ~FeatureFile() {
    std::lock_guard<std::mutex> lock(hdf5Mutex());
    closeAll();
    std::error_code ec;
    if (!committed_) fs::remove(partial(), ec);
  }

  void append(const WindowPlace& place, const float* values) {
    features_buffer_.insert(features_buffer_.end(), values, values + dim_);
    coords_buffer_.push_back(place.x);
    coords_buffer_.push_back(place.y);
    if (int64_t(coords_buffer_.size() / 2) == rows_per_chunk_) flush();
  }
  void finish() {
    flush();
    std::lock_guard<std::mutex> lock(hdf5Mutex());
    const bool flushed = H5Fflush(file_, H5F_SCOPE_LOCAL) >= 0;
    const std::string why = flushed ? "" : hdf5Error();
    const bool closed = closeAll();
    TILER_CHECK(flushed && closed, IoError,
                "'" << partial() << "': cannot close: " << (why.empty() ? hdf5Error() : why));
  }
  std::string partial() const { return path_ + ".partial"; }
  const std::string& path() const { return path_; }
  void committed() { committed_ = true; }

 private:
  hid_t createDataset(const char* name, hid_t type, int64_t columns) {
    const hsize_t dims[2] = {0, hsize_t(columns)}, max_dims[2] = {H5S_UNLIMITED, hsize_t(columns)};
    const hsize_t chunk[2] = {hsize_t(rows_per_chunk_), hsize_t(columns)};
    const hid_t space = H5Screate_simple(2, dims, max_dims);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 2, chunk);
    H5Pset_obj_track_times(dcpl, 0);
    const hid_t ds = H5Dcreate2(file_, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    H5Sclose(space);
    TILER_CHECK(ds >= 0, IoError,
                "'" << partial() << "': cannot create dataset " << name << ": " << hdf5Error());
    return ds;
  }
  void attribute(hid_t target, const char* name, hid_t file_type, hid_t memory_type, const void* value) {
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(target, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    const bool ok = attr >= 0 && H5Awrite(attr, memory_type, value) >= 0;
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    TILER_CHECK(ok, IoError, "'" << partial() << "': cannot write attribute " << name << ": " << hdf5Error());
  }
  void attribute(hid_t target, const char* name, int64_t v) {
    attribute(target, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
  }
  void attribute(hid_t target, const char* name, double v) {
    attribute(target, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
  }
  void attribute(hid_t target, const char* name, const std::string& v) {
    // Variable-length UTF-8, as h5py writes a Python str (it reads back as str, not bytes).
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    const char* text = v.c_str();
    try {
      attribute(target, name, type, type, &text);
    } catch (...) {
      H5Tclose(type);
      throw;
    }
    H5Tclose(type);
  }
  void writeAttributes(hid_t target, const CatalogImage& image, const WindowOutputOptions& o) {
    const double d = image.resolution.downsample;
    const int64_t window = image.grid.windowWidth();
    attribute(target, "patch_size", window);
    attribute(target, "patch_size_level0", int64_t(std::llround(double(window) * d)));
    attribute(target, "patch_level", int64_t(image.resolution.level));
    // Overlap in pixels of the processing resolution, as TRIDENT states it, and as the grid's fraction.
    attribute(target, "overlap", window - gridStride(image.grid.startsX(), window));
    attribute(target, "overlap_fraction", o.overlap);
    // Always present (TRIDENT's reader indexes them): NaN where the image does not say (no µm/px, no
    // objective power), which no arithmetic turns into a plausible number.
    const double unknown = std::numeric_limits<double>::quiet_NaN();
    const auto power = level0Magnification(image);
    attribute(target, "level0_magnification", power.value_or(unknown));
    attribute(target, "target_magnification", power ? *power / d : unknown);
    attribute(target, "mpp", image.resolution.mpp.value_or(unknown));
    attribute(target, "level0_mpp", image.resolution.source_mpp.value_or(unknown));
    const auto& level0 = image.info.levels.empty()
                             ? ImageInfo::Level{image.info.width, image.info.height, 1.0}
                             : image.info.levels.front();
    attribute(target, "level0_width", level0.width);
    attribute(target, "level0_height", level0.height);
    attribute(target, "name", utf8Safe(fs::path(image.input).stem().string()));
    attribute(target, "encoder", utf8Safe(o.encoder));
  }
  // The buffered rows onto the end of both datasets.
  void flush() {
    const int64_t n = int64_t(coords_buffer_.size() / 2);
    if (n == 0) return;
    std::lock_guard<std::mutex> lock(hdf5Mutex());
    extend(features_, "features", H5T_NATIVE_FLOAT, dim_, features_buffer_.data(), n);
    extend(coords_, "coords", H5T_NATIVE_INT64, 2, coords_buffer_.data(), n);
    rows_ += n;
    features_buffer_.clear();
    coords_buffer_.clear();
  }
  void extend(hid_t ds, const char* name, hid_t memory_type, int64_t columns, const void* data, int64_t n) {
    const hsize_t size[2] = {hsize_t(rows_ + n), hsize_t(columns)};
    const hsize_t start[2] = {hsize_t(rows_), 0}, count[2] = {hsize_t(n), hsize_t(columns)};
    bool ok = H5Dset_extent(ds, size) >= 0;
    const hid_t file_space = ok ? H5Dget_space(ds) : -1;
    const hid_t memory_space = H5Screate_simple(2, count, nullptr);
    ok = ok && file_space >= 0 &&
         H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0 &&
         H5Dwrite(ds, memory_type, memory_space, file_space, H5P_DEFAULT, data) >= 0;
    if (file_space >= 0) H5Sclose(file_space);
    H5Sclose(memory_space);
    TILER_CHECK(ok, IoError, "'" << partial() << "': cannot append to " << name << ": " << hdf5Error());
  }
  // Caller holds hdf5Mutex(). False when closing the file failed.
  bool closeAll() {
    if (features_ >= 0) H5Dclose(features_);
    if (coords_ >= 0) H5Dclose(coords_);
    features_ = coords_ = -1;
    bool ok = true;
    if (file_ >= 0) ok = H5Fclose(file_) >= 0;
    file_ = -1;
    return ok;
  }

  std::string path_;
  int64_t dim_;
  int64_t rows_per_chunk_ = 0;
  int64_t rows_ = 0;                               // rows in the datasets
  hid_t file_ = -1, features_ = -1, coords_ = -1;  // owned HDF5 handles
  std::vector<float> features_buffer_;             // rows not yet written, a chunk at most
  std::vector<int64_t> coords_buffer_;
  bool committed_ = false;
};

#else
// Without HDF5 the job stops before any work (settleTask); this only keeps the interface.
class WindowOutputs::FeatureFile {
 public:
  FeatureFile(const std::string& path, const CatalogImage&, const WindowOutputOptions&) {
    requireFeature("hdf5", "'" + path + "' (--save features)");
  }
  void append(const WindowPlace&, const float*) {}
  void finish() {}
  const std::string& path() const { return path_; }
  void committed() {}

 private:
  std::string path_;
};
#endif

// <stem>.pt: the features as one float32 tensor (N, D) in the layout torch.save writes (a zip of data.pkl,
// the storage as data/0, byteorder and version; LibTorch's own zip writer), which torch.load reads,
// weights_only or not: CLAM's pt_files/<slide>.pt. The rows go to a scratch file (<stem>.pt.rows.partial) as
// they come and are stored from a read-only mapping of it at finish: the features are never on tiler's heap,
// the kernel pages them in from the file as the archive is written.
class WindowOutputs::TensorFile {
 public:
  TensorFile(const std::string& path, int64_t dim) : dim_(dim), rows_(path + ".rows"), file_(path) {}

  void append(const float* values) {
    rows_.write(values, size_t(dim_) * sizeof(float));
    ++count_;
  }
  void finish() {
    rows_.finish(/*durable=*/false);
    const std::string rows = rows_.partial();
    const int fd = ::open(rows.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    TILER_CHECK(fd >= 0, IoError, "'" << rows << "': cannot reopen: " << std::strerror(errno));
    const size_t bytes = size_t(count_ * dim_) * sizeof(float);
    void* data = bytes == 0 ? nullptr : mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    TILER_CHECK(data != MAP_FAILED, IoError, "'" << rows << "': cannot map: " << std::strerror(map_errno));
    try {
      store(data, bytes);
    } catch (...) {
      if (data) munmap(data, bytes);
      throw;
    }
    if (data) munmap(data, bytes);
    file_.finish();
  }
  const std::string& path() const { return file_.path(); }
  void committed() { file_.committed(); }

 private:
  // The archive through LibTorch's writer. Its writes never fail from its side (it would throw from its
  // destructor): the first failed write is kept, the rest skipped, and thrown after.
  void store(const void* data, size_t bytes) {
    std::optional<IoError> failed;
    const auto write = [&](const void* buffer, size_t n) -> size_t {
      if (!failed) {
        try {
          file_.write(buffer, n);
        } catch (const IoError& e) {
          failed = e;
        }
      }
      return n;
    };
    try {
      caffe2::serialize::PyTorchStreamWriter writer(write);
      const std::string pickle = tensorPickle(count_, dim_);
      writer.writeRecord("data.pkl", pickle.data(), pickle.size());
      writer.writeRecord("byteorder", "little", 6);
      writer.writeRecord("data/0", data, bytes);
      writer.writeEndOfFile();
    } catch (const std::exception& e) {
      TILER_THROW(IoError, "'" << file_.partial() << "': cannot write the tensor archive: " << e.what());
    }
    if (failed) throw *failed;
  }

  // The pickle (protocol 2) torch.save writes for a contiguous float32 CPU tensor (rows, dim) whose storage
  // is record "0": torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks).
  static std::string tensorPickle(int64_t rows, int64_t dim) {
    std::string p = "\x80\x02";                    // PROTO 2
    const auto text = [&](const std::string& s) {  // BINUNICODE
      p += 'X';
      for (int i = 0; i < 4; ++i) p += char((s.size() >> (8 * i)) & 0xff);
      p += s;
    };
    const auto integer = [&](int64_t v) {  // as Python's pickle writes ints: BININT1, BININT2, BININT, LONG1
      if (v >= 0 && v <= 0xff) {
        p += 'K';
        p += char(v);
      } else if (v >= 0 && v <= 0xffff) {
        p += 'M';
        p += char(v & 0xff);
        p += char(v >> 8);
      } else if (v >= INT32_MIN && v <= INT32_MAX) {
        p += 'J';
        for (int i = 0; i < 4; ++i) p += char((uint64_t(v) >> (8 * i)) & 0xff);
      } else {
        p += "\x8a\x08";  // eight bytes, little-endian two's complement
        for (int i = 0; i < 8; ++i) p += char((uint64_t(v) >> (8 * i)) & 0xff);
      }
    };
    p += "ctorch._utils\n_rebuild_tensor_v2\n((";
    text("storage");
    p += "ctorch\nFloatStorage\n";
    text("0");
    text("cpu");
    integer(rows * dim);
    p += "tQ";   // TUPLE, BINPERSID: the storage record
    integer(0);  // storage offset
    p += '(';
    integer(rows);
    integer(dim);
    p += "t(";
    integer(dim);
    integer(1);
    p += "t\x89";                          // requires_grad False
    p += "ccollections\nOrderedDict\n)R";  // no backward hooks
    p += "tR.";
    return p;
  }

  int64_t dim_;
  int64_t count_ = 0;  // rows appended
  TextFile rows_;      // scratch, never committed: removed with this object
  TextFile file_;      // the archive
};

// Classify: <stem>.csv (WSInfer's columns), <stem>_tiles.geojson (QuPath's tile objects) and
// <stem>_heatmap.tif (K float bands, one pixel per window: the grid's column and row).
class WindowOutputs::ClassFiles {
 public:
  ClassFiles(const CatalogImage& image, const WindowOutputOptions& o)
      : image_(image), classes_(classNames(o.dim, o.classes)), compression_(o.compression) {
    TILER_CHECK(int64_t(classes_.size()) == o.dim, ConfigError,
                "--classes names " << classes_.size() << " class(es), the model gives " << o.dim);
    const auto saved = [&](const char* kind) {
      return std::find(o.kinds.begin(), o.kinds.end(), kind) != o.kinds.end();
    };
    if (saved("csv")) {
      csv_ = std::make_unique<TextFile>(image.outputs.at("csv"));
      std::string header = "minx,miny,width,height";
      for (const auto& c : classes_) header += "," + csvField("prob_" + c.name);
      csv_->write(header + "\n");
    }
    if (saved("tiles")) {
      tiles_ = std::make_unique<GeoJsonFile>(image.outputs.at("tiles"));
    }
    if (saved("heatmap")) {
      heatmap_path_ = image.outputs.at("heatmap");
      static_assert(kHeatmapMaxClasses == CV_CN_MAX);
      TILER_CHECK(o.dim <= kHeatmapMaxClasses, ConfigError,
                  "'" << heatmap_path_ << "': a heatmap holds at most " << kHeatmapMaxClasses
                      << " classes, not " << o.dim);
      const int64_t rows = int64_t(image.grid.startsY().size()), columns = image.grid.columns();
      // Filled by hand: cv::Scalar fills at most 4 channels.
      heatmap_.create(int(rows), int(columns), CV_32FC(int(o.dim)));
      std::fill_n(heatmap_.ptr<float>(), heatmap_.total() * size_t(o.dim),
                  std::numeric_limits<float>::quiet_NaN());
    }
  }

  void append(const WindowPlace& place, const float* p) {
    const size_t K = classes_.size();
    if (csv_) {
      std::string line = fmt::format("{},{},{},{}", place.x, place.y, place.width, place.height);
      for (size_t k = 0; k < K; ++k) line += "," + fmt::format("{}", p[k]);
      csv_->write(line + "\n");
    }
    if (tiles_) {
      // The argmax names the tile's class (the first of equals; NaN never wins): a tile whose every score
      // is NaN has no classification, as an object whose every class mean is NaN has none.
      const int best = highestClass(p, K);
      const double x0 = double(place.x), y0 = double(place.y), x1 = x0 + double(place.width),
                   y1 = y0 + double(place.height);
      GeoJsonFeature tile;
      tile.geometry = quadGeometry({{{x0, y0}, {x1, y0}, {x1, y1}, {x0, y1}}});
      tile.object_type = "tile";
      if (best >= 0) tile.classification = &classes_[size_t(best)];
      tile.measurements.emplace();
      for (size_t k = 0; k < K; ++k) tile.measurements->add("prob_" + classes_[k].name, p[k]);
      tiles_->writer.add(tile);
    }
    if (!heatmap_.empty())
      std::memcpy(heatmap_.ptr<float>(int(place.row)) + place.column * int64_t(K), p, K * sizeof(float));
  }

  void finish() {
    if (csv_) csv_->finish();
    if (tiles_) tiles_->finish();
    if (!heatmap_.empty()) writeHeatmap();
  }
  // Renames every file; a failure takes back those already renamed. Returns the final paths.
  std::vector<std::string> commit(std::vector<std::string>& renamed) {
    if (csv_) commitFile(*csv_, renamed);
    if (tiles_) commitFile(tiles_->file, renamed);
    if (heatmap_writer_) commitFile(*heatmap_writer_, renamed);
    return renamed;
  }

 private:
  void writeHeatmap() {
    const int64_t stride_x = gridStride(image_.grid.startsX(), image_.grid.windowWidth());
    const int64_t stride_y = gridStride(image_.grid.startsY(), image_.grid.windowHeight());
    WriterOptions wo;
    // One pixel a window: too small for speed to matter, so the codec every reader knows, as it always was.
    wo.compression = compression_ ? *compression_ : Compression{Codec::kDeflate};
    wo.software = kTilerSoftware;
    // A heatmap pixel spans a stride of processing pixels: its geotransform and resolution are the input's
    // scaled by that (exact for square strides; a non-square one takes x's).
    wo.metadata_from = image_.info.format == "tiff" ? image_.input : "";
    wo.metadata_scale = 1.0 / (double(stride_x) * image_.resolution.downsample);
    if (image_.resolution.mpp) wo.mpp = *image_.resolution.mpp * double(stride_x);
    wo.nodata = std::numeric_limits<double>::quiet_NaN();
    nlohmann::json names = nlohmann::json::array();
    for (const auto& c : classes_) names.push_back(c.name);
    wo.description =
        nlohmann::json{{"heatmap",
                        {{"classes", names},
                         {"stride", {stride_x, stride_y}},
                         {"window", {image_.grid.windowWidth(), image_.grid.windowHeight()}},
                         {"meaning", "pixel (column, row) = the scores of grid window (column, row)"}}}}
            .dump();
    heatmap_writer_ = std::make_unique<ImageWriter>(heatmap_path_, heatmap_.cols, heatmap_.rows,
                                                    heatmap_.channels(), SampleType::kF32, wo);
    heatmap_writer_->writeRows(heatmap_);
    heatmap_writer_->finish();
  }

  const CatalogImage& image_;
  std::vector<ClassInfo> classes_;
  std::optional<Compression> compression_;
  std::unique_ptr<TextFile> csv_;       // owned; null unless saved
  std::unique_ptr<GeoJsonFile> tiles_;  // owned; null unless saved
  std::string heatmap_path_;
  cv::Mat heatmap_;                              // [grid rows, grid columns] x K floats, NaN where no window
  std::unique_ptr<ImageWriter> heatmap_writer_;  // from finish() on
};

namespace {

// detect: whether `b`, box n of the `rows` of grid window `window` (x1, y1, x2, y2, score, class in window
// pixels), is one the window keeps: checked (an IoError naming window and box for a box that is no box), not
// padding (a score <= 0), its centre in the window's core and inside the image.
bool keepsBox(const CatalogImage& image, const std::vector<ClassInfo>& named, int64_t window, int64_t n,
              int64_t rows, const float* b) {
  const WindowGrid& grid = image.grid;
  const size_t column = size_t(window % grid.columns()), row = size_t(window / grid.columns());
  // Formatted only for an error: most rows are padding, and this runs for every row of every window.
  const auto where = [&] {
    return fmt::format("'{}': window {} (column {}, row {}), box {} of {}: ", image.input, window, column,
                       row, n, rows);
  };
  TILER_CHECK(!std::isnan(b[4]), IoError, where() << "its score is not a number");
  if (!(b[4] > 0)) return false;  // padding
  TILER_CHECK(std::isfinite(b[0]) && std::isfinite(b[1]) && std::isfinite(b[2]) && std::isfinite(b[3]) &&
                  std::isfinite(b[4]),
              IoError, where() << "a coordinate or its score is not finite");
  TILER_CHECK(
      b[2] >= b[0] && b[3] >= b[1], IoError,
      where() << "x2 < x1 or y2 < y1 (" << b[0] << ", " << b[1] << ", " << b[2] << ", " << b[3] << ")");
  TILER_CHECK(b[5] >= 0 && b[5] < 2147483648.0f && b[5] == std::floor(b[5]) &&
                  (named.empty() || b[5] < float(named.size())),
              IoError,
              where() << "class " << b[5] << " is not "
                      << (named.empty() ? "a class number"
                                        : "one of the " + std::to_string(named.size()) + " --classes"));
  const double cx = (double(b[0]) + b[2]) / 2, cy = (double(b[1]) + b[3]) / 2;
  if (!inWindowCore(grid.startsX(), grid.windowWidth(), column, double(grid.startsX()[column]) + cx) ||
      !inWindowCore(grid.startsY(), grid.windowHeight(), row, double(grid.startsY()[row]) + cy))
    return false;
  const Rect place = grid.imageWindow(window);
  const double ix = double(place.x) + cx, iy = double(place.y) + cy;
  return ix >= 0 && iy >= 0 && ix < double(grid.imageWidth()) && iy < double(grid.imageHeight());
}

}  // namespace

std::string detectionRecord(const CatalogImage& image, const WindowOutputOptions& options, int64_t window,
                            const float* values) {
  const int64_t rows = options.dim / 6;
  std::string record;
  for (int64_t n = 0; n < rows; ++n)
    if (keepsBox(image, options.classes, window, n, rows, values + 6 * n))
      record.append(reinterpret_cast<const char*>(values + 6 * n), 6 * sizeof(float));
  return record;
}

// detect: a window's boxes [N, 6] (x1, y1, x2, y2, score, class in window pixels; a score <= 0 pads). A box
// is kept by the one window whose core holds its centre (the partition of the window centres, the crop
// blend's), so an object every window that sees it whole finds alike is written once, whatever the world
// size; boxes go out in window order, in level-0 pixels clipped to the image, each file streamed.
class WindowOutputs::DetectionFiles {
 public:
  DetectionFiles(const CatalogImage& image, const WindowOutputOptions& o)
      : image_(image),
        named_(o.classes),
        nms_(o.nms_iou),
        level0_width_(double(std::llround(double(image.grid.imageWidth()) * image.resolution.downsample))),
        level0_height_(double(std::llround(double(image.grid.imageHeight()) * image.resolution.downsample))) {
    TILER_CHECK(o.dim % 6 == 0, ConfigError,
                "--task detect needs 6 values a box, not " << o.dim << " a window");
    const auto saved = [&](const char* kind) {
      return std::find(o.kinds.begin(), o.kinds.end(), kind) != o.kinds.end();
    };
    // The CSV and COCO stay in pixels.
    if (saved("objects")) geojson_ = openObjectsGeojson(image, geo_);
    if (saved("objects_csv")) {
      csv_ = std::make_unique<TextFile>(image.outputs.at("objects_csv"));
      csv_->write("id,class,score,x1,y1,x2,y2\n");
    }
    if (saved("coco")) {
      // Every member pycocotools' COCO and COCOeval read; nothing that changes from run to run (no date).
      coco_ = std::make_unique<TextFile>(image.outputs.at("coco"));
      const std::string file = utf8Safe(fs::path(image.input).filename().string());
      coco_->write(
          fmt::format("{{\"info\": {{\"description\": {}, \"version\": \"{}\"}}, \"licenses\": [], "
                      "\"images\": [{{\"id\": 1, \"file_name\": {}, \"width\": {}, \"height\": {}}}], "
                      "\"annotations\": [",
                      nlohmann::json("tiler --task detect: " + file).dump(), kTilerSoftware,
                      nlohmann::json(file).dump(), level0_width_, level0_height_));
    }
  }

  // The window's `rows` boxes, those its rank kept (detectionRecord).
  void append(int64_t window, const float* values, int64_t rows) {
    const WindowGrid& grid = image_.grid;
    const Rect place = grid.imageWindow(window);
    const int64_t row = window / grid.columns();
    const double d = image_.resolution.downsample;
    // A box reaching past the image (a window's padding; any finite value a model gives) ends at its edge.
    const auto x = [&](float at) { return std::clamp((double(place.x) + at) * d, 0.0, level0_width_); };
    const auto y = [&](float at) { return std::clamp((double(place.y) + at) * d, 0.0, level0_height_); };
    for (int64_t n = 0; n < rows; ++n) {
      const float* b = values + 6 * n;
      Box box;
      box.order = order_++;
      box.row = int64_t(row);
      box.k = int(b[5]);
      box.score = b[4];
      box.x1 = x(b[0]);
      box.y1 = y(b[1]);
      box.x2 = x(b[2]);
      box.y2 = y(b[3]);
      // Cut by the window where the window's edge is inside the image: a larger overlap would see it whole.
      box.at_window_edge = (b[0] <= 0 && place.x > 0) || (b[1] <= 0 && place.y > 0) ||
                           (b[2] >= float(place.w) && place.right() < grid.imageWidth()) ||
                           (b[3] >= float(place.h) && place.bottom() < grid.imageHeight());
      if (nms_ <= 0) {
        write(box);
        continue;
      }
      // With NMS a box waits until every box that could overlap it has come: those of its own grid row and
      // the rows next to it. A new row means the rows two above it are settled.
      if (box.row > last_row_) settle(box.row - 2);
      last_row_ = box.row;
      pending_.push_back(box);
    }
  }

  void finish() {
    settle(std::numeric_limits<int64_t>::max());
    if (geojson_) geojson_->finish();
    if (csv_) csv_->finish();
    if (coco_) {
      std::string categories;
      for (int k : seen_classes_)
        categories += fmt::format("{}{{\"id\": {}, \"name\": {}, \"supercategory\": \"object\"}}",
                                  categories.empty() ? "" : ", ", k + 1,
                                  nlohmann::json(objectClass(k, named_).name).dump());
      coco_->write("\n], \"categories\": [" + categories + "]}\n");
      coco_->finish();
    }
  }
  void commit(std::vector<std::string>& renamed) {
    if (geojson_) commitFile(geojson_->file, renamed);
    if (csv_) commitFile(*csv_, renamed);
    if (coco_) commitFile(*coco_, renamed);
  }
  int64_t objects() const { return objects_; }
  int64_t atWindowEdge() const { return at_window_edge_; }

 private:
  // A kept box, in level-0 pixels; `order`: its place among the kept boxes of the image, in window order.
  struct Box {
    int64_t order = 0, row = 0;
    int k = 0;
    float score = 0;
    double x1 = 0, y1 = 0, x2 = 0, y2 = 0;
    bool at_window_edge = false;
    bool settled = false;  // NMS: written or suppressed
  };
  static double iou(const Box& a, const Box& b) {
    const double w = std::min(a.x2, b.x2) - std::max(a.x1, b.x1),
                 h = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
    if (w <= 0 || h <= 0) return 0;
    const double both = w * h, area_a = (a.x2 - a.x1) * (a.y2 - a.y1), area_b = (b.x2 - b.x1) * (b.y2 - b.y1);
    return both / (area_a + area_b - both);
  }

  // Boxes by class and size, so that NMS looks only at the boxes that can overlap one (an IoU above 0 needs
  // an area in common): a box whose larger side is under 2^L pixels is in its class's level L, under the
  // cell (2^L square) of its top-left corner. A box that overlaps `b` starts less than 2^L before b's start
  // along each axis and before its end, so it is in a band of cells of its level around b's; where that band
  // holds more cells than the level has boxes, the level's boxes are looked at one by one instead. Every
  // pair was quadratic in the pending boxes: 5000 boxes a window on a 2048² image took 203 s, 4.4 s now.
  class OverlapIndex {
   public:
    explicit OverlapIndex(const std::vector<Box>& boxes) {
      entries_.reserve(boxes.size());
      for (const Box& b : boxes) {
        int level = 0;
        std::frexp(std::max(b.x2 - b.x1, b.y2 - b.y1), &level);  // the larger side < 2^level
        level = std::max(level, 0);
        const double side = std::ldexp(1.0, level);
        entries_.push_back(Entry{b.k, level, cell(b.y1, side), cell(b.x1, side), b});
      }
      std::sort(entries_.begin(), entries_.end());
    }
    // Whether found(c) holds for some pending box c of b's class that may overlap `b` (a superset of those
    // that do; found() decides).
    template <typename Found>
    bool any(const Box& b, const Found& found) const {
      constexpr int64_t lowest = std::numeric_limits<int64_t>::min();
      auto at = std::lower_bound(entries_.begin(), entries_.end(), first(b.k, 0, lowest, lowest));
      while (at != entries_.end() && at->k == b.k) {
        const int level = at->level;
        const auto level_end = std::lower_bound(at, entries_.end(), first(b.k, level + 1, lowest, lowest));
        const double side = std::ldexp(1.0, level);
        // b.x1 / side is exact (a power of two): the cell before b's start holds every box that can reach it.
        const int64_t x0 = cell(b.x1, side) - 1, x1 = cell(b.x2, side), y0 = cell(b.y1, side) - 1,
                      y1 = cell(b.y2, side);
        if (y1 - y0 + 1 >= level_end - at) {
          for (auto e = at; e != level_end; ++e)
            if (found(e->box)) return true;
        } else {
          for (int64_t cy = y0; cy <= y1; ++cy)
            for (auto e = std::lower_bound(at, level_end, first(b.k, level, cy, x0));
                 e != level_end && e->cy == cy && e->cx <= x1; ++e)
              if (found(e->box)) return true;
        }
        at = level_end;
      }
      return false;
    }

   private:
    struct Entry {
      int k, level;
      int64_t cy, cx;  // the cell of the box's top-left corner
      Box box;         // a copy: a cell's boxes side by side in memory, as they are looked at
      bool operator<(const Entry& o) const {
        return std::tie(k, level, cy, cx, box.order) < std::tie(o.k, o.level, o.cy, o.cx, o.box.order);
      }
    };
    static int64_t cell(double at, double side) { return int64_t(std::floor(at / side)); }
    // The place of the first entry at or after (class, level, cell) in the sorted entries.
    static Entry first(int k, int level, int64_t cy, int64_t cx) {
      Entry key{k, level, cy, cx, Box{}};
      key.box.order = std::numeric_limits<int64_t>::min();
      return key;
    }
    std::vector<Entry> entries_;  // sorted: by class, level, cell row, cell column
  };

  // Settles the pending boxes of grid rows up to `row`: each is written unless a box of its class that
  // overlaps it by more than the NMS IoU outscores it (a higher score, or an equal one earlier in window
  // order), suppressed or not itself: a rule of pairs, so no order of looking changes it. Boxes of `row`
  // stay, settled, for the next row's boxes to meet; those above it go.
  void settle(int64_t row) {
    const bool any = std::any_of(pending_.begin(), pending_.end(),
                                 [row](const Box& b) { return !b.settled && b.row <= row; });
    if (any) {
      const OverlapIndex index(pending_);
      for (Box& b : pending_) {
        if (b.settled || b.row > row) continue;
        b.settled = true;
        const bool outscored = index.any(b, [&](const Box& c) {
          return c.order != b.order && (c.score > b.score || (c.score == b.score && c.order < b.order)) &&
                 iou(b, c) > nms_;
        });
        if (!outscored) write(b);
      }
    }
    pending_.erase(
        std::remove_if(pending_.begin(), pending_.end(), [row](const Box& b) { return b.row < row; }),
        pending_.end());
  }
  void write(const Box& box) {
    at_window_edge_ += box.at_window_edge;
    const int k = box.k;
    const float score = box.score;
    const double x1 = box.x1, y1 = box.y1, x2 = box.x2, y2 = box.y2;
    const ClassInfo c = objectClass(k, named_);
    const std::string name = nlohmann::json(c.name).dump();
    ++objects_;
    seen_classes_.insert(k);
    if (geojson_) {
      // The rectangle's corners, in the CRS where there is one (a rotated grid turns it there). The id also
      // in the properties, where GeoPandas and other tables read it (QuPath takes it there too).
      std::array<std::array<double, 2>, 4> corner = {{{x1, y1}, {x2, y1}, {x2, y2}, {x1, y2}}};
      if (geo_)
        for (auto& p : corner) p = geo_->apply(p[0], p[1]);
      GeoJsonFeature feature;
      feature.id = objects_;
      feature.geometry = quadGeometry(corner);
      feature.object_type = "detection";
      feature.classification = &c;
      feature.measurements = GeoJsonMeasurements().add("score", score);
      geojson_->writer.add(feature);
    }
    if (csv_)
      csv_->write(fmt::format("{},{},{},{},{},{},{}\n", objects_, csvField(c.name), score, x1, y1, x2, y2));
    if (coco_)
      coco_->write(fmt::format(
          "{}\n{{\"id\": {}, \"image_id\": 1, \"category_id\": {}, \"bbox\": [{},{},{},{}], \"area\": {}, "
          "\"segmentation\": [[{},{},{},{},{},{},{},{}]], \"score\": {}, \"iscrowd\": 0}}",
          objects_ > 1 ? "," : "", objects_, k + 1, x1, y1, x2 - x1, y2 - y1, (x2 - x1) * (y2 - y1), x1, y1,
          x2, y1, x2, y2, x1, y2, score));
  }

  const CatalogImage& image_;
  std::vector<ClassInfo> named_;          // --classes (empty: class_<k>)
  std::unique_ptr<GeoJsonFile> geojson_;  // owned; null unless saved
  std::unique_ptr<TextFile> csv_, coco_;  // owned; null unless saved
  double nms_;  // IoU above which the lower-scoring of two boxes of a class goes; 0: none
  double level0_width_, level0_height_;  // the image at level 0, where boxes are clipped (COCO's size)
  std::optional<GeoFrame> geo_;          // the input's CRS, where the GeoJSON is written in it
  int64_t objects_ = 0, at_window_edge_ = 0;
  std::set<int> seen_classes_;  // COCO's categories
  int64_t order_ = 0;           // kept boxes so far
  int64_t last_row_ = -1;       // the grid row of the last kept box
  std::vector<Box> pending_;    // NMS: kept boxes not yet written, and written ones a later box may meet
};

std::unique_ptr<GeoJsonFile> openObjectsGeojson(const CatalogImage& image, std::optional<GeoFrame>& geo) {
  if (image.info.format == "tiff") geo = geoFrameOf(image.input);
  return std::make_unique<GeoJsonFile>(image.outputs.at("objects"), geo ? geo->crs : "");
}

void WindowConsumer::addRecord(int64_t window, const std::string&) {
  TILER_THROW(IoError, "window " << window << ": a record for outputs that take the model's values");
}

WindowOutputs::WindowOutputs(const CatalogImage& image, WindowOutputOptions options)
    : image_(image), options_(std::move(options)), order_(image) {
  // A detector without rows (N = 0) finds nothing, which is an answer; a vector needs a value.
  TILER_CHECK(options_.dim > 0 || options_.task == ModelTask::kDetect, ConfigError,
              "a per-window output needs a vector of at least one value");
  fs::create_directories(fs::path(image.outputs.begin()->second).parent_path());
  for (const auto& kind : options_.kinds) {
    if (kind == "features")
      features_ = std::make_unique<FeatureFile>(image.outputs.at("features"), image, options_);
    else if (kind == "features_pt")
      tensor_ = std::make_unique<TensorFile>(image.outputs.at("features_pt"), options_.dim);
    else if (!classes_ && taskOfOutputKind(kind) == ModelTask::kClassify)
      classes_ = std::make_unique<ClassFiles>(image, options_);
    else if (!detections_ && taskOfOutputKind(kind) == ModelTask::kDetect)
      detections_ = std::make_unique<DetectionFiles>(image, options_);
  }
}

WindowOutputs::~WindowOutputs() = default;

void WindowOutputs::add(int64_t window, const float* values) {
  // A detector's boxes are checked and chosen once, where a rank makes its record of them.
  if (detections_) return addRecord(window, detectionRecord(image_, options_, window, values));
  take(window, std::vector<float>(values, values + options_.dim));
}

void WindowOutputs::addRecord(int64_t window, const std::string& record) {
  TILER_CHECK(detections_ && record.size() % (6 * sizeof(float)) == 0, IoError,
              "'" << image_.input << "': window " << window << ": not a record of boxes");
  std::vector<float> boxes(record.size() / sizeof(float));
  if (!boxes.empty()) std::memcpy(boxes.data(), record.data(), record.size());
  take(window, std::move(boxes));
}

void WindowOutputs::take(int64_t window, std::vector<float> values) {
  TILER_CHECK(!done(), IoError, "'" << image_.input << "': window " << window << " arrived after the last");
  order_.take(window, std::move(values), [this](int64_t w, const std::vector<float>& v) { write(w, v); });
}

void WindowOutputs::write(int64_t window, const std::vector<float>& values) {
  const WindowPlace place = placeWindow(image_, window);
  if (features_) features_->append(place, values.data());
  if (tensor_) tensor_->append(values.data());
  if (classes_) classes_->append(place, values.data());
  if (detections_) detections_->append(window, values.data(), int64_t(values.size()) / 6);
}

std::vector<std::string> WindowOutputs::commit() {
  TILER_CHECK(done(), IoError,
              "'" << image_.input << "': " << order_.written() << " of " << image_.plannedWindows()
                  << " windows written");
  // Phase one: every file closed under its partial name. Phase two: all renamed.
  if (features_) features_->finish();
  if (tensor_) tensor_->finish();
  if (classes_) classes_->finish();
  if (detections_) detections_->finish();
  return commitAllOrNothing([&](std::vector<std::string>& renamed) {
    if (features_) commitFile(*features_, renamed);
    if (tensor_) commitFile(*tensor_, renamed);
    if (classes_) classes_->commit(renamed);
    if (detections_) detections_->commit(renamed);
  });
}

std::optional<std::array<int64_t, 2>> WindowOutputs::objects() const {
  if (!detections_) return std::nullopt;
  return std::array<int64_t, 2>{detections_->objects(), detections_->atWindowEdge()};
}

}  // namespace tiler
