// tasks/classify: the task classify: one vector of K class scores a window (window_outputs: csv, tiles,
// heatmap).
#include "tiler/tasks/task.hpp"

#include "tiler/core/error.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {
namespace {

class ClassifyTask : public VectorTask {
 public:
  const char* name() const override { return "classify"; }
  std::vector<Consumes> produces() const override { return {Consumes::kWindowScores}; }
  std::vector<std::string> defaultKinds() const override { return {"csv", "tiles"}; }
  bool classScores() const override { return true; }
  // Activated outputs and named classes are class scores.
  bool claims(const std::vector<int64_t>& sizes, bool activated, bool classes_named) const override {
    return sizes.size() == 2 && (activated || classes_named);
  }

 protected:
  void checkFlags(const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec) const override {
    const auto& classes = flags.classes;
    TILER_CHECK(classes.empty() || int64_t(classes.size()) == probe.output_channels, ConfigError,
                "--classes names " << classes.size() << " class(es), the model gives "
                                   << probe.output_channels << " scores per window");
    const bool heatmap = std::find(flags.kinds.begin(), flags.kinds.end(), "heatmap") != flags.kinds.end();
    TILER_CHECK(!heatmap || probe.output_channels <= kHeatmapMaxClasses, ConfigError,
                "--save heatmap holds at most " << kHeatmapMaxClasses << " classes (a band each), but '"
                                                << flags.model << "' gives " << probe.output_channels
                                                << " scores per window (save csv or tiles)");
    settlePatchLattice(flags, spec);
  }
};

}  // namespace

const Task& classifyTask() {
  static const ClassifyTask task;
  return task;
}

}  // namespace tiler
