#include "tiler/io/catalog.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "tiler/core/error.hpp"
#include "tiler/core/output_kinds.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/readers/readers.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace fs = std::filesystem;

namespace tiler {

namespace {

// Adds the entry when it looks like an image: a regular file, or a link that leads nowhere (dangling, or a
// loop), which is listed so that opening it fails that image alone and the report names it. FIFOs, sockets
// and devices are passed over (reading one could wait for ever).
void addListedImage(const fs::directory_entry& e, std::vector<std::string>& files) {
  if (!hasImageExtension(e.path().string())) return;
  std::error_code ec;
  const fs::file_status target = e.status(ec);
  const bool broken_link = e.is_symlink(ec) && (target.type() == fs::file_type::not_found || ec);
  if (fs::is_regular_file(target) || broken_link) files.push_back(e.path().string());
}

// The entries under `dir`, one level or all; an entry that cannot be read is passed over, not the listing.
template <typename Iterator>
void listDirectory(const std::string& dir, std::vector<std::string>& files) {
  std::error_code ec;
  Iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  TILER_CHECK(!ec, IoError, "'" << dir << "': cannot list directory: " << ec.message());
  for (; it != Iterator(); it.increment(ec)) {
    if (ec) {
      spdlog::warn("'{}': listing stopped early: {}", dir, ec.message());
      break;
    }
    addListedImage(*it, files);
  }
}

}  // namespace

std::vector<std::string> listImages(const std::vector<std::string>& inputs, bool recursive) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (isInputList(in)) {
      for (const auto& listed : readInputList(in)) files.push_back(listed);
    } else if (isRemoteInput(in) || !fs::is_directory(in, ec)) {
      files.push_back(in);
    } else if (recursive) {
      listDirectory<fs::recursive_directory_iterator>(in, files);
    } else {
      listDirectory<fs::directory_iterator>(in, files);
    }
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

double defaultScale(SampleType type) {
  switch (type) {
    case SampleType::kU8:
      return 1.0 / 255.0;
    case SampleType::kU16:
      return 1.0 / 65535.0;
    case SampleType::kI16:
      return 1.0 / 32767.0;
    case SampleType::kU32:
      return 1.0 / 4294967295.0;
    case SampleType::kF16:
    case SampleType::kF32:
      return 1.0;
  }
  return 1.0;
}

ChannelAdapt channelAdaptation(int image_channels, int model_channels, const std::string& image_path,
                               bool palette) {
  if (image_channels == model_channels) return ChannelAdapt::kNone;
  if (palette && image_channels == 1 && model_channels == 3) return ChannelAdapt::kPalette;
  if (image_channels == 1 && model_channels == 3) return ChannelAdapt::kRepeatGray;
  if (image_channels == 4 && model_channels == 3) return ChannelAdapt::kDropAlpha;
  TILER_THROW(ModelError, "'" << image_path << "': image has " << image_channels
                              << " channel(s) but the model takes " << model_channels);
}

std::vector<int> parseChannelList(const std::string& list) {
  std::vector<int> channels;
  if (list.empty()) return channels;
  const auto refuse = [&](const std::string& why) {
    TILER_THROW(ConfigError, "--channels '" << list << "': " << why
                                            << " (0-based indices and ranges, e.g. 2,0,1 or 0-2 or 3,1-2)");
  };
  const auto index = [&](const std::string& text) {
    if (text.empty() || text.size() > 6 || text.find_first_not_of("0123456789") != std::string::npos)
      refuse("'" + text + "' is not a channel index");
    return std::stoi(text);
  };
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      channels.push_back(index(item));
    } else {
      const int first = index(item.substr(0, dash)), last = index(item.substr(dash + 1));
      if (last < first) refuse("range '" + item + "' runs backwards");
      for (int c = first; c <= last; ++c) channels.push_back(c);
    }
    // The chosen channels are an OpenCV matrix's (its CV_CN_MAX) on their way to the model.
    if (channels.size() > 512) refuse("more than 512 channels (" + std::to_string(channels.size()) + ")");
    start = comma + 1;
  }
  return channels;
}

CatalogImage WindowCatalog::describe(const std::string& path, const CatalogSpec& spec) {
  CatalogImage img;
  img.input = path;
  try {
    auto source = ImageReader::open(path);
    img.resolution = chooseResolution(source->info(), spec.resolution);
    auto reader = viewAtResolution(*source, img.resolution);
    img.info = reader->info();
    if (!spec.channels.empty()) {
      for (const int c : spec.channels)
        TILER_CHECK(c < img.info.channels, IoError,
                    "'" << path << "': --channels names channel " << c << " but the image has "
                        << img.info.channels << " (0-" << img.info.channels - 1 << ")");
      img.channels = spec.channels;
      img.info.channels = int(spec.channels.size());
    }
    if (spec.input_channels > 0)
      img.adapt =
          channelAdaptation(img.info.channels, spec.input_channels, path, img.info.colormap != nullptr);
    img.scale = spec.scale > 0 ? spec.scale : defaultScale(img.info.type);
    if (spec.with_grid) img.grid = WindowGrid(img.info.width, img.info.height, spec.grid, spec.output_scale);
    const int64_t out_w = spec.output_scale.apply(img.info.width);
    const int64_t out_h = spec.output_scale.apply(img.info.height);
    TILER_CHECK(out_w >= 1 && out_h >= 1, IoError,
                "'" << path << "': " << img.info.width << "x" << img.info.height
                    << " is smaller than one output pixel at the model's scale 1/" << spec.output_scale.den);
    if (spec.mask.active()) {
      // The mask comes from the reader already open: an image OpenCV decodes whole is decoded once.
      const CoverageMask mask = CoverageMask::make(*source, spec.mask, img.info.width, img.info.height);
      img.masked = true;
      img.mask_coverage = mask.coverage();
      img.mask_method = mask.method();
      for (int64_t i = 0; i < img.grid.count(); ++i)
        if (mask.fractionInside(img.grid.imageWindow(i)) >= spec.mask.fraction) img.kept.push_back(i);
    }
  } catch (...) {
    img.status = "error";
    img.error = describeImageException(std::current_exception(), path);
  }
  return img;
}

int WindowCatalog::add(CatalogImage image, bool planned) {
  const int id = int(images_.size());
  if (planned) {
    image.first_window = total_windows_;
    planned_.push_back(id);
    planned_first_.push_back(total_windows_);
    total_windows_ += image.plannedWindows();
  }
  images_.push_back(std::move(image));
  return id;
}

std::pair<int, int64_t> WindowCatalog::locate(int64_t global) const {
  TILER_CHECK(global >= 0 && global < total_windows_, ConfigError,
              "window " << global << " is outside the catalog's " << total_windows_);
  auto it = std::upper_bound(planned_first_.begin(), planned_first_.end(), global);
  const size_t k = size_t(it - planned_first_.begin()) - 1;
  const CatalogImage& image = images_[size_t(planned_[k])];
  return {planned_[k], image.gridWindow(global - planned_first_[k])};
}

std::vector<int64_t> WindowCatalog::rowLengths() const {
  std::vector<int64_t> rows;
  for (const int id : planned_) {
    const CatalogImage& image = images_[size_t(id)];
    int64_t row = -1;
    for (int64_t k = 0; k < image.plannedWindows(); ++k) {
      const int64_t r = image.gridWindow(k) / image.grid.columns();
      if (r != row) rows.push_back(0);
      row = r;
      ++rows.back();
    }
  }
  return rows;
}

namespace {

// The files a run reads, as (device, inode): an output that is one of them must never be written.
class InputFiles {
 public:
  explicit InputFiles(const std::vector<std::string>& files) {
    for (const auto& f : files) {
      struct stat st {};
      if (::stat(f.c_str(), &st) == 0) ids_.emplace(st.st_dev, st.st_ino);
    }
  }
  bool contains(const std::string& path) const {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && ids_.count({st.st_dev, st.st_ino}) > 0;
  }

 private:
  std::set<std::pair<dev_t, ino_t>> ids_;
};

// The listed files less tiler's own outputs found in the input directories (a re-run into the same
// directory must not take x_labels.tif as an input and write x_labels_labels.tif); files named on the
// command line are kept whatever wrote them.
std::vector<std::string> withoutTilerOutputs(std::vector<std::string> files,
                                             const std::vector<std::string>& named) {
  std::vector<std::string> skipped;
  const auto ours = [&](const std::string& f) {
    if (isRemoteInput(f) || std::find(named.begin(), named.end(), f) != named.end() || !isTilerOutputFile(f))
      return false;
    skipped.push_back(fs::path(f).filename().string());
    return true;
  };
  files.erase(std::remove_if(files.begin(), files.end(), ours), files.end());
  if (!skipped.empty()) {
    std::string list;
    for (size_t i = 0; i < skipped.size() && i < 3; ++i) list += (i ? ", " : "") + skipped[i];
    spdlog::info(
        "{} file(s) of the input directories are tiler's own outputs (their TIFF Software tag) and "
        "not taken as inputs: {}{}",
        skipped.size(), list, skipped.size() > 3 ? ", ..." : "");
  }
  return files;
}

// A run died while `img` was being read: a decoder may have ended it. A slide is read whole by OpenSlide in a
// probe process first, so one that ends a process again fails alone; other readers report what they cannot
// read as errors, and are read again.
void readAgainAfterACrash(CatalogImage& img) {
  if (!readerHas(img.info, kWholeSlide)) {
    spdlog::warn("'{}': a run that ended before finishing it was reading it; reading it again", img.input);
    return;
  }
  spdlog::warn(
      "'{}': a run that ended before finishing it was reading it; OpenSlide reads it whole in a probe "
      "process first",
      img.input);
  try {
    probeSlideInChildProcess(img.input, SlideProbe::kEveryTile);
  } catch (const Error& e) {
    img.status = "error";
    img.error = e.message();
  }
}

}  // namespace

void markReading(const CatalogImage& img) {
  if (img.reading_mark.empty()) return;
  // Only a plain file is a mark: something else at its name (a FIFO, whose open for writing would wait for a
  // reader forever) is left alone; O_NONBLOCK for one that appears meanwhile.
  struct stat st {};
  if (::lstat(img.reading_mark.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return;
  const int fd =
      ::open(img.reading_mark.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
}

void unmarkReading(const CatalogImage& img) {
  std::error_code ec;
  if (!img.reading_mark.empty() && isPlainFile(img.reading_mark)) fs::remove(img.reading_mark, ec);
}

namespace {

const OutputKind& namingOf(const InferCatalogOptions& o, const std::string& kind) {
  for (const SavedOutput& saved : o.outputs)
    if (saved.kind == kind) return saved.naming;
  TILER_THROW(ConfigError, "no output kind '" << kind << "'");
}

// A planned image's outputs as they stand: a dead run's partial paths swept (with remove_stale_partials), the
// image skipped when every output is there and complete (--resume), else those that exist added to
// `existing` (refused without --resume or --overwrite).
void settleExistingOutputs(const InferCatalogOptions& o, CatalogImage& img,
                           std::vector<std::string>& existing) {
  std::error_code ec;
  size_t present = 0;
  for (auto& [kind, out] : img.outputs) {
    const OutputKind& row = namingOf(o, kind);
    if (o.remove_stale_partials) {
      // A crashed run's: its writer's partial paths, as its row names them (a store's is a directory).
      for (const std::string& partial : partialPaths(row, out)) {
        if (row.directory && partial == out + ".partial") removeTree(partial);
        fs::remove(partial, ec);
      }
    }
    // Only a plain file (a store: a directory holding what its writer writes last) counts as finished: a
    // link (planted, or dangling) is never this run's output, an empty directory at a store's name no store.
    present += (row.directory ? isPlainDirectory(out) && isPlainFile(out + "/" + row.complete_when)
                              : isPlainFile(out))
                   ? 1
                   : 0;
  }
  if (present == img.outputs.size() && o.resume) {
    img.status = "skipped";
    if (o.remove_stale_partials) unmarkReading(img);  // finished: a mark beside it is stale
  } else if (!o.resume && !o.overwrite) {
    for (auto& [kind, out] : img.outputs)
      if (fs::symlink_status(out, ec).type() != fs::file_type::not_found) existing.push_back(out);
  }
}

}  // namespace

WindowCatalog buildInferCatalog(const InferCatalogOptions& o, const CatalogSpec& spec) {
  const std::vector<std::string> listed = listImages(o.inputs, o.recursive);
  TILER_CHECK(!listed.empty(), ConfigError, "no input images found in the given --input paths");
  const std::vector<std::string> files = withoutTilerOutputs(listed, o.inputs);
  TILER_CHECK(!files.empty(), ConfigError,
              "no input images found in the given --input paths (only tiler's own outputs)");
  std::vector<std::string> read = files;
  read.insert(read.end(), o.also_read.begin(), o.also_read.end());
  if (!o.roi.empty())
    for (const auto& path : files) read.push_back(roiFileFor(o.roi, path));
  const InputFiles inputs(read);
  WindowCatalog catalog;
  std::map<std::string, std::string> stems;    // output stem -> input, to catch collisions
  std::map<std::string, std::string> written;  // output path -> the input it is of
  std::vector<std::string> existing;
  for (const auto& path : files) {
    const std::string stem = inputStem(path);  // a URL's: its last path element's
    auto [first, fresh] = stems.emplace(stem, path);
    CatalogImage img;
    if (fresh) {
      img = WindowCatalog::describe(path, spec);
    } else {
      img.input = path;
      img.status = "error";
      img.error =
          "'" + path + "': its outputs would overwrite those of '" + first->second + "' (same file stem)";
    }
    for (const SavedOutput& saved : o.outputs)
      img.outputs[saved.kind] =
          (fs::path(o.output_dir) / outputFileName(saved.naming, saved.kind, stem, o.format)).string();
    // An output directory in memory (the Python module's: "memory:...") holds no mark.
    if (!isMemoryInput(o.output_dir))
      img.reading_mark = (fs::path(o.output_dir) / ("." + stem + ".tiler-reading")).string();
    for (const auto& [kind, out] : img.outputs) {
      const auto [other, unclaimed] = written.emplace(fs::path(out).lexically_normal().string(), path);
      if (img.status != "error" && !unclaimed) {
        img.status = "error";
        img.error = "'" + path + "': its " + kind + " output '" + out + "' is also an output of '" +
                    other->second + "' (their names meet: a stem and a head's name); rename one";
      }
      if (img.status != "error" && inputs.contains(out)) {
        img.status = "error";
        img.error = "'" + path + "': its " + kind + " output '" + out +
                    "' is read by this run (an input, the model or the mask); it is never overwritten: " +
                    "rename it or choose another --output";
      }
      // An output is renamed over its name, which would unlink a device or FIFO standing there. A store
      // (a directory kind) replaces only a directory of its own: a link or anything else there is refused.
      const bool store = namingOf(o, kind).directory;
      const WriteTarget target = store ? storeTargetOf(out) : writeTargetOf(out);
      if (img.status != "error" && (target.stream || !target.refused.empty())) {
        img.status = "error";
        img.error = "'" + path + "': its " + kind + " output " +
                    (target.stream ? "'" + out + "' is a character device or FIFO" : target.refused) +
                    ", which tiler never replaces; remove it or choose another --output";
      }
    }
    if (img.status == "ok" && o.format == "png" && img.outputs.count("labels")) {
      const int64_t pixels =
          spec.output_scale.apply(img.info.width) * spec.output_scale.apply(img.info.height);
      if (pixels > ImageWriter::kMaxInMemoryPixels) {
        img.status = "error";
        img.error = "'" + path + "': output of " + std::to_string(pixels) +
                    " pixels is too large for PNG; use --format tif";
      }
    }
    if (img.status == "ok") settleExistingOutputs(o, img, existing);
    if (img.status == "ok" && isPlainFile(img.reading_mark)) readAgainAfterACrash(img);
    const bool planned = img.status == "ok";
    catalog.add(std::move(img), planned);
  }
  if (!existing.empty()) {
    std::string list;
    for (size_t i = 0; i < existing.size() && i < 5; ++i) list += (i ? ", " : "") + existing[i];
    if (existing.size() > 5) list += ", ... (" + std::to_string(existing.size()) + " in all)";
    TILER_THROW(ConfigError, "outputs exist already: " << list
                                                       << "; pass --resume to skip finished images or "
                                                       << "--overwrite to redo them");
  }
  return catalog;
}

}  // namespace tiler
