#include "tiler/core/output_kinds.hpp"

#include <algorithm>

#include "tiler/core/error.hpp"

namespace tiler {

namespace {
constexpr ModelTask kTasks[] = {ModelTask::kSegment, ModelTask::kEmbed, ModelTask::kClassify,
                                ModelTask::kDetect, ModelTask::kInstances};
}  // namespace

ModelTask parseTask(const std::string& name) {
  if (name == "auto") return ModelTask::kAuto;
  for (ModelTask task : kTasks)
    if (name == taskName(task)) return task;
  TILER_THROW(ConfigError,
              "--task must be auto, segment, classify, embed, detect or instances; got '" << name << "'");
}

const char* taskName(ModelTask task) {
  switch (task) {
    case ModelTask::kSegment:
      return "segment";
    case ModelTask::kClassify:
      return "classify";
    case ModelTask::kEmbed:
      return "embed";
    case ModelTask::kDetect:
      return "detect";
    case ModelTask::kInstances:
      return "instances";
    case ModelTask::kAuto:
      break;
  }
  return "auto";
}

const std::vector<OutputKind>& outputKinds() {
  using T = ModelTask;
  static const std::vector<OutputKind> kinds = {
      {"labels", {T::kSegment}, "{stem}_labels.{format}", false, "", {T::kSegment}, {}, true},
      {"probs", {T::kSegment}, "{stem}_probs.tif", false, "", {}, {}, true},
      // Traced from a scratch labels TIFF of its own when labels are not saved.
      {"polygons", {T::kSegment}, "{stem}_polygons.geojson", false, "gdal", {}, {".labels.tif"}, true},
      {"zarr", {T::kSegment}, "{stem}.ome.zarr", true, "", {}},
      {"features", {T::kEmbed}, "{stem}.h5", false, "hdf5", {T::kEmbed}},
      // The rows go to a scratch file until the archive is written.
      {"features_pt", {T::kEmbed}, "{stem}.pt", false, "", {}, {".rows"}},
      {"csv", {T::kClassify}, "{stem}.csv", false, "", {T::kClassify}},
      {"tiles", {T::kClassify}, "{stem}_tiles.geojson", false, "", {T::kClassify}},
      {"heatmap", {T::kClassify}, "{stem}_heatmap.tif", false, "", {}},
      {"objects",
       {T::kDetect, T::kInstances},
       "{stem}_objects.geojson",
       false,
       "",
       {T::kDetect, T::kInstances}},
      {"objects_csv", {T::kDetect, T::kInstances}, "{stem}_objects.csv", false, "", {}},
      {"coco", {T::kDetect}, "{stem}_coco.json", false, "", {}},
      {"instances", {T::kInstances}, "{stem}_instances.tif", false, "", {}, {}, true},
  };
  return kinds;
}

const OutputKind* findOutputKind(const std::string& name) {
  const std::string bare = name.substr(name.find('/') + 1);  // a head's kind is its kind's row
  for (const OutputKind& kind : outputKinds())
    if (bare == kind.name) return &kind;
  return nullptr;
}

std::string headKind(const std::string& head, const std::string& kind) {
  return head.empty() ? kind : head + "/" + kind;
}

namespace {
bool has(const std::vector<ModelTask>& tasks, ModelTask task) {
  return std::find(tasks.begin(), tasks.end(), task) != tasks.end();
}
}  // namespace

std::vector<std::string> outputKindsOf(ModelTask task) {
  std::vector<std::string> names;
  for (const OutputKind& kind : outputKinds())
    if (has(kind.tasks, task)) names.push_back(kind.name);
  return names;
}

std::vector<std::string> defaultOutputKinds(ModelTask task) {
  std::vector<std::string> names;
  for (const OutputKind& kind : outputKinds())
    if (has(kind.default_for, task)) names.push_back(kind.name);
  return names;
}

bool taskWrites(ModelTask task, const std::string& kind) {
  const OutputKind* row = findOutputKind(kind);
  return row != nullptr && has(row->tasks, task);
}

ModelTask taskOfOutputKind(const std::string& kind) {
  const OutputKind* row = findOutputKind(kind);
  return row != nullptr ? row->tasks.front() : ModelTask::kAuto;
}

std::string outputFileName(const std::string& kind, const std::string& stem, const std::string& format) {
  const OutputKind* row = findOutputKind(kind);
  TILER_CHECK(row != nullptr, ConfigError, "no output kind '" << kind << "'");
  std::string name = row->pattern;
  const size_t slash = kind.find('/');
  const std::string named = slash == std::string::npos ? stem : stem + "_" + kind.substr(0, slash);
  const std::pair<std::string, std::string> fields[] = {{"{stem}", named}, {"{format}", format}};
  for (const auto& [key, value] : fields) {
    const size_t at = name.find(key);
    if (at != std::string::npos) name.replace(at, key.size(), value);
  }
  return name;
}

std::vector<std::string> partialPaths(const OutputKind& kind, const std::string& path) {
  std::vector<std::string> bases = {path};
  for (const char* suffix : kind.scratch) bases.push_back(path + suffix);
  std::vector<std::string> paths;
  for (const std::string& base : bases) {
    paths.push_back(base + ".partial");
    for (int level = 1; kind.tiff_levels && level <= kMaxTiffLevels; ++level)
      paths.push_back(base + ".level" + std::to_string(level) + ".partial");
  }
  return paths;
}

namespace {
// "a, b and c", or with `separator` ", " throughout: "a, b, c".
std::string listed(const std::vector<std::string>& names, const char* last_separator) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += names[i] + (i + 2 < names.size() ? ", " : i + 1 < names.size() ? last_separator : "");
  return text;
}
}  // namespace

std::string saveKindsText() {
  std::string text;
  for (size_t t = 0; t < std::size(kTasks); ++t) {
    text += listed(outputKindsOf(kTasks[t]), " and ") + " (" + taskName(kTasks[t]) + ")";
    text += t + 2 < std::size(kTasks) ? ", " : t + 1 < std::size(kTasks) ? ", or " : "";
  }
  return text;
}

std::string saveHelpText() {
  std::string text = "comma-separated: ";
  for (size_t t = 0; t < std::size(kTasks); ++t) {
    text += listed(outputKindsOf(kTasks[t]), ", ") + " (" + taskName(kTasks[t]) + "; default " +
            listed(defaultOutputKinds(kTasks[t]), ",") + ")";
    if (t + 1 < std::size(kTasks)) text += ", ";
  }
  return text;
}

}  // namespace tiler
