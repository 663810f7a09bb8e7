// tasks/regress: the task regress: dense regression maps (HoVerNet's horizontal and vertical distances,
// distance, density or depth maps), a map a window (NCHW) stitched and blended as segment's maps are and
// written as their values: --save probs (float32 by default, f16 allowed) and zarr. No labels and no
// polygons (a value is no class), no activation (the map is taken as the model gave it), and --task auto
// never picks it: only --task regress or a head's NAME:regress.
#include "tiler/core/error.hpp"
#include "tiler/tasks/task.hpp"

namespace tiler {

const Task& segmentTask();  // its maps are stitched and written as segment's

namespace {

class RegressTask : public Task {
 public:
  const char* name() const override { return "regress"; }
  std::vector<Consumes> produces() const override { return {Consumes::kMapValues}; }
  std::vector<std::string> defaultKinds() const override { return {"probs"}; }
  std::string refuses(const std::vector<int64_t>& sizes) const override {
    if (sizes.size() == 4) return "";
    return "--task regress needs NCHW maps, but the output " + c10::str(torch::IntArrayRef(sizes)) +
           " is not one";
  }
  // A map's shape says segment; that its values are regressions only --task or --heads says.
  bool claimedByShape() const override { return false; }
  std::string shapeWords() const override { return "regression maps, NCHW (--task regress)"; }
  bool stitches() const override { return true; }
  // Stitched and written by segment's consumer, with segment's settings (its flags are segment's): its probs
  // and zarr writers take the values as they are.
  std::unique_ptr<ImageConsumer> makeConsumer(CatalogImage& image, const TaskOutputs& outputs,
                                              const WriterOptions& writer) const override {
    return segmentTask().makeConsumer(image, outputs, writer);
  }

 protected:
  void checkFlags(const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec) const override {
    TILER_CHECK(flags.activation == Activation::kNone, ConfigError,
                "--activation " << flags.activation_name << " is for class scores; --task regress takes a "
                                << "regression map as the model gave it");
    TILER_CHECK(settingsOf<SegmentSettings>(segmentTask(), flags).map.probs_type != SampleType::kU8,
                ConfigError,
                "--probs_dtype u8 stores values in [0, 1] as round(v x 255), but --task regress's values are "
                "not in [0, 1]: save f32 or f16");
    TILER_CHECK(flags.classes.empty(), ConfigError,
                "--classes names classes, but --task regress's maps are values: they have none");
    // The rest as segment's maps (MONAI's grid).
    segmentTask().settle(probe, flags, spec);
  }
};

}  // namespace

const Task& regressTask() {
  static const RegressTask task;
  return task;
}

}  // namespace tiler
