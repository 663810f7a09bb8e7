// loader: the window loader. Readers (one per image a thread is inside), window reads with padding, batch
// assembly into the model's raw input layout, and a read-ahead thread feeding a bounded queue.
// Promise: ReadAhead produces items in order on its own thread; stop() (or the destructor) returns within
// one item, and an exception in the producer reaches the consumer at next(). WindowLoader reads only this
// rank's windows, turns any exception while reading one window (libtiff, OpenCV, bad_alloc, ...) into a
// failure of that window's image (slot kSlotFailed, message naming the file) and reads nothing more of it.
// Memory: `depth` batches, plus the open readers' caches.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tiler/catalog.hpp"
#include "tiler/error.hpp"
#include "tiler/queue.hpp"
#include "tiler/sampler.hpp"

namespace tiler {

// produce(0), produce(1), ... produce(count-1) on a thread of its own, at most `depth` ahead of next().
template <typename T>
class ReadAhead {
 public:
  ReadAhead(int64_t count, size_t depth, std::function<T(int64_t)> produce) : queue_(depth) {
    thread_ = std::thread([this, count, produce = std::move(produce)] {
      try {
        for (int64_t i = 0; i < count; ++i)
          if (!queue_.push(produce(i))) break;
      } catch (...) {
        error_ = std::current_exception();  // published by close() below, read after pop() ends
      }
      queue_.close();
    });
  }
  ~ReadAhead() { stop(); }
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // The next item; rethrows the producer's exception; nullopt after the last item or stop().
  std::optional<T> next() {
    auto item = queue_.pop();
    if (!item && error_) std::rethrow_exception(error_);
    return item;
  }
  // Stops the producer (after the item it is making) and joins it.
  void stop() {
    queue_.close();
    if (thread_.joinable()) thread_.join();
  }
  bool stopping() const { return queue_.closed(); }

 private:
  BoundedQueue<T> queue_;
  std::exception_ptr error_;
  std::thread thread_;
};

enum class PadMode { kConstant, kReflect, kReplicate };
PadMode parsePadMode(const std::string& name);
// The pixels of image window `local_index`, padded where the window reaches outside the image.
cv::Mat readWindow(ImageReader& reader, const WindowGrid& grid, int64_t local_index, PadMode pad,
                   double cval);
// Writes `window` (HWC, any sample type) adapted to the model's channels as raw float32 values into `dst`
// (window.rows x window.cols x model channels).
void windowToModelInput(const cv::Mat& window, ChannelAdapt adapt, float* dst);

// Open readers keyed by name, for one thread. Images are visited in order, so dropBefore() frees the ones
// a thread is done with; `capacity` bounds the rest.
class ReaderCache {
 public:
  explicit ReaderCache(size_t capacity = 64) : capacity_(capacity) {}
  // The reader of `path` at level 0, or of a catalog image at its processing resolution.
  ImageReader& get(const std::string& path, const ProcessingResolution& resolution = {});
  ImageReader& get(const CatalogImage& image) { return get(image.input, image.resolution); }
  // Closes the readers of `path` (at every resolution).
  void drop(const std::string& path) { readers_.erase(first(path), first(path + '\0')); }
  // Closes the readers of every path that sorts before `path` (the images a thread has walked past).
  void dropBefore(const std::string& path) { readers_.erase(readers_.begin(), first(path)); }
  void clear() { readers_.clear(); }
  size_t size() const { return readers_.size(); }

 private:
  // A reader per file and resolution read (level, resampling factor), sorted by path first.
  using Key = std::tuple<std::string, int, double>;
  using Readers = std::map<Key, std::unique_ptr<ImageReader>>;
  size_t capacity_;
  Readers readers_;

  // The first reader of `path` or of a later path ("path\0" follows every resolution of path).
  Readers::iterator first(const std::string& path) {
    return readers_.lower_bound(
        Key{path, std::numeric_limits<int>::min(), -std::numeric_limits<double>::infinity()});
  }
};

// A slot's fate, sent with the step's window list.
enum SlotStatus : int64_t { kSlotOk = 0, kSlotPadded = 1, kSlotFailed = 2, kSlotSkipped = 3 };

// One step's batch as this rank read it. Tensors are owned CPU tensors.
struct WindowBatch {
  torch::Tensor pixels;  // float32 [B,H,W,C] raw sample values
  torch::Tensor scales;  // float32 [B]
  torch::Tensor meta;    // int64 [B,2]: global window index (-1 for padding), SlotStatus
  std::vector<std::pair<int, std::string>> failures;  // (image id, message) found while reading
  int64_t valid = 0;                                  // slots with kSlotOk
  double read_seconds = 0;
};

struct LoaderOptions {
  int64_t batch_size = 8;
  int input_channels = 3;
  PadMode pad = PadMode::kConstant;
  double cval = 0.0;
  size_t depth = 2;     // batches read ahead
  bool pinned = false;  // page-locked pixels, for asynchronous copies to a GPU
  // The model's device, made current on the read-ahead thread (pinned buffers belong to its context).
  torch::Device device = torch::kCPU;
  int rank = 0;
  std::optional<Fault> fault;  // TILER_FAULT (stage read)
};

// Reads this rank's shard (`slots`, `steps` batches of batch_size) of `catalog`, ahead of the consumer.
class WindowLoader {
 public:
  // `catalog` must outlive the loader; its images' inputs, grids and adaptations are only read.
  WindowLoader(const WindowCatalog& catalog, GridSpec spec, LoaderOptions options,
               std::vector<SampleSlot> slots, int64_t steps);
  // The next step's batch; rethrows a failure of the loader itself; nullopt after stop().
  std::optional<WindowBatch> next() { return ahead_->next(); }
  // No window of `image_id` is read from now on (its slots become kSlotSkipped). Thread safe.
  void skipImage(int image_id);
  void stop() {
    stopping_ = true;
    ahead_->stop();
  }

 private:
  WindowBatch assemble(int64_t step);
  bool skipped(int image_id);

  const WindowCatalog& catalog_;
  GridSpec spec_;
  LoaderOptions options_;
  std::vector<SampleSlot> slots_;
  ReaderCache readers_{8};  // loader thread only
  int64_t windows_read_ = 0;
  bool fault_fired_ = false;
  std::atomic<bool> stopping_{false};
  std::mutex skip_mutex_;
  std::set<int> skip_;
  std::unique_ptr<ReadAhead<WindowBatch>> ahead_;  // last: its thread uses the members above
};

}  // namespace tiler
