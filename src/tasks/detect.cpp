// tasks/detect: the task detect: N boxes a window, [N, 6] (x1, y1, x2, y2, score, class in window pixels),
// kept by the window whose core holds their centre where they ran and sent to the owner as records
// (window_outputs: objects, objects_csv, coco).
#include "tiler/tasks/task.hpp"

#include "tiler/core/error.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {

const Task& detectTask();

namespace {

struct DetectSettings : TaskSettings {
  // A kept box that a box of its class overlapping it by more than this IoU outscores is dropped (0: none).
  double nms = 0.0;
  std::pair<std::string, std::string> elsewhere() const override {
    if (nms == 0) return {};
    return {"--nms", "boxes"};
  }
};

class DetectTask : public Task {
 public:
  const char* name() const override { return "detect"; }
  std::vector<Consumes> produces() const override {
    return {Consumes::kBoxes, Consumes::kObjects, Consumes::kStoredObjects};
  }
  std::vector<std::string> defaultKinds() const override { return {"objects"}; }
  std::string refuses(const std::vector<int64_t>& sizes) const override {
    if (sizes.size() == 3 && sizes[2] == 6) return "";
    return "--task detect needs boxes [batch, N, 6] (x1, y1, x2, y2, score, class in window pixels), but the "
           "output is " +
           c10::str(torch::IntArrayRef(sizes));
  }
  // No output shape says "boxes" for sure: --task or --save says it.
  bool claimedByShape() const override { return false; }
  std::string shapeWords() const override { return "boxes, [batch, N, 6] (--task detect)"; }
  bool perWindow() const override { return true; }
  bool givesBoxes() const override { return true; }
  bool sendsRecords() const override { return true; }
  // The boxes a window keeps, found where it ran.
  RecordMaker recordMaker(const TaskOutputs& outputs) const override {
    return [options = boxOptions(outputs)](const CatalogImage& image, int64_t window,
                                           const torch::Tensor& boxes) {
      return detectionRecord(image, options, window, boxes.data_ptr<float>());
    };
  }
  std::unique_ptr<ImageConsumer> makeConsumer(CatalogImage& image, const TaskOutputs& outputs,
                                              const WriterOptions&) const override {
    return windowOutputsConsumer(image, boxOptions(outputs));
  }
  std::vector<TaskFlag> flags() const override {
    return {{"nms",
             "detect: drop a box that a box of its class overlapping it by more than this IoU outscores "
             "(0: none; the window cores alone keep each box once)",
             "0", /*show_default=*/true, TaskFlag::Check::kNumber}};
  }
  std::shared_ptr<const TaskSettings> parseSettings(const FlagValues& values,
                                                    const TaskFlags&) const override {
    auto s = std::make_shared<DetectSettings>();
    s->nms = numberFlag("--nms", flagValue(values, "nms"));
    return s;
  }

 protected:
  static WindowOutputOptions boxOptions(const TaskOutputs& outputs) {
    WindowOutputOptions options = windowOutputOptions(outputs);
    options.boxes = true;
    options.nms_iou = settingsOf<DetectSettings>(detectTask(), outputs.flags).nms;
    return options;
  }
  void checkFlags(const ModelProbe&, const TaskFlags& flags, GridSpec& spec) const override {
    // Boxes are in the window's pixels: a flip or turn of the window would move them, and averaging the
    // records of views would mix different boxes.
    TILER_CHECK(flags.tta == Tta::kNone, ConfigError,
                "--tta is for maps and vectors, not --task detect's boxes");
    const double nms = settingsOf<DetectSettings>(*this, flags).nms;
    TILER_CHECK(nms >= 0 && nms < 1, ConfigError, "--nms is an IoU in [0, 1) (0: none), not " << nms);
    TILER_CHECK(flags.activation == Activation::kNone, ConfigError,
                "--activation " << flags.activation_name << " is for maps and vectors; --task detect reads "
                                << "scores as the model gives them");
    // The cores of overlapping windows decide which window keeps an object: the overlap stays as asked
    // (--overlap, default 0.25), and the last window of a row or column is padded past the edge.
    spec.lattice = flags.edge != "shift";
  }
};

}  // namespace

const Task& detectTask() {
  static const DetectTask task;
  return task;
}

}  // namespace tiler
