// tasks/classify: the task classify: one vector of K class scores a window (window_outputs: csv, tiles,
// heatmap).
#include "tiler/tasks/task.hpp"

#include <algorithm>

#include "tiler/core/error.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {
namespace {

struct ClassifySettings : TaskSettings {
  bool wsinfer_layout = false;  // --wsinfer_layout
  std::pair<std::string, std::string> elsewhere() const override {
    if (wsinfer_layout) return {"--wsinfer_layout", "class scores in WSInfer's files"};
    return {};
  }
};

class ClassifyTask : public VectorTask {
 public:
  const char* name() const override { return "classify"; }
  std::vector<Consumes> produces() const override {
    return {Consumes::kWindowScores, Consumes::kStoredObjects};
  }
  std::vector<std::string> defaultKinds() const override { return {"csv", "tiles"}; }
  std::vector<TaskFlag> flags() const override {
    return {{"wsinfer_layout",
             "classify: csv and tiles as WSInfer writes them, for the tools that read its results "
             "directory: model-outputs-csv/<stem>.csv (windows column by column) and "
             "model-outputs-geojson/<stem>.geojson (--save wsinfer_csv,wsinfer_geojson)",
             "false", /*show_default=*/false, TaskFlag::Check::kSwitch}};
  }
  std::shared_ptr<const TaskSettings> parseSettings(const FlagValues& values,
                                                    const TaskFlags&) const override {
    auto s = std::make_shared<ClassifySettings>();
    const std::string layout = flagValue(values, "wsinfer_layout");
    TILER_CHECK(layout == "true" || layout == "false", ConfigError,
                "--wsinfer_layout is a switch (true or false in --config); got '" << layout << "'");
    s->wsinfer_layout = layout == "true";
    return s;
  }
  // WSInfer's files in place of tiler's own, where the layout asks for them.
  std::vector<std::string> settledKinds(const TaskFlags& flags) const override {
    if (!settingsOf<ClassifySettings>(*this, flags).wsinfer_layout) return flags.kinds;
    std::vector<std::string> kinds;
    for (const std::string& kind : flags.kinds) {
      const std::string settled = kind == "csv" ? "wsinfer_csv" : kind == "tiles" ? "wsinfer_geojson" : kind;
      if (std::find(kinds.begin(), kinds.end(), settled) == kinds.end()) kinds.push_back(settled);
    }
    return kinds;
  }
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
