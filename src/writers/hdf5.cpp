#include "tiler/writers/hdf5.hpp"

#if TILER_WITH_HDF5
#include <hdf5.h>
#endif

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "tiler/core/error.hpp"
#include "tiler/core/version.hpp"

namespace fs = std::filesystem;

namespace tiler {

#if TILER_WITH_HDF5

namespace {

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

}  // namespace

class FeaturesHdf5::File {
 public:
  File(std::string path, const FeaturesHdf5Layout& layout) : path_(std::move(path)), dim_(layout.dim) {
    // About 1 MiB of features a chunk: h5py reads a slide's features in a few calls, a row costs no seek.
    // Never more rows than the image has: a whole chunk is allocated in the file, used or not.
    rows_per_chunk_ = std::min(std::clamp<int64_t>((int64_t(1) << 20) / (dim_ * 4), 16, 4096),
                               std::max<int64_t>(1, layout.max_rows));
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
      for (hid_t target : {file_, coords_})
        for (const Hdf5Attribute& a : layout.attributes) attribute(target, a);
      for (const Hdf5Attribute& a : layout.features_attributes) attribute(features_, a);
    } catch (...) {
      closeAll();
      std::error_code ec;
      fs::remove(partial(), ec);
      throw;
    }
    features_buffer_.reserve(size_t(rows_per_chunk_ * dim_));
    coords_buffer_.reserve(size_t(rows_per_chunk_ * 2));
  }
  ~File() {
    std::lock_guard<std::mutex> lock(hdf5Mutex());
    closeAll();
    std::error_code ec;
    if (!committed_) fs::remove(partial(), ec);
  }

  void append(const float* values, int64_t x, int64_t y) {
    features_buffer_.insert(features_buffer_.end(), values, values + dim_);
    coords_buffer_.push_back(x);
    coords_buffer_.push_back(y);
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
  void commit(std::vector<std::string>& renamed) {
    renameFromPartial(path_);
    committed_ = true;
    renamed.push_back(path_);
  }

 private:
  std::string partial() const { return path_ + ".partial"; }
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
  void attribute(hid_t target, const Hdf5Attribute& a) {
    const char* name = a.name.c_str();
    if (const auto* v = std::get_if<int64_t>(&a.value))
      return attribute(target, name, H5T_STD_I64LE, H5T_NATIVE_INT64, v);
    if (const auto* v = std::get_if<double>(&a.value))
      return attribute(target, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, v);
    // Variable-length UTF-8, as h5py writes a Python str (it reads back as str, not bytes).
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    const char* text = std::get<std::string>(a.value).c_str();
    try {
      attribute(target, name, type, type, &text);
    } catch (...) {
      H5Tclose(type);
      throw;
    }
    H5Tclose(type);
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
class FeaturesHdf5::File {
 public:
  File(const std::string& path, const FeaturesHdf5Layout&) {
    requireFeature("hdf5", "'" + path + "' (--save features)");
  }
  void append(const float*, int64_t, int64_t) {}
  void finish() {}
  void commit(std::vector<std::string>&) {}
};

#endif

FeaturesHdf5::FeaturesHdf5(std::string path, FeaturesHdf5Layout layout)
    : file_(std::make_unique<File>(std::move(path), layout)) {}
FeaturesHdf5::~FeaturesHdf5() = default;
void FeaturesHdf5::append(const float* values, int64_t x, int64_t y) {
  file_->append(values, x, y);
}
void FeaturesHdf5::finish() {
  file_->finish();
}
void FeaturesHdf5::commit(std::vector<std::string>& renamed) {
  file_->commit(renamed);
}

}  // namespace tiler
