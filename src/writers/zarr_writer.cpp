#include "tiler/writers/zarr_writer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/npy.hpp"
#include "tiler/writers/map_writers.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the Zarr dtypes written (<f4, <u2) are little-endian");

namespace tiler {

namespace {

bool isIntegerType(SampleType type) {
  return type != SampleType::kF16 && type != SampleType::kF32;
}

void makeDirectory(const std::string& path) {
  TILER_CHECK(::mkdir(path.c_str(), 0755) == 0, IoError,
              "'" << path << "': cannot create the directory: " << std::strerror(errno));
}

// Writes a new file inside the store (never through a link: the store's directories are this writer's own).
void writeStoreFile(const std::string& path, const void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && writeAll(fd, data, size);
  const int err = errno;
  if (fd >= 0 && ::close(fd) != 0 && ok) ok = false;
  TILER_CHECK(ok, IoError, "'" << path << "': cannot write: " << std::strerror(ok ? errno : err));
}

void writeJson(const std::string& path, const nlohmann::json& value, uint64_t& bytes) {
  const std::string text = value.dump(2) + "\n";
  writeStoreFile(path, text.data(), text.size());
  bytes += text.size();
}

// What stands at `path` that a store may not be built over: "" when nothing or a directory (a stale one),
// else why not.
std::string blockedBy(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return "";
  if (S_ISLNK(st.st_mode)) return "'" + path + "' is a symbolic link; a store is never written through one";
  if (!S_ISDIR(st.st_mode)) return "'" + path + "' exists and is not a directory";
  return "";
}

// An array's codec as a Zarr reader names it: `--compression` mapped to numcodecs' zstd and zlib (libtiff's
// deflate levels 10-12 are libdeflate's: zlib stops at 9; lzw has no Zarr codec), else the TIFF outputs'
// defaults (defaultCompression: zstd:1 for probabilities, deflate:1, i.e. zlib:1, for labels), without the
// predictor.
Compression zarrCompression(const std::optional<Compression>& asked, SampleType type, RasterValues values) {
  Compression c = asked ? *asked : defaultCompression(type, values);
  c.predictor = false;  // no Zarr filter: the codec alone
  if (c.codec == Codec::kLzw) return {Codec::kDeflate, 1, false};
  if (c.codec == Codec::kDeflate) c.level = c.level == 0 ? 6 : std::min(c.level, 9);
  if (c.codec == Codec::kZstd && c.level == 0) c.level = ZSTD_CLEVEL_DEFAULT;
  return c;
}

nlohmann::json compressorJson(const Compression& c) {
  if (c.codec == Codec::kNone) return nullptr;
  return {{"id", c.codec == Codec::kZstd ? "zstd" : "zlib"}, {"level", c.level}};
}

std::vector<uint8_t> compressChunk(const uint8_t* data, size_t bytes, const Compression& c) {
  if (c.codec == Codec::kNone) return {data, data + bytes};
  if (c.codec == Codec::kZstd) {
    // One shot: the frame records the content size, which numcodecs' decoder needs.
    std::vector<uint8_t> out(ZSTD_compressBound(bytes));
    const size_t size = ZSTD_compress(out.data(), out.size(), data, bytes, c.level);
    TILER_CHECK(!ZSTD_isError(size), IoError, "zstd could not compress a chunk: " << ZSTD_getErrorName(size));
    out.resize(size);
    return out;
  }
  uLongf size = compressBound(uLong(bytes));
  std::vector<uint8_t> out(size);
  TILER_CHECK(compress2(out.data(), &size, data, uLong(bytes), c.level) == Z_OK, IoError,
              "zlib could not compress a chunk");
  out.resize(size);
  return out;
}

// Chunk (channel, rows x cols of `rows`, zero-padded to chunk x chunk), compressed; empty when every byte is
// 0 (the fill value): that chunk is not written.
std::vector<uint8_t> encodeChunk(const cv::Mat& rows, int channel, int chunk, const Compression& compression,
                                 const std::atomic<bool>& fault) {
  TILER_CHECK(!fault.load(), IoError, "injected fault: chunk compression");
  // Samples moved as integers of their size: OpenCV 4.6's mixChannels has no half floats.
  const int depth = rows.elemSize1() == 1 ? CV_8U : rows.elemSize1() == 2 ? CV_16U : CV_32S;
  const cv::Mat samples(rows.rows, rows.cols, CV_MAKETYPE(depth, rows.channels()), rows.data, rows.step);
  cv::Mat plane(chunk, chunk, depth);
  const size_t bytes = plane.total() * plane.elemSize();
  std::memset(plane.data, 0, bytes);
  cv::Mat inside = plane(cv::Rect(0, 0, rows.cols, rows.rows));
  const int from_to[] = {channel, 0};
  cv::mixChannels(&samples, 1, &inside, 1, from_to, 1);
  if (std::all_of(plane.data, plane.data + bytes, [](uint8_t b) { return b == 0; })) return {};
  return compressChunk(plane.data, bytes, compression);
}

}  // namespace

// One Zarr array (channels x height x width), filled a row of chunks at a time.
class ZarrWriter::Array {
 public:
  Array(std::string dir, int64_t width, int64_t height, int channels, SampleType type, RasterValues values,
        const ZarrOptions& o, std::shared_ptr<std::atomic<bool>> fault, uint64_t& bytes)
      : dir_(std::move(dir)),
        width_(width),
        height_(height),
        channels_(channels),
        type_(type),
        chunk_(o.chunk),
        compression_(zarrCompression(o.compression, type, values)),
        pool_(o.pool),
        fault_(std::move(fault)),
        bytes_(bytes),
        row_directories_(size_t(channels), -1) {
    makeDirectory(dir_);
    for (int c = 0; c < channels_; ++c) makeDirectory(dir_ + "/" + std::to_string(c));
  }

  int64_t width() const { return width_; }
  int64_t height() const { return height_; }
  int64_t rowsGiven() const { return rows_given_; }

  void addRows(const cv::Mat& rows) {
    TILER_CHECK(
        rows.cols == width_ && rows.channels() == channels_ && rows.depth() == cvDepthOf(type_), IoError,
        "'" << dir_ << "': rows of " << rows.cols << " x " << rows.channels() << " " << rows.depth()
            << " given to an array of " << width_ << " x " << channels_ << " " << sampleTypeName(type_));
    TILER_CHECK(rows_given_ + rows.rows <= height_, IoError,
                "'" << dir_ << "': more than its " << height_ << " rows given");
    for (int y = 0; y < rows.rows;) {
      if (filling_.empty()) filling_ = spareBuffer();
      const int take = std::min(rows.rows - y, chunk_ - filled_);
      rows.rowRange(y, y + take).copyTo(filling_.rowRange(filled_, filled_ + take));
      filled_ += take;
      y += take;
      rows_given_ += take;
      if (filled_ == chunk_ || rows_given_ == height_) submitRow();
    }
  }

  // Writes the row of chunks still compressing; the metadata comes after.
  void finish() {
    TILER_CHECK(rows_given_ == height_, IoError,
                "'" << dir_ << "': finished after " << rows_given_ << " of its " << height_ << " rows");
    writeCompressing();
  }

  nlohmann::json zarray() const {
    return {{"zarr_format", 2},
            {"shape", {channels_, height_, width_}},
            {"chunks", {1, chunk_, chunk_}},
            {"dtype", numpyTypestr(type_)},
            {"compressor", compressorJson(compression_)},
            {"fill_value", 0},
            {"order", "C"},
            {"filters", nullptr},
            {"dimension_separator", "/"}};
  }
  void writeMetadata() const { writeJson(dir_ + "/.zarray", zarray(), bytes_); }

  size_t bufferedBytes() const {
    return (filling_.total() + compressing_.buffer.total() + spare_.total()) * bytesPerSample(type_) *
           size_t(channels_);
  }

 private:
  struct ChunkRow {
    int64_t index = -1;  // chunk row; -1: none
    cv::Mat buffer;      // the rows the chunks are cut from (the tasks hold it too)
    std::vector<std::future<std::vector<uint8_t>>> chunks;  // channel-major, then columns
  };

  cv::Mat spareBuffer() {
    cv::Mat buffer =
        spare_.empty() ? cv::Mat(chunk_, int(width_), CV_MAKETYPE(cvDepthOf(type_), channels_)) : spare_;
    spare_.release();
    return buffer;
  }

  // The filled rows become a row of chunks compressing; the row before it is written meanwhile.
  void submitRow() {
    ChunkRow row;
    row.index = rows_given_ > 0 ? (rows_given_ - 1) / chunk_ : 0;
    row.buffer = filling_;
    filling_.release();
    const cv::Mat valid = row.buffer.rowRange(0, filled_);
    filled_ = 0;
    for (int c = 0; c < channels_; ++c)
      for (int64_t x0 = 0; x0 < width_; x0 += chunk_) {
        const cv::Mat rows = valid.colRange(int(x0), int(std::min<int64_t>(width_, x0 + chunk_)));
        auto task = [rows, c, chunk = chunk_, compression = compression_, fault = fault_] {
          return encodeChunk(rows, c, chunk, compression, *fault);
        };
        if (pool_) {
          row.chunks.push_back(pool_->submit(std::move(task)));
        } else {
          std::promise<std::vector<uint8_t>> done;
          done.set_value(task());
          row.chunks.push_back(done.get_future());
        }
      }
    writeCompressing();
    compressing_ = std::move(row);
  }

  // Writes the chunks of the row compressing, in order, and keeps its buffer for a later row.
  void writeCompressing() {
    if (compressing_.index < 0) return;
    const int64_t columns = (width_ + chunk_ - 1) / chunk_;
    for (size_t k = 0; k < compressing_.chunks.size(); ++k) {
      const std::vector<uint8_t> bytes = compressing_.chunks[k].get();
      if (bytes.empty()) continue;
      const int c = int(int64_t(k) / columns);
      const std::string row_dir = dir_ + "/" + std::to_string(c) + "/" + std::to_string(compressing_.index);
      if (row_directories_[size_t(c)] != compressing_.index) {
        makeDirectory(row_dir);
        row_directories_[size_t(c)] = compressing_.index;
      }
      writeStoreFile(row_dir + "/" + std::to_string(int64_t(k) % columns), bytes.data(), bytes.size());
      bytes_ += bytes.size();
    }
    spare_ = compressing_.buffer;
    compressing_ = ChunkRow{};
  }

  std::string dir_;
  int64_t width_, height_;
  int channels_;
  SampleType type_;
  int chunk_;
  Compression compression_;  // as the array's .zarray names it
  std::shared_ptr<WorkPool> pool_;
  std::shared_ptr<std::atomic<bool>> fault_;
  uint64_t& bytes_;  // the writer's bytesWritten
  cv::Mat filling_, spare_;
  int filled_ = 0;  // rows of filling_ given
  int64_t rows_given_ = 0;
  ChunkRow compressing_;
  std::vector<int64_t> row_directories_;  // per channel: the chunk row whose directory exists (-1: none)
};

// One multiscale image: level 0 as given, each level below halved from the one above as its rows arrive.
class ZarrWriter::Image {
 public:
  Image(const std::string& dir, int64_t width, int64_t height, int channels, SampleType type, bool nearest,
        const ZarrOptions& o, const std::shared_ptr<std::atomic<bool>>& fault, uint64_t& bytes)
      : dir_(dir), interpolation_(nearest ? cv::INTER_NEAREST : cv::INTER_AREA) {
    // Nearest levels are labels' (categories); means are of measurements.
    const RasterValues values = nearest ? RasterValues::kCategories : RasterValues::kMeasurements;
    levels_.push_back(
        std::make_unique<Array>(dir + "/0", width, height, channels, type, values, o, fault, bytes));
    // As many levels as ImageWriter's TIFF pyramid with tiles of one chunk.
    for (int64_t w = width, h = height; o.pyramid && std::max(w, h) > o.chunk;) {
      w = (w + 1) / 2;
      h = (h + 1) / 2;
      const std::string level_dir = dir + "/" + std::to_string(levels_.size());
      levels_.push_back(std::make_unique<Array>(level_dir, w, h, channels, type, values, o, fault, bytes));
    }
    pending_.resize(levels_.size());
  }

  size_t levels() const { return levels_.size(); }

  void writeRows(const cv::Mat& band) {
    levels_[0]->addRows(band);
    feed(1, band);
  }

  // An odd last row of a level halves alone (as the TIFF pyramid's), then every level's last chunks.
  void finish() {
    TILER_CHECK(levels_[0]->rowsGiven() == levels_[0]->height(), IoError,
                "'" << dir_ << "': finished after " << levels_[0]->rowsGiven() << " of its "
                    << levels_[0]->height() << " rows");
    for (size_t li = 1; li < levels_.size(); ++li) {
      if (pending_[li].empty()) continue;
      const cv::Mat reduced = halve(pending_[li], cv::Size(int(levels_[li]->width()), 1), interpolation_);
      pending_[li].release();
      levels_[li]->addRows(reduced);
      feed(li + 1, reduced);
    }
    for (auto& level : levels_) level->finish();
  }

  void writeMetadata() const {
    for (const auto& level : levels_) level->writeMetadata();
  }

  size_t bufferedBytes() const {
    size_t bytes = 0;
    for (const auto& level : levels_) bytes += level->bufferedBytes();
    return bytes;
  }

 private:
  // Rows of level li - 1 into level li (and on down): whole pairs at once, an odd row waiting for its pair.
  void feed(size_t li, const cv::Mat& rows) {
    if (li >= levels_.size() || rows.rows == 0) return;
    const cv::Size level_width(int(levels_[li]->width()), 0);
    std::vector<cv::Mat> made;
    int y = 0;
    if (!pending_[li].empty()) {
      cv::Mat pair;
      cv::vconcat(pending_[li], rows.row(0), pair);
      made.push_back(halve(pair, cv::Size(level_width.width, 1), interpolation_));
      pending_[li].release();
      y = 1;
    }
    const int pairs = (rows.rows - y) / 2;
    if (pairs > 0) {
      made.push_back(
          halve(rows.rowRange(y, y + 2 * pairs), cv::Size(level_width.width, pairs), interpolation_));
      y += 2 * pairs;
    }
    if (y < rows.rows) pending_[li] = rows.row(y).clone();
    if (made.empty()) return;
    cv::Mat out;
    cv::vconcat(made, out);
    levels_[li]->addRows(out);
    feed(li + 1, out);
  }

  std::string dir_;
  int interpolation_;
  std::vector<std::unique_ptr<Array>> levels_;
  std::vector<cv::Mat> pending_;  // per level li >= 1: a row of level li - 1 waiting for its pair
};

namespace {

// The "multiscales" entry of an image: axes c, y, x; a scale per level (2^k, in micrometers where known).
nlohmann::json multiscales(const std::string& name, size_t levels, const ZarrOptions& o, bool nearest) {
  nlohmann::json space_y = {{"name", "y"}, {"type", "space"}}, space_x = {{"name", "x"}, {"type", "space"}};
  if (o.mpp) space_y["unit"] = space_x["unit"] = "micrometer";
  nlohmann::json datasets = nlohmann::json::array();
  for (size_t k = 0; k < levels; ++k) {
    const double scale = double(int64_t(1) << k) * o.mpp.value_or(1.0);
    datasets.push_back(
        {{"path", std::to_string(k)},
         {"coordinateTransformations", {{{"type", "scale"}, {"scale", {1.0, scale, scale}}}}}});
  }
  nlohmann::json entry = {{"version", "0.4"},
                          {"name", name},
                          {"axes", {{{"name", "c"}, {"type", "channel"}}, space_y, space_x}},
                          {"datasets", datasets}};
  if (levels > 1) {
    entry["type"] = nearest ? "nearest" : "local_mean";
    entry["metadata"] = {{"description", nearest ? "each level the top-left pixel of 2x2 of the level above"
                                                 : "each level the means of 2x2 of the level above"},
                         {"method", nearest ? "cv::resize INTER_NEAREST" : "cv::resize INTER_AREA"}};
  }
  return entry;
}

std::string hexColor(const std::array<uint8_t, 3>& rgb) {
  char text[8];
  std::snprintf(text, sizeof text, "%02X%02X%02X", rgb[0], rgb[1], rgb[2]);
  return text;
}

nlohmann::json imageAttributes(const ZarrProbabilities& p, size_t levels, const ZarrOptions& o,
                               const std::string& store) {
  nlohmann::json attributes = nlohmann::json::object();
  if (!p.attributes.empty()) {
    attributes = nlohmann::json::parse(p.attributes, nullptr, false);
    TILER_CHECK(attributes.is_object(), IoError,
                "'" << store << "': the probabilities' attributes are not a JSON object: " << p.attributes);
  }
  attributes["multiscales"] = {multiscales(o.name.empty() ? "probabilities" : o.name, levels, o, false)};
  if (!p.channel_classes.empty()) {
    const double top = p.type == SampleType::kU8 ? 255.0 : 1.0;  // u8 stores p x 255
    nlohmann::json channels = nlohmann::json::array();
    for (const ZarrClass& c : p.channel_classes)
      channels.push_back({{"label", c.name},
                          {"color", hexColor(c.rgb)},
                          {"active", true},
                          {"window", {{"min", 0.0}, {"max", top}, {"start", 0.0}, {"end", top}}}});
    attributes["omero"] = {{"channels", channels}, {"rdefs", {{"model", "color"}}}};
  }
  return attributes;
}

nlohmann::json labelAttributes(const ZarrLabels& l, size_t levels, const ZarrOptions& o, bool has_image) {
  nlohmann::json label = {{"version", "0.4"}};
  if (!l.classes.empty()) {
    nlohmann::json colors = nlohmann::json::array(), properties = nlohmann::json::array();
    for (size_t k = 0; k < l.classes.size(); ++k) {
      const auto& rgb = l.classes[k].rgb;
      colors.push_back({{"label-value", k}, {"rgba", {rgb[0], rgb[1], rgb[2], 255}}});
      properties.push_back({{"label-value", k}, {"name", l.classes[k].name}});
    }
    label["colors"] = colors;
    label["properties"] = properties;
  }
  if (has_image) label["source"] = {{"image", "../../"}};
  return {{"multiscales", {multiscales(l.name, levels, o, true)}}, {"image-label", label}};
}

}  // namespace

template <typename F>
void ZarrWriter::orAbandon(F step) {
  try {
    step();
  } catch (...) {
    abandon();
    throw;
  }
}

ZarrWriter::ZarrWriter(const std::string& path, int64_t width, int64_t height, ZarrOptions options)
    : path_(path), width_(width), height_(height), options_(std::move(options)) {
  TILER_CHECK(width > 0 && height > 0, IoError,
              "'" << path << "': cannot write a store of " << width << "x" << height << " pixels");
  TILER_CHECK(options_.probabilities || options_.labels, IoError,
              "'" << path << "': a store of neither probabilities nor labels");
  TILER_CHECK(options_.chunk > 0, ConfigError, "'" << path << "': chunks of " << options_.chunk << " px");
  TILER_CHECK(!options_.probabilities || options_.probabilities->channels >= 1, IoError,
              "'" << path << "': probabilities of no channel");
  TILER_CHECK(!options_.labels || isIntegerType(options_.labels->type), IoError,
              "'" << path << "': labels of " << sampleTypeName(options_.labels->type)
                  << " samples (an image-label holds integers)");
  TILER_CHECK(!options_.labels ||
                  (!options_.labels->name.empty() && options_.labels->name.find('/') == std::string::npos &&
                   options_.labels->name[0] != '.'),
              IoError, "'" << path << "': labels named '" << options_.labels->name << "'");
  for (const std::string& name : {path_, partialPath()}) {
    const std::string why = blockedBy(name);
    TILER_CHECK(why.empty(), IoError, why);
  }
  const std::string partial = partialPath();
  TILER_CHECK(removeTree(partial), IoError,
              "'" << partial << "': cannot remove the stale partial store: " << std::strerror(errno));
  makeDirectory(partial);
  orAbandon([&] {
    if (options_.probabilities)
      probabilities_ = std::make_unique<Image>(partial, width, height, options_.probabilities->channels,
                                               options_.probabilities->type, false, options_, chunk_fault_,
                                               bytes_written_);
    if (options_.labels) {
      makeDirectory(partial + "/labels");
      makeDirectory(partial + "/labels/" + options_.labels->name);
      labels_ = std::make_unique<Image>(partial + "/labels/" + options_.labels->name, width, height, 1,
                                        options_.labels->type, true, options_, chunk_fault_, bytes_written_);
    }
  });
}

ZarrWriter::~ZarrWriter() {
  if (!done_) abandon();
}

void ZarrWriter::abandon() noexcept {
  removeTree(partialPath());
  done_ = true;
}

void ZarrWriter::writeProbabilities(const cv::Mat& band) {
  TILER_CHECK(
      probabilities_ && !finished_ && !done_, IoError,
      "'" << path_ << "': probabilities given to a store " << (probabilities_ ? "finished" : "without them"));
  orAbandon([&] { probabilities_->writeRows(band); });
}

void ZarrWriter::writeLabels(const cv::Mat& band) {
  TILER_CHECK(labels_ && !finished_ && !done_, IoError,
              "'" << path_ << "': labels given to a store " << (labels_ ? "finished" : "without them"));
  orAbandon([&] { labels_->writeRows(band); });
}

void ZarrWriter::finish() {
  TILER_CHECK(!finished_ && !done_, IoError, "'" << path_ << "': finished twice, or after a failure");
  orAbandon([&] {
    if (probabilities_) probabilities_->finish();
    if (labels_) labels_->finish();
    writeMetadata();
  });
  finished_ = true;
}

// The arrays' metadata, then the groups' from the innermost out: the root's .zattrs, what makes the store
// an image, is the last file written.
void ZarrWriter::writeMetadata() {
  const std::string root = partialPath();
  if (labels_) {
    labels_->writeMetadata();
    const std::string group = root + "/labels/" + options_.labels->name;
    writeJson(group + "/.zgroup", {{"zarr_format", 2}}, bytes_written_);
    writeJson(group + "/.zattrs",
              labelAttributes(*options_.labels, labels_->levels(), options_, bool(probabilities_)),
              bytes_written_);
    writeJson(root + "/labels/.zgroup", {{"zarr_format", 2}}, bytes_written_);
    writeJson(root + "/labels/.zattrs", {{"labels", nlohmann::json::array({options_.labels->name})}},
              bytes_written_);
  }
  if (probabilities_) probabilities_->writeMetadata();
  writeJson(root + "/.zgroup", {{"zarr_format", 2}}, bytes_written_);
  const nlohmann::json attributes =
      probabilities_ ? imageAttributes(*options_.probabilities, probabilities_->levels(), options_, path_)
                     : nlohmann::json::object();
  writeJson(root + "/.zattrs", attributes, bytes_written_);
}

void ZarrWriter::commit() {
  TILER_CHECK(finished_ && !done_, IoError, "'" << path_ << "': commit before finish, or twice");
  // Never over what stands at the name: rename(2) would replace an empty directory.
  int renamed = ::renameat2(AT_FDCWD, partialPath().c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE);
  if (renamed != 0 && (errno == EINVAL || errno == ENOSYS)) {  // a filesystem without RENAME_NOREPLACE
    struct stat st;
    errno = EEXIST;
    if (::lstat(path_.c_str(), &st) != 0) renamed = std::rename(partialPath().c_str(), path_.c_str());
  }
  if (renamed != 0) {
    const int err = errno;
    abandon();
    TILER_THROW(IoError, "'" << path_ << "': the store cannot be renamed from .partial: "
                             << (err == EEXIST ? "the name exists (--overwrite removes an old store)"
                                               : std::strerror(err)));
  }
  done_ = true;
}

size_t ZarrWriter::bufferedBytes() const {
  return (probabilities_ ? probabilities_->bufferedBytes() : 0) + (labels_ ? labels_->bufferedBytes() : 0);
}

namespace {

// --save zarr (map_writers' registry): <stem>.ome.zarr with the probabilities as stored (--probs_dtype) as
// the image and the labels as the image-label labels/classes, the class palette and names (--classes, else
// class_<k>) as both's colours, `--compression` as zarrCompression maps it, µm/px and pyramid as the TIFF
// outputs have them. An old store at the name
// (--overwrite, or --resume redoing an image) is removed just before the new one is renamed in.
class ZarrMapWriter : public MapWriter {
 public:
  ZarrMapWriter(const std::string& path, const MapOutput& m) {
    const int label_classes = labelClassCount(m.classes);
    const auto palette = labelPalette(label_classes, m.settings.classes_named);
    auto className = [&](int k) {
      return k < int(m.settings.classes_named.size()) ? m.settings.classes_named[size_t(k)].name
                                                      : defaultClassName(k);
    };
    ZarrOptions zo;
    zo.chunk = m.writer.tile;
    zo.pyramid = m.writer.pyramid;
    zo.mpp = m.writer.mpp;
    zo.pool = m.writer.pool;
    zo.compression = m.writer.compression;
    ZarrProbabilities probabilities;
    probabilities.channels = m.classes;
    probabilities.type = m.settings.probs_type;
    if (m.classes > 1)
      for (int c = 0; c < m.classes; ++c)
        probabilities.channel_classes.push_back({className(c), palette[size_t(c)]});
    probabilities.attributes = probabilitiesDescription(m.settings.probs_type, m.settings.classes_named);
    zo.probabilities = probabilities;
    ZarrLabels labels;
    labels.type = labelSampleType(label_classes);
    for (int k = 0; k < label_classes; ++k) labels.classes.push_back({className(k), palette[size_t(k)]});
    zo.labels = labels;
    writer_ = std::make_unique<ZarrWriter>(path, m.width, m.height, std::move(zo));
  }
  bool needsLabels() const override { return true; }
  bool needsProbs() const override { return true; }
  void write(const MapBand& band) override {
    writer_->writeProbabilities(*band.probs);
    writer_->writeLabels(*band.labels);
  }
  void finish() override { writer_->finish(); }
  void commit(std::vector<std::string>& renamed) override {
    struct stat st;
    if (::lstat(writer_->path().c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      TILER_CHECK(removeTree(writer_->path()), IoError,
                  "'" << writer_->path() << "': the old store cannot be removed: " << std::strerror(errno));
    writer_->commit();
    renamed.push_back(writer_->path());
  }
  void injectFault() override { writer_->injectChunkFault(); }

 private:
  std::unique_ptr<ZarrWriter> writer_;
};

}  // namespace

std::unique_ptr<MapWriter> openZarrWriter(const std::string& path, const MapOutput& output) {
  return std::make_unique<ZarrMapWriter>(path, output);
}

}  // namespace tiler
