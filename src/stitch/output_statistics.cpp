#include "tiler/stitch/output_statistics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tiler/core/error.hpp"
#include "tiler/core/fault.hpp"

namespace fs = std::filesystem;

namespace tiler {

namespace {

// The directory temporary files go to: TMPDIR (or TMP, TEMP, TEMPDIR), else /tmp.
std::string temporaryDirectory(const std::string& what) {
  std::error_code ec;
  const fs::path dir = fs::temp_directory_path(ec);
  TILER_CHECK(!ec, IoError,
              what << ": no directory for the blended output's temporary file (TMPDIR): " << ec.message());
  return dir.string();
}

// An unlinked file in `dir`: O_TMPFILE where the file system has it, else a named one removed at once.
int openUnlinked(const std::string& dir, const std::string& what) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    std::string name = (fs::path(dir) / "tiler-blended-XXXXXX").string();
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  const int err = errno;
  TILER_CHECK(fd >= 0, IoError,
              what << ": cannot make the blended output's temporary file in '" << dir
                   << "' (TMPDIR): " << std::strerror(err));
  return fd;
}

}  // namespace

StatisticsPasses::StatisticsPasses(std::vector<ProcessingStep> steps, const ImageStatistics* input,
                                   int64_t width, int64_t height, int channels, std::string what)
    : steps_(std::move(steps)),
      input_(input ? std::optional<ImageStatistics>(*input) : std::nullopt),
      width_(width),
      height_(height),
      channels_(channels),
      what_(std::move(what)),
      dir_(temporaryDirectory(what_)),
      percentiles_(percentilesRead(steps_, false)),
      gatherer_(channels, /*exact=*/false, percentiles_) {
  fd_ = openUnlinked(dir_, what_);
}

StatisticsPasses::~StatisticsPasses() {
  if (fd_ >= 0) ::close(fd_);
}

void StatisticsPasses::add(const cv::Mat& given) {
  TILER_CHECK(given.type() == CV_MAKETYPE(CV_32F, channels_) && given.cols == width_, IoError,
              what_ << ": a blended band of another shape than the map's");
  const cv::Mat band = given.isContinuous() ? given : given.clone();
  TILER_CHECK(rows_ + band.rows <= height_, IoError, what_ << ": more blended rows than the map has");
  const size_t bytes = size_t(band.total()) * band.elemSize();
  const off_t at = off_t(rows_ * width_ * channels_ * int64_t(sizeof(float)));
  const char* data = reinterpret_cast<const char*>(band.data);
  for (size_t done = 0; done < bytes;) {
    errno = 0;
    const ssize_t n = full_ ? -1 : ::pwrite(fd_, data + done, bytes - done, at + off_t(done));
    if (full_) errno = ENOSPC;
    const int err = errno;
    TILER_CHECK(n > 0, IoError,
                what_ << ": writing the blended output's temporary file in '" << dir_ << "' (TMPDIR; "
                      << width_ * height_ * channels_ * int64_t(sizeof(float))
                      << " bytes for the whole map): "
                      << (full_ ? injectedFailure(std::strerror(err)) : std::string(std::strerror(err))));
    done += size_t(n);
  }
  rows_ += band.rows;
  // Moments now; the range too where percentiles are read, whose histogram takes a second read.
  std::vector<cv::Mat> planes;
  cv::split(band, planes);
  for (int c = 0; c < channels_; ++c) {
    const float* values = planes[size_t(c)].ptr<float>();
    if (percentiles_.empty())
      gatherer_.add(c, values, int64_t(planes[size_t(c)].total()));
    else
      gatherer_.addRange(c, values, int64_t(planes[size_t(c)].total()));
  }
}

void StatisticsPasses::read(int64_t first_row, int64_t rows, float* out) const {
  const size_t bytes = size_t(rows * width_ * channels_) * sizeof(float);
  const off_t at = off_t(first_row * width_ * channels_ * int64_t(sizeof(float)));
  char* data = reinterpret_cast<char*>(out);
  for (size_t done = 0; done < bytes;) {
    errno = 0;
    const ssize_t n = ::pread(fd_, data + done, bytes - done, at + off_t(done));
    const int err = errno;
    TILER_CHECK(n > 0, IoError,
                what_ << ": reading back the blended output's temporary file in '" << dir_
                      << "': " << (n == 0 ? std::string("it ended early") : std::string(std::strerror(err))));
    done += size_t(n);
  }
}

void StatisticsPasses::replay(int64_t band_rows, const std::function<void(const cv::Mat& band)>& sink) {
  TILER_CHECK(rows_ == height_, IoError,
              what_ << ": " << rows_ << " of the map's " << height_ << " rows were blended");
  band_rows = std::max<int64_t>(1, std::min(band_rows, std::max<int64_t>(height_, 1)));
  cv::Mat band(int(band_rows), int(width_), CV_MAKETYPE(CV_32F, channels_));
  if (!percentiles_.empty()) {
    std::vector<cv::Mat> planes;
    for (int64_t y = 0; y < height_; y += band_rows) {
      const int64_t h = std::min(band_rows, height_ - y);
      cv::Mat rows = band.rowRange(0, int(h));
      read(y, h, rows.ptr<float>());
      cv::split(rows, planes);
      for (int c = 0; c < channels_; ++c)
        gatherer_.add(c, planes[size_t(c)].ptr<float>(), int64_t(planes[size_t(c)].total()));
    }
  }
  statistics_ = gatherer_.finish();
  for (size_t c = 0; c < statistics_.channels.size(); ++c)
    TILER_CHECK(statistics_.channels[c].count > 0, IoError,
                what_ << ": the output's channel " << c << " holds no number (every value NaN): the card's "
                      << "postprocessing " << steps_.front().id << " has nothing to go by");
  affine_ = outputAffine(steps_, statistics_, input_ ? &*input_ : nullptr, what_);
  const std::vector<ProcessingStep> tail = fixedTail(steps_);
  for (int64_t y = 0; y < height_; y += band_rows) {
    const int64_t h = std::min(band_rows, height_ - y);
    cv::Mat rows = band.rowRange(0, int(h));
    read(y, h, rows.ptr<float>());
    applyFixedSteps(rows.ptr<float>(), h * width_, channels_, affine_, tail);
    sink(rows);
  }
}

}  // namespace tiler
