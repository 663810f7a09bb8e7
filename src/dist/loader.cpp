#include "tiler/dist/loader.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <opencv2/core.hpp>
#include <type_traits>

namespace tiler {

PadMode parsePadMode(const std::string& name) {
  if (name == "constant") return PadMode::kConstant;
  if (name == "reflect") return PadMode::kReflect;
  if (name == "replicate") return PadMode::kReplicate;
  TILER_THROW(ConfigError, "--pad must be constant, reflect or replicate; got '" << name << "'");
}

cv::Mat readWindow(ImageReader& reader, const WindowGrid& grid, int64_t local_index, PadMode pad, double cval,
                   const std::vector<int>& channels) {
  const Rect r = grid.imageWindow(local_index);
  const ImageInfo& info = reader.info();
  const int64_t x0 = std::max<int64_t>(r.x, 0), y0 = std::max<int64_t>(r.y, 0);
  const int64_t x1 = std::min(r.right(), info.width), y1 = std::min(r.bottom(), info.height);
  cv::Mat inside = reader.readRegion(Rect{x0, y0, x1 - x0, y1 - y0});
  if (!channels.empty()) {
    // Before the padding: only the chosen channels are copied.
    cv::Mat chosen(inside.rows, inside.cols, CV_MAKETYPE(inside.depth(), int(channels.size())));
    std::vector<int> from_to;
    for (size_t k = 0; k < channels.size(); ++k) {
      from_to.push_back(channels[k]);
      from_to.push_back(int(k));
    }
    cv::mixChannels(&inside, 1, &chosen, 1, from_to.data(), channels.size());
    inside = chosen;
  }
  if (x0 == r.x && y0 == r.y && x1 == r.right() && y1 == r.bottom()) return inside;
  const int mode = pad == PadMode::kConstant  ? cv::BORDER_CONSTANT
                   : pad == PadMode::kReflect ? cv::BORDER_REFLECT_101
                                              : cv::BORDER_REPLICATE;
  cv::Mat out;
  cv::copyMakeBorder(inside, out, int(y0 - r.y), int(r.bottom() - y1), int(x0 - r.x), int(r.right() - x1),
                     mode, cv::Scalar::all(cval));
  return out;
}

namespace {

// T: float (any sample type, values kept) or uint8_t (8-bit samples only, copied as they are).
template <typename T>
void toModelInput(const cv::Mat& window, ChannelAdapt adapt, T* dst,
                  const std::vector<std::array<uint16_t, 3>>* colormap) {
  constexpr bool bytes = std::is_same_v<T, uint8_t>;
  constexpr int depth = bytes ? CV_8U : CV_32F;
  if (adapt == ChannelAdapt::kPalette) {
    TILER_CHECK(colormap != nullptr && window.channels() == 1 &&
                    (window.depth() == CV_8U || (!bytes && window.depth() == CV_16U)),
                IoError, "a palette window needs its colour map and 8- or 16-bit indices");
    const size_t plane = size_t(window.rows) * size_t(window.cols);
    // Colours in the range of the indices' sample type, which decides the input scale (1/255 or 1/65535).
    const float to_range = window.depth() == CV_8U ? 1.0f / 257.0f : 1.0f;
    const size_t entries = colormap->size();
    for (int y = 0; y < window.rows; ++y) {
      for (int x = 0; x < window.cols; ++x) {
        const size_t index = window.depth() == CV_8U ? window.at<uint8_t>(y, x) : window.at<uint16_t>(y, x);
        const auto& colour = (*colormap)[std::min(index, entries - 1)];
        const size_t at = size_t(y) * size_t(window.cols) + size_t(x);
        for (size_t c = 0; c < 3; ++c) dst[c * plane + at] = T(std::round(float(colour[c]) * to_range));
      }
    }
    return;
  }
  // A byte batch is chosen only for images of 8-bit samples (inputAsBytes); a reader that hands out another
  // type would be cut to 8 bits here, so it is an error instead.
  TILER_CHECK(!bytes || window.depth() == CV_8U, IoError,
              "a window of " << cv::typeToString(window.type()) << " samples in a batch of 8-bit samples");
  const int channels = adapt == ChannelAdapt::kNone ? window.channels() : 3;
  // Planes in the sample type first (split works for every depth; cvtColor refuses i16 and u32), each then
  // converted straight into its plane of dst: the model's layout, so that no pass over the batch transposes.
  std::vector<cv::Mat> planes(size_t(window.channels()));
  if (window.channels() == 1)
    planes[0] = window;
  else
    cv::split(window, planes.data());
  const size_t plane = size_t(window.rows) * size_t(window.cols);
  for (int c = 0; c < channels; ++c) {
    cv::Mat out(window.rows, window.cols, depth, dst + size_t(c) * plane);
    planes[adapt == ChannelAdapt::kRepeatGray ? 0 : size_t(c)].convertTo(out, depth);
    TILER_CHECK(out.data == reinterpret_cast<uchar*>(dst + size_t(c) * plane), IoError,
                "a window of " << window.cols << "x" << window.rows << " did not fit its slot");
  }
}

}  // namespace

void windowToModelInput(const cv::Mat& window, ChannelAdapt adapt, float* dst,
                        const std::vector<std::array<uint16_t, 3>>* colormap) {
  toModelInput(window, adapt, dst, colormap);
}

void windowToModelInput(const cv::Mat& window, ChannelAdapt adapt, uint8_t* dst,
                        const std::vector<std::array<uint16_t, 3>>* colormap) {
  toModelInput(window, adapt, dst, colormap);
}

bool inputAsBytes(const WindowCatalog& catalog) {
  const auto& images = catalog.images();
  return !images.empty() && std::all_of(images.begin(), images.end(), [](const CatalogImage& img) {
    return img.info.type == SampleType::kU8;
  });
}

ParallelFor::ParallelFor(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { helperLoop(); });
}

ParallelFor::~ParallelFor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : helpers_) t.join();
}

void ParallelFor::take(const std::function<void(int64_t)>& fn, int64_t count) {
  // Contiguous parts, one a thread: neighbouring windows share input tiles, and a tile two threads want at
  // once is decoded by one while the other waits.
  const int64_t parts = threads();
  for (int64_t part = next_.fetch_add(1); part < parts; part = next_.fetch_add(1))
    for (int64_t i = part * count / parts; i < (part + 1) * count / parts; ++i) fn(i);
}

void ParallelFor::run(int64_t count, const std::function<void(int64_t)>& fn) {
  if (helpers_.empty() || count <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    count_ = count;
    next_ = 0;
    busy_ = int(helpers_.size());
    ++generation_;
  }
  wake_.notify_all();
  take(fn, count);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return busy_ == 0; });
  fn_ = nullptr;
}

void ParallelFor::helperLoop() {
  int64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t)>* fn = nullptr;
    int64_t count = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      fn = fn_;
      count = count_;
    }
    take(*fn, count);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_ == 0) done_.notify_all();
  }
}

std::shared_ptr<ImageReader> ReaderCache::shared(const std::string& path,
                                                 const ProcessingResolution& resolution) {
  const Key key{path, resolution.level, resolution.factor};
  auto it = readers_.find(key);
  if (it != readers_.end()) return it->second;
  if (readers_.size() >= capacity_) readers_.clear();
  std::shared_ptr<ImageReader> reader = atResolution(ImageReader::open(path), resolution);
  return readers_.emplace(key, std::move(reader)).first->second;
}

WindowLoader::WindowLoader(const WindowCatalog& catalog, GridSpec spec, LoaderOptions options,
                           std::vector<SampleSlot> slots, int64_t steps)
    : catalog_(catalog),
      spec_(spec),
      options_(std::move(options)),
      slots_(std::move(slots)),
      reads_(std::max(1, options_.read_threads)) {
  ahead_ = std::make_unique<ReadAhead<WindowBatch>>(steps, options_.depth, [this](int64_t step) {
    const c10::DeviceGuard device(options_.device);
    return assemble(step);
  });
}

void WindowLoader::skipImage(int image_id) {
  std::lock_guard<std::mutex> lock(skip_mutex_);
  skip_.insert(image_id);
}

bool WindowLoader::skipped(int image_id) {
  std::lock_guard<std::mutex> lock(skip_mutex_);
  return skip_.count(image_id) > 0;
}

WindowBatch WindowLoader::assemble(int64_t step) {
  const int64_t B = options_.batch_size, H = spec_.window_h, W = spec_.window_w, C = options_.input_channels;
  const auto t0 = std::chrono::steady_clock::now();
  WindowBatch batch;
  // Every slot is written once: the windows read below, the others zeroed at the end.
  const auto type = options_.bytes ? torch::kUInt8 : torch::kFloat32;
  batch.pixels = torch::empty({B, C, H, W}, torch::TensorOptions(type).pinned_memory(options_.pinned));
  batch.scales = torch::ones({B}, torch::kFloat32);
  if (options_.affine) batch.affine = torch::zeros({B, 2, C}, torch::kFloat32);
  batch.slots.assign(size_t(B), WindowSlot{});
  if (options_.make_labels) batch.labels = options_.make_labels(B);
  std::vector<std::optional<SlotRead>> reads = planReads(step, batch);
  readPixels(reads, batch);
  settleSlots(reads, batch);
  // Every slot but the windows read holds zeros: padding, skips, whatever a failed read left.
  for (int64_t j = 0; j < B; ++j)
    if (!batch.slots[size_t(j)].ok()) batch.pixels[j].zero_();
  batch.read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return batch;
}

std::vector<std::optional<WindowLoader::SlotRead>> WindowLoader::planReads(int64_t step, WindowBatch& batch) {
  const int64_t B = options_.batch_size;
  // Serial: which slots to read, with which reader (in slot order, as before_read counts them).
  std::vector<std::optional<SlotRead>> reads(static_cast<size_t>(B));
  std::map<int, std::exception_ptr> open_failures;
  bool dropped = false;
  for (int64_t j = 0; j < B; ++j) {
    const int64_t pos = step * B + j;
    WindowSlot& slot = batch.slots[size_t(j)];
    if (pos >= int64_t(slots_.size()) || slots_[size_t(pos)].padded) continue;
    if (stopping_) break;  // the consumer is gone: stop within the batch
    const int64_t global = slots_[size_t(pos)].index;
    const auto [image_id, local] = catalog_.locate(global);
    slot.image = image_id;
    slot.window = global;
    if (skipped(image_id)) {
      slot.status = SlotStatus::kSkipped;
      continue;
    }
    const CatalogImage& img = catalog_.image(image_id);
    if (!dropped && options_.in_order) {
      readers_.dropBefore(img.input);  // the shard walks the global order: earlier images are done
      dropped = true;
    }
    SlotRead& read = reads[size_t(j)].emplace();
    read.image_id = image_id;
    read.local = local;
    if (auto failed = open_failures.find(image_id); failed != open_failures.end()) {
      read.error = failed->second;  // not opened again for each of its windows
      continue;
    }
    if (!img.statistics_error.empty()) {
      read.error = std::make_exception_ptr(IoError(img.statistics_error));
      open_failures.emplace(image_id, read.error);
      continue;
    }
    try {
      if (marked_.insert(image_id).second) markReading(img);  // before any of its pixels is decoded here
      if (options_.before_read) options_.before_read(img.input);
      read.reader = readers_.shared(img.input, img.resolution);
    } catch (...) {
      read.error = std::current_exception();
      open_failures.emplace(image_id, read.error);
    }
  }
  return reads;
}

void WindowLoader::readPixels(std::vector<std::optional<SlotRead>>& reads, WindowBatch& batch) {
  const int64_t H = spec_.window_h, W = spec_.window_w, C = options_.input_channels;
  // Parallel: the windows' pixels, each into its own slot.
  reads_.run(options_.batch_size, [&](int64_t j) {
    auto& read = reads[size_t(j)];
    if (!read || read->error) return;
    const CatalogImage& img = catalog_.image(read->image_id);
    try {
      const cv::Mat window =
          readWindow(*read->reader, img.grid, read->local, options_.pad, options_.cval, img.channels);
      const int64_t at = j * H * W * C;
      if (options_.bytes)
        windowToModelInput(window, img.adapt, batch.pixels.data_ptr<uint8_t>() + at, img.info.colormap.get());
      else
        windowToModelInput(window, img.adapt, batch.pixels.data_ptr<float>() + at, img.info.colormap.get());
      if (options_.read_labels) options_.read_labels(batch.labels, j, read->image_id, read->local);
    } catch (...) {
      read->error = std::current_exception();
    }
  });
}

void WindowLoader::settleSlots(std::vector<std::optional<SlotRead>>& reads, WindowBatch& batch) {
  // Serial, in slot order: an image's first failure fails it, its later slots are skipped.
  for (int64_t j = 0; j < options_.batch_size; ++j) {
    auto& read = reads[size_t(j)];
    if (!read) continue;
    const CatalogImage& img = catalog_.image(read->image_id);
    WindowSlot& slot = batch.slots[size_t(j)];
    if (skipped(read->image_id)) {
      slot.status = SlotStatus::kSkipped;
    } else if (read->error) {
      slot.status = SlotStatus::kFailed;
      if (!batch.first_error) batch.first_error = read->error;
      batch.failures.emplace_back(read->image_id,
                                  errorRankPrefix() + describeImageException(read->error, img.input));
      skipImage(read->image_id);
      read->reader.reset();
      readers_.drop(img.input);
    } else {
      batch.scales[j] = float(img.scale);
      if (batch.affine.defined()) {
        const auto& f = img.input_affine;
        auto* row = batch.affine.data_ptr<float>() + j * 2 * options_.input_channels;
        for (int c = 0; c < options_.input_channels; ++c) {
          row[c] = float(f.gain.empty() ? 1.0 : f.gain[f.gain.size() == 1 ? 0 : size_t(c)]);
          row[options_.input_channels + c] =
              float(f.offset.empty() ? 0.0 : f.offset[f.offset.size() == 1 ? 0 : size_t(c)]);
        }
      }
      slot.status = SlotStatus::kOk;
      ++batch.valid;
    }
  }
}

}  // namespace tiler
