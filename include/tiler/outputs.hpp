// outputs: image outputs on rank 0. A thread of its own takes each step's gathered predictions, stitches
// them per image (blend) in global window order and streams finished bands to the image's writers.
// Promise: an image's outputs (labels, probs, polygons) are written as .partial files and renamed together,
// only once every one of them is closed (two-phase commit): a failed image never leaves a file under a final
// name. Any exception while stitching or writing one image fails that image (catalog status "error" with a
// message naming the file) and the stage goes on; with abort_on_error the first failed image stops the
// stage. A stopped stage refuses submit() at once, so its producer never blocks on it. The stage alone
// writes image statuses while it runs; read them after finish().
#pragma once

#include <torch/types.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tiler/blend.hpp"
#include "tiler/catalog.hpp"
#include "tiler/image_io.hpp"
#include "tiler/loader.hpp"
#include "tiler/polygons.hpp"

namespace tiler {

struct OutputOptions {
  std::string format = "tif";  // labels: tif | png; probs are always tif
  Compression compression = Compression::kDeflate;
  bool save_labels = true, save_probs = false;
  int classes = 2;  // the model's output channels
  Scale scale;      // output size / input size
  StitchOptions stitch;
  float label_threshold = 0.f;  // one-channel models: 0 for logits, 0.5 for sigmoid probabilities
  bool abort_on_error = false;
  size_t depth = 2;                      // steps queued ahead of the stitcher
  bool pyramid = false;                  // reduced-resolution pages in the TIFF outputs
  bool save_polygons = false;            // <stem>_polygons.geojson from the labels
  double simplify = 0.0;                 // polygon simplification tolerance, input pixels
  std::vector<ClassInfo> classes_named;  // --classes: names and colours of classes 0..K-1
  // Probabilities as stored: f32; f16 (IEEE half); u8 = round(p x 255), clamped to [0, 1] first.
  SampleType probs_type = SampleType::kF32;
  int write_threads = 1;  // the pool compressing every output's tiles
};

// --probs_dtype: f32 | f16 | u8.
SampleType parseProbsType(const std::string& name);

// One step of every rank's slots, as rank 0 gathered them.
struct StepResult {
  torch::Tensor preds;                  // float32 [slots, C, h, w], CPU, contiguous
  torch::Tensor meta;                   // int64 [slots, 2]: global window, SlotStatus
  std::map<int, std::string> failures;  // images failed elsewhere this step: id -> message
  int write_fault_image = -1;           // TILER_FAULT stage write: this image's writes throw
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

 private:
  struct ImageOutputs {
    std::unique_ptr<ImageWriter> labels, probs;
    std::unique_ptr<Stitcher> stitcher;
    std::string polygons;                       // final path of the GeoJSON, when asked
    double input_pixels_per_label_pixel = 1.0;  // level-0 input pixels per output pixel (polygons)
    bool keep_labels = true;                    // false: the labels only feed the polygons
  };
  void loop();
  void stitchStep(StepResult& step);
  ImageOutputs& outputsFor(int image_id);
  void finishImage(int image_id, const std::string& error);
  void commit(ImageOutputs& out);
  int labelClasses() const { return labelClassCount(options_.classes); }

  WindowCatalog& catalog_;
  OutputOptions options_;
  std::shared_ptr<WorkPool> pool_;  // compresses the tiles of every writer of the stage
  BoundedQueue<StepResult> steps_;
  std::map<int, ImageOutputs> open_;  // stage thread only
  std::set<int> write_faults_;        // stage thread only
  std::mutex error_mutex_;
  std::optional<std::string> error_;  // guarded by error_mutex_
  std::thread thread_;                // last: starts once the members above exist
};

}  // namespace tiler
