// loader: the window loader. Readers (one per image a thread is inside), window reads with padding, batch
// assembly into the model's raw input layout, and a read-ahead thread feeding a bounded queue; that thread
// and `read_threads - 1` helpers read a batch's windows side by side (readers are thread safe, and a TIFF
// tile two windows share is decoded once).
// Promise: ReadAhead produces items in order on its own thread; stop() (or the destructor) returns within
// one item, and an exception in the producer reaches the consumer at next(). WindowLoader reads only this
// rank's windows, turns any exception while reading one window (libtiff, OpenCV, bad_alloc, ...) into a
// failure of that window's image (slot kFailed, message naming the file) and reads nothing more of it.
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

#include "tiler/core/error.hpp"
#include "tiler/core/queue.hpp"
#include "tiler/core/sampler.hpp"
#include "tiler/core/slots.hpp"
#include "tiler/io/catalog.hpp"

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
// The pixels of image window `local_index`, padded where the window reaches outside the image; only the
// `channels` given, in their order (CatalogImage::channels; empty: all).
cv::Mat readWindow(ImageReader& reader, const WindowGrid& grid, int64_t local_index, PadMode pad, double cval,
                   const std::vector<int>& channels = {});
// Writes `window` (HWC, any sample type) adapted to the model's channels as raw float32 values into `dst`,
// one plane a channel (model channels x window.rows x window.cols, as the model takes them). kPalette needs
// the image's `colormap`: colours in the sample type's range (8-bit indices: the map's 16-bit values / 257).
void windowToModelInput(const cv::Mat& window, ChannelAdapt adapt, float* dst,
                        const std::vector<std::array<uint16_t, 3>>* colormap = nullptr);
// The same as uint8 values, for windows of 8-bit samples (an error for any other depth).
void windowToModelInput(const cv::Mat& window, ChannelAdapt adapt, uint8_t* dst,
                        const std::vector<std::array<uint16_t, 3>>* colormap = nullptr);
// Whether every image of `catalog` has 8-bit samples, so that its batches can hold them as bytes: a quarter
// of the memory, of the read threads' writes and of the copy to a GPU; the model's device makes them floats.
bool inputAsBytes(const WindowCatalog& catalog);

// Runs fn(0), ..., fn(count - 1) on the calling thread and `threads - 1` helper threads of its own, each
// thread a contiguous part, and returns when every call has returned. fn must not throw. One caller at a
// time.
class ParallelFor {
 public:
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;
  void run(int64_t count, const std::function<void(int64_t)>& fn);
  int threads() const { return int(helpers_.size()) + 1; }

 private:
  void helperLoop();
  void take(const std::function<void(int64_t)>& fn, int64_t count);

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;  // the running job; guarded by mutex_
  int64_t count_ = 0;                                 // guarded by mutex_
  int64_t generation_ = 0;                            // jobs started; guarded by mutex_
  int busy_ = 0;                                      // helpers still on the job; guarded by mutex_
  bool stopping_ = false;                             // guarded by mutex_
  std::atomic<int64_t> next_{0};                      // the job's next part
  std::vector<std::thread> helpers_;                  // last: they use the members above
};

// Open readers keyed by name, for one thread. Images are visited in order, so dropBefore() frees the ones
// a thread is done with; `capacity` bounds the rest.
class ReaderCache {
 public:
  explicit ReaderCache(size_t capacity = 64) : capacity_(capacity) {}
  // The reader of `path` at level 0, or of a catalog image at its processing resolution.
  ImageReader& get(const std::string& path, const ProcessingResolution& resolution = {}) {
    return *shared(path, resolution);
  }
  ImageReader& get(const CatalogImage& image) { return get(image.input, image.resolution); }
  // The same reader, kept open by the caller's pointer even when the cache closes it.
  std::shared_ptr<ImageReader> shared(const std::string& path, const ProcessingResolution& resolution = {});
  // Closes the readers of `path` (at every resolution).
  void drop(const std::string& path) { readers_.erase(first(path), first(path + '\0')); }
  // Closes the readers of every path that sorts before `path` (the images a thread has walked past).
  void dropBefore(const std::string& path) { readers_.erase(readers_.begin(), first(path)); }
  void clear() { readers_.clear(); }
  size_t size() const { return readers_.size(); }

 private:
  // A reader per file and resolution read (level, resampling factor), sorted by path first.
  using Key = std::tuple<std::string, int, double>;
  using Readers = std::map<Key, std::shared_ptr<ImageReader>>;
  size_t capacity_;
  Readers readers_;

  // The first reader of `path` or of a later path ("path\0" follows every resolution of path).
  Readers::iterator first(const std::string& path) {
    return readers_.lower_bound(
        Key{path, std::numeric_limits<int>::min(), -std::numeric_limits<double>::infinity()});
  }
};

// One step's batch as this rank read it. Tensors are owned CPU tensors.
struct WindowBatch {
  torch::Tensor pixels;  // [B,C,H,W] raw sample values: uint8 or float32
  torch::Tensor scales;  // float32 [B]
  // LoaderOptions::affine: float32 [B, 2, C], each slot's image's CatalogImage::input_affine (gains, then
  // offsets); else undefined.
  torch::Tensor affine;
  StepSlots slots;                                    // [B]: the window each slot holds and its fate
  std::vector<std::pair<int, std::string>> failures;  // (image id, message) found while reading
  std::exception_ptr first_error;     // the first failed slot's exception as thrown (training rethrows it)
  std::vector<torch::Tensor> labels;  // LoaderOptions::make_labels's, filled by read_labels
  int64_t valid = 0;                  // slots with kOk
  double read_seconds = 0;
};

struct LoaderOptions {
  int64_t batch_size = 8;
  int input_channels = 3;
  PadMode pad = PadMode::kConstant;
  double cval = 0.0;
  size_t depth = 2;      // batches read ahead
  int read_threads = 1;  // threads reading one batch's windows (the read-ahead thread and helpers)
  bool pinned = false;   // page-locked pixels, for asynchronous copies to a GPU
  bool bytes = false;    // uint8 pixels (inputAsBytes of the catalog), else float32
  bool affine = false;   // WindowBatch::affine from each image's input_affine (a card's preprocessing)
  // The model's device, made current on the read-ahead thread (pinned buffers belong to its context).
  torch::Device device = torch::kCPU;
  // Called before each window is read, with its file, in slot order on the read-ahead thread; what it
  // throws fails that window's image (the job installs TILER_FAULT's read hook here).
  std::function<void(const std::string& input)> before_read;
  // Training: labels read beside the pixels, so that one loader serves infer and finetune. make_labels(B)
  // makes a batch's label tensors (owned CPU tensors, slot j at index j of each); read_labels(labels, j,
  // image id, grid window) fills slot j's after its pixels, on the thread that read them (what it throws
  // fails the window as a read error does). Unset: no labels.
  std::function<std::vector<torch::Tensor>(int64_t batch_size)> make_labels;
  std::function<void(std::vector<torch::Tensor>& labels, int64_t slot, int image_id, int64_t local)>
      read_labels;
  // The shard walks the global order (inference), so a batch closes the readers of the images before its
  // first; a shuffled shard (training) keeps them, up to the cache's capacity.
  bool in_order = true;
};

// Reads this rank's shard (`slots`, `steps` batches of batch_size) of `catalog`, ahead of the consumer.
class WindowLoader {
 public:
  // `catalog` must outlive the loader; its images' inputs, grids and adaptations are only read.
  WindowLoader(const WindowCatalog& catalog, GridSpec spec, LoaderOptions options,
               std::vector<SampleSlot> slots, int64_t steps);
  // The next step's batch; rethrows a failure of the loader itself; nullopt after stop().
  std::optional<WindowBatch> next() { return ahead_->next(); }
  // No window of `image_id` is read from now on (its slots become kSkipped). Thread safe.
  void skipImage(int image_id);
  void stop() {
    stopping_ = true;
    ahead_->stop();
  }

 private:
  WindowBatch assemble(int64_t step);
  bool skipped(int image_id);
  // The reader of slot j's window, or the exception that stops it (opening it, the before_read hook).
  struct SlotRead {
    int image_id = -1;
    int64_t local = 0;
    std::shared_ptr<ImageReader> reader;
    std::exception_ptr error;
  };
  // assemble's passes over a batch's slots: which to read and with which reader (serial, in slot order, as
  // before_read counts them), their pixels (in parallel, each into its own slot), each slot's status (serial:
  // an image's first failure fails it, its later slots are skipped).
  std::vector<std::optional<SlotRead>> planReads(int64_t step, WindowBatch& batch);
  void readPixels(std::vector<std::optional<SlotRead>>& reads, WindowBatch& batch);
  void settleSlots(std::vector<std::optional<SlotRead>>& reads, WindowBatch& batch);

  const WindowCatalog& catalog_;
  GridSpec spec_;
  LoaderOptions options_;
  std::vector<SampleSlot> slots_;
  ReaderCache readers_{8};  // loader thread only
  ParallelFor reads_;       // the loader thread and its helpers
  std::atomic<bool> stopping_{false};
  std::mutex skip_mutex_;
  std::set<int> skip_;
  std::set<int> marked_;  // images whose reading mark this rank made (the read-ahead thread's alone)
  std::unique_ptr<ReadAhead<WindowBatch>> ahead_;  // last: its thread uses the members above
};

}  // namespace tiler
