// The OpenSlide backend of the reader registry (readers.hpp): whole-slide formats (Aperio, Hamamatsu,
// MIRAX, Leica, Ventana, ...), read region by region, each reading thread on an OpenSlide handle of its own.
#if TILER_WITH_OPENSLIDE
#include <openslide.h>
#endif
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tiff_support.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/version.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/readers/handle_pool.hpp"
#include "tiler/io/readers/readers.hpp"

namespace tiler {

#if TILER_WITH_OPENSLIDE
namespace {

std::optional<double> numericProperty(openslide_t* osr, const char* name) {
  const char* value = openslide_get_property_value(osr, name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  try {
    const double v = std::stod(value);
    if (v > 0 && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

class SlideReader final : public ImageReader {
 public:
  explicit SlideReader(const std::string& path) {
    // OpenSlide trusts a TIFF's chunk tables and aborts the whole process on an absurd one (GLib's failed
    // allocation): a TIFF-based slide's tables are checked first, so a corrupt one fails this image alone
    // with a precise message; then what the check cannot see (other formats' files) is tried in a child.
    if (looksLikeTiff(path)) checkTiffChunkTables(path);
    probeSlideInChildProcess(path);
    info_.path = path;
    info_.format = "openslide";
    info_.reader = "openslide";
    openslide_t* osr = openHandle();
    handles_.adopt(osr);  // the pool closes it, whatever happens below; it reads regions later
    info_.vendor = openslide_get_property_value(osr, OPENSLIDE_PROPERTY_NAME_VENDOR)
                       ? openslide_get_property_value(osr, OPENSLIDE_PROPERTY_NAME_VENDOR)
                       : "";
    const int32_t count = openslide_get_level_count(osr);
    for (int32_t l = 0; l < count; ++l) {
      int64_t w = 0, h = 0;
      openslide_get_level_dimensions(osr, l, &w, &h);
      info_.levels.push_back({w, h, openslide_get_level_downsample(osr, l)});
    }
    if (const char* error = openslide_get_error(osr)) throwSlideError("", error);
    TILER_CHECK(count > 0 && info_.levels[0].width > 0 && info_.levels[0].height > 0, IoError,
                "'" << path << "': OpenSlide reports no image data");
    info_.width = info_.levels[0].width;
    info_.height = info_.levels[0].height;
    info_.channels = 3;
    info_.type = SampleType::kU8;
    info_.tiled = true;
    info_.tile_width = int64_t(numericProperty(osr, "openslide.level[0].tile-width").value_or(0));
    info_.tile_height = int64_t(numericProperty(osr, "openslide.level[0].tile-height").value_or(0));
    info_.pages = int(count);
    info_.mpp = numericProperty(osr, OPENSLIDE_PROPERTY_NAME_MPP_X);
    info_.objective_power = numericProperty(osr, OPENSLIDE_PROPERTY_NAME_OBJECTIVE_POWER);
    if (const char* c = openslide_get_property_value(osr, "tiff.Compression")) info_.compression = c;
  }

  const ImageInfo& info() const override { return info_; }
  size_t cachedBytes() const override { return 0; }  // OpenSlide's own tile cache, bounded by OpenSlide

  cv::Mat readRegion(const Rect& r, int level) override {
    TILER_CHECK(
        level >= 0 && size_t(level) < info_.levels.size(), IoError,
        "'" << info_.path << "': no resolution level " << level << " (it has " << info_.levels.size() << ")");
    const ImageInfo::Level& l = info_.levels[size_t(level)];
    TILER_CHECK(r.x >= 0 && r.y >= 0 && r.w > 0 && r.h > 0 && r.right() <= l.width && r.bottom() <= l.height,
                IoError,
                "'" << info_.path << "': region " << r.x << "," << r.y << " " << r.w << "x" << r.h
                    << " outside level " << level << " (" << l.width << "x" << l.height << ")");
    std::vector<uint32_t> argb(size_t(r.w) * size_t(r.h));
    {
      // A handle of this thread's own for the read (OpenSlide serialises reads per handle).
      HandlePool<openslide_t>::Lease osr(handles_, [this] { return openHandle(); });
      // OpenSlide takes the region's corner in level-0 pixels.
      openslide_read_region(osr.get(), argb.data(), std::llround(double(r.x) * l.downsample),
                            std::llround(double(r.y) * l.downsample), level, r.w, r.h);
      // A handle in OpenSlide's error state stays so: it is closed, not reused.
      if (const char* error = openslide_get_error(osr.get())) {
        const std::string message = error;
        osr.discard();
        throwSlideError("cannot read region " + std::to_string(r.x) + "," + std::to_string(r.y) + " " +
                            std::to_string(r.w) + "x" + std::to_string(r.h) + " of level " +
                            std::to_string(level),
                        message);
      }
    }
    // Premultiplied ARGB over white: c + (255 - a).
    cv::Mat out(int(r.h), int(r.w), CV_8UC3);
    const uint32_t* src = argb.data();
    for (int y = 0; y < out.rows; ++y) {
      uint8_t* dst = out.ptr<uint8_t>(y);
      for (int x = 0; x < out.cols; ++x, ++src, dst += 3) {
        const uint32_t p = *src, white = 255 - (p >> 24);
        dst[0] = uint8_t(((p >> 16) & 0xff) + white);
        dst[1] = uint8_t(((p >> 8) & 0xff) + white);
        dst[2] = uint8_t((p & 0xff) + white);
      }
    }
    return out;
  }

 private:
  // A new handle, or an IoError naming the file (a handle OpenSlide opened in its error state is closed).
  openslide_t* openHandle() const {
    openslide_t* osr = openslide_open(info_.path.c_str());
    TILER_CHECK(osr != nullptr, IoError,
                "'" << info_.path << "': not a whole-slide image OpenSlide can read (format not recognised)");
    if (const char* error = openslide_get_error(osr)) {
      const std::string message = error;
      openslide_close(osr);
      throwSlideError("", message);
    }
    return osr;
  }
  // OpenSlide's error `message` as an IoError naming the file and what failed (`failed`, when said).
  [[noreturn]] void throwSlideError(const std::string& failed, const std::string& message) const {
    TILER_THROW(IoError, "'" << info_.path << "': OpenSlide" << (failed.empty() ? "" : " " + failed) << ": "
                             << message);
  }

  ImageInfo info_;
  HandlePool<openslide_t> handles_{openslide_close};
};

}  // namespace

namespace {

// The child's work: OpenSlide's open and the reads `depth` asks for; the first error OpenSlide reports, or
// "".
std::string readInProbe(const std::string& path, SlideProbe depth) {
  openslide_t* osr = openslide_open(path.c_str());
  if (osr == nullptr) return "";  // not OpenSlide's: the real open says so
  // kCorners: a corner of every level (each level's tables are read on its first tile); kEveryTile: all of
  // every level, in regions of 1024 px.
  const int64_t region = depth == SlideProbe::kCorners ? 64 : 1024;
  std::vector<uint32_t> pixels(size_t(region * region));
  for (int32_t level = 0; level < openslide_get_level_count(osr) && !openslide_get_error(osr); ++level) {
    int64_t w = 0, h = 0;
    openslide_get_level_dimensions(osr, level, &w, &h);
    const double downsample = openslide_get_level_downsample(osr, level);
    const int64_t last_y = depth == SlideProbe::kCorners ? std::min<int64_t>(h, 1) : h;
    const int64_t last_x = depth == SlideProbe::kCorners ? std::min<int64_t>(w, 1) : w;
    for (int64_t y = 0; y < last_y && !openslide_get_error(osr); y += region)
      for (int64_t x = 0; x < last_x && !openslide_get_error(osr); x += region)
        openslide_read_region(osr, pixels.data(), int64_t(double(x) * downsample),
                              int64_t(double(y) * downsample), level, std::min(region, w - x),
                              std::min(region, h - y));
  }
  const char* error = openslide_get_error(osr);
  std::string message = error ? error : "";
  openslide_close(osr);
  return message;
}

}  // namespace

void probeSlideInChildProcess(const std::string& path, SlideProbe depth) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // the open that follows names the problem
  using Key = std::tuple<dev_t, ino_t, off_t, time_t, SlideProbe>;
  static std::mutex mutex;
  static std::set<Key> probed;  // guarded by mutex
  const Key key{st.st_dev, st.st_ino, st.st_size, st.st_mtime, depth};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (probed.count(key)) return;
  }
  int report[2];  // the child's OpenSlide error, if any, back to the parent
  TILER_CHECK(pipe2(report, O_CLOEXEC) == 0, IoError,
              "'" << path << "': cannot start a process to probe it: " << std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) {
    close(report[0]);
    close(report[1]);
    TILER_THROW(IoError, "'" << path << "': cannot start a process to probe it: " << std::strerror(errno));
  }
  if (pid == 0) {
    // Only OpenSlide runs here, with the default dispositions of the signals a crash raises, and the child
    // leaves by _exit: nothing of the parent's (sockets, buffers, exit handlers) is touched.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (int s : {SIGSEGV, SIGBUS, SIGABRT, SIGTRAP, SIGFPE, SIGILL}) signal(s, SIG_DFL);
    close(report[0]);
    const std::string error = readInProbe(path, depth);
    if (depth == SlideProbe::kEveryTile && !error.empty()) {
      const ssize_t written = write(report[1], error.data(), std::min<size_t>(error.size(), 4096));
      _exit(written >= 0 ? 2 : 3);
    }
    _exit(0);
  }
  close(report[1]);
  // A slide on a slow disk may take seconds to open; one that takes minutes is as good as hung. Reading all
  // of a slide takes as long as the job's own read of it, a few minutes for the largest.
  const auto timeout = std::chrono::seconds(depth == SlideProbe::kCorners ? 120 : 1800);
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 || (done < 0 && errno == EINTR)) {
    if (std::chrono::steady_clock::now() - start > timeout) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      close(report[0]);
      TILER_THROW(IoError, "'" << path << "': OpenSlide did not "
                               << (depth == SlideProbe::kCorners ? "open" : "read") << " it within "
                               << timeout.count() << " s (in a probe process)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string error(4096, '\0');
  const ssize_t got = read(report[0], error.data(), error.size());
  error.resize(size_t(std::max<ssize_t>(got, 0)));
  close(report[0]);
  // The child leaves by _exit(0), by _exit(2) with OpenSlide's error, or not at all: a signal, or another
  // exit status (a library's exit(), a sanitizer's abort), is OpenSlide ending the process.
  TILER_CHECK(done != pid || !WIFSIGNALED(status), IoError,
              "'" << path << "': OpenSlide crashed on it (" << strsignal(WTERMSIG(status))
                  << " in a probe process): the slide is corrupt or of a kind OpenSlide mishandles");
  TILER_CHECK(done != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 2, IoError,
              "'" << path << "': OpenSlide cannot read all of it (in a probe process): " << error);
  TILER_CHECK(done != pid || !WIFEXITED(status) || WEXITSTATUS(status) == 0, IoError,
              "'" << path << "': OpenSlide ended the probe process on it (exit status " << WEXITSTATUS(status)
                  << "): the slide is corrupt or of a kind OpenSlide mishandles");
  std::lock_guard<std::mutex> lock(mutex);
  probed.insert(key);
}

std::string slideVendor(const std::string& path) {
  const char* vendor = openslide_detect_vendor(path.c_str());
  if (vendor == nullptr || std::string(vendor) == "generic-tiff") return "";
  return vendor;
}

std::unique_ptr<ImageReader> openWholeSlide(const std::string& path) {
  return std::make_unique<SlideReader>(path);
}

#else
// Without OpenSlide a file with a whole-slide extension (.svs, .ndpi, .mrxs, ...) is claimed here and fails
// its image, saying what this build lacks: libtiff would read some of them, but not their resolution, and
// not their label and macro pages apart from the pyramid. Other TIFFs stay with libtiff's reader.
std::string slideVendor(const std::string& path) {
  return isWholeSlideExtension(path) ? "unknown (no OpenSlide)" : "";
}

std::unique_ptr<ImageReader> openWholeSlide(const std::string& path) {
  requireFeature("openslide", "'" + path + "' (a whole-slide format)");
  return nullptr;
}

void probeSlideInChildProcess(const std::string& path, SlideProbe) {
  openWholeSlide(path);
}
#endif

// OpenSlide is asked only about TIFFs and slide names. A TIFF it knows no vendor of is a plain one, libtiff's
// whatever its name; a slide name that is no TIFF is OpenSlide's, whose error says why it cannot read it.
bool identifyWholeSlide(const FileHead& head) {
  const bool tiff = isTiffMagic(head.bytes), slide_name = isWholeSlideExtension(head.path);
  if (slide_name && !tiff) return true;
  return (tiff || slide_name) && !slideVendor(head.path).empty();
}

}  // namespace tiler
