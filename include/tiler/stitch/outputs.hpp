// outputs: the image outputs a rank owns (assignOwners). A thread of its own takes each step's predictions
// for them, stitches them per image (blend) in global window order and streams finished bands to the image's
// writers, whose tiles a pool of write_threads compresses.
// What takes an image's windows is its task's consumer (tasks/: an ImageConsumer made by
// OutputOptions::consumer): the stage knows only that interface.
// Promise: an image's outputs (every kind of every task: Task::outputKinds) are written as
// .partial files and renamed together, only once every one of them is closed (two-phase commit): a failed
// image never leaves a file under a final name. Any exception while stitching or writing one image fails that
// image (catalog status "error" with a message naming the file) and the stage goes on; with abort_on_error
// the first failed image stops the stage. A stopped stage refuses submit() at once, so its producer never
// blocks on it. The stage alone writes image statuses while it runs; read them after finish().
#pragma once

#include <torch/types.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/queue.hpp"
#include "tiler/core/slots.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/writers/blend.hpp"
#include "tiler/writers/instances.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {

// One window's result as its image's owner receives it: the model's prediction (on the host, or on
// OutputOptions::stitch_device), or the record its rank made of it (object tasks).
struct WindowResult {
  int64_t window = 0;                   // grid window of the image
  const float* values = nullptr;        // on the host: the window's prediction, as the model gave it
  torch::Tensor on_device;              // or on the stitch device: [C, h, w]
  const std::string* record = nullptr;  // or its record
};

// What takes an image's window results (MONAI's Merger: aggregate, finalize). Not thread safe: one thread at
// a time, the output stage's, but for a job with several heads, whose consumers aggregate at once, each on a
// thread (they share no state but the stage's thread-safe compression pool; each head writes into its own
// view of the image, added to the image in finalize, which the stage's thread calls).
class ImageConsumer {
 public:
  virtual ~ImageConsumer() = default;
  // A step's windows of the image, in window order, each once (a stitcher accumulates a grid row's
  // together).
  virtual void aggregate(const std::vector<WindowResult>& windows) = 0;
  // Every planned window aggregated (true at once for an image without any).
  virtual bool done() const = 0;
  // Closes every file under its partial name (throws IoError; nothing is renamed then), then renames them
  // all, or none; counts what the image's report holds (non-finite values, objects). Returns the paths.
  virtual std::vector<std::string> finalize() = 0;
  // TILER_FAULT's write failure: true when the consumer's tiles now fail as they are compressed, or its
  // objects store as on a full disk; false when it has neither (the stage fails the image itself).
  virtual bool injectTileFault() { return false; }
};

// Makes an image's consumer with its partial files; `writer` holds the stage's TIFF options (pool,
// compression, metadata).
using ConsumerFactory = std::function<std::unique_ptr<ImageConsumer>(CatalogImage&, const WriterOptions&)>;

// A share of every window's prediction and the consumer of it.
struct OutputPart {
  ConsumerFactory consumer;
  int64_t offset = 0;                   // where its values start in a window's prediction
  std::vector<int64_t> window_sizes{};  // its shape for one window ([C, h, w] or [D]); empty: the whole of it
};

// The stage's own settings: what every image's writers share (compression, pyramid, the pool), where it
// stitches, which images it writes and what takes their windows. What a task's outputs are made of is its
// own (tasks/: each task's settings, in its consumer).
struct OutputOptions {
  std::optional<Compression> compression;  // unset: defaultCompression of each output's sample type
  Scale scale;                             // output size / input size
  bool abort_on_error = false;
  size_t depth = 2;       // steps queued ahead of the stitcher
  bool pyramid = false;   // reduced-resolution pages in the TIFF outputs
  int write_threads = 1;  // the pool compressing every output's tiles
  // The images this stage writes: those whose owners[i] is `rank` (every image when owners is empty).
  std::vector<int> owners;
  int rank = 0;
  // What takes each image's windows: one part (the task's consumer: tasks/registry's consumersFor), or a
  // part per head of a model with several outputs, each its share of a window's prediction.
  std::vector<OutputPart> parts;
  // segment: blend on this device (device_stitch; the steps' predictions are there), an image whose
  // accumulator the device cannot hold on the host; unset: on the host.
  std::optional<torch::Device> stitch_device;
  // Before each image's device stitcher is made (the job installs TILER_FAULT's oom, stage stitch, here).
  std::function<void()> before_device_stitcher;
  // Called for each window stitched, in the stage's order: when it returns true, the tiles of that window's
  // image throw as they are compressed (the job installs TILER_FAULT's write hook here).
  std::function<bool()> stitched_window;
};

// What one stage wrote, for the report.
struct OutputStats {
  double write_seconds = 0;   // the stage thread's busy time: stitching, handing tiles over, committing
  int64_t bytes_written = 0;  // files committed under their final names
  int64_t images_owned = 0;
};

// One step's slots for this rank's images, as it gathered them from every rank.
struct StepResult {
  // float32 [slots, C, h, w] (per window: [slots, D]; several heads: [slots, every head's values side by
  // side], OutputOptions::parts), contiguous (undefined: no slots); on the CPU, or on
  // OutputOptions::stitch_device.
  torch::Tensor preds;
  StepSlots slots;                      // [slots]: what each slot of preds (or records) holds
  std::vector<std::string> records;     // instances: each slot's record (preds undefined)
  std::map<int, std::string> failures;  // images failed elsewhere this step: id -> message
};

class OutputStage {
 public:
  // `catalog` must outlive the stage; the stage sets its images' status and error.
  OutputStage(WindowCatalog& catalog, OutputOptions options);
  ~OutputStage();
  OutputStage(const OutputStage&) = delete;
  OutputStage& operator=(const OutputStage&) = delete;

  // Queues a step; false once the stage has stopped (see error()).
  bool submit(StepResult step);
  // Why the stage stopped early (abort on a failed image, or an error of its own); nullopt while fine.
  std::optional<std::string> error();
  // Drains the queue and joins; images still open are failed and their partial files removed.
  void finish();
  // After finish(): what the stage wrote, and its images' results ([{id, status, error, non_finite}]) for
  // rank 0's report.
  const OutputStats& stats() const { return stats_; }
  std::string ownedResults() const;
  // Applies another rank's ownedResults() to the catalog.
  static void applyResults(WindowCatalog& catalog, const std::string& results);

 private:
  void loop();
  // A slot of the step to stitch, located once in the catalog.
  struct LocatedSlot {
    int64_t slot = 0;    // index into the step's slots and predictions
    int64_t global = 0;  // its global window
    int image = 0;       // catalog image id
    int64_t window = 0;  // grid window of that image
  };
  void stitchStep(StepResult& step);
  // Slots located[first..last) of the step (one image's, in window order) into that image's outputs; a
  // failure fails the image.
  void stitchImageWindows(const StepResult& step, const std::vector<LocatedSlot>& located, size_t first,
                          size_t last, const float* base, int64_t per_window);
  // Each consumer's share of a step's windows of one image (consumers[p] takes windows[p]), the consumers at
  // once; rethrows the first failure once all have returned.
  static void aggregateAll(std::vector<std::unique_ptr<ImageConsumer>>& consumers,
                           const std::vector<std::vector<WindowResult>>& windows);
  // The image's consumer of window results, created with its partial files at its first window.
  std::vector<std::unique_ptr<ImageConsumer>>& outputsFor(int image_id);
  void finishImage(int image_id, const std::string& error);
  bool owns(int image_id) const {
    return options_.owners.empty() || options_.owners[size_t(image_id)] == options_.rank;
  }

  WindowCatalog& catalog_;
  OutputOptions options_;
  std::shared_ptr<WorkPool> pool_;  // compresses the tiles of every writer of the stage
  BoundedQueue<StepResult> steps_;
  std::map<int, std::vector<std::unique_ptr<ImageConsumer>>>
      open_;           // a consumer a part  // stage thread only
  OutputStats stats_;  // stage thread only, until finish() joined it
  std::mutex error_mutex_;
  std::optional<std::string> error_;  // guarded by error_mutex_
  std::thread thread_;                // last: starts once the members above exist
};

}  // namespace tiler
