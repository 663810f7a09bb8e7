// tasks/task: what a model's output is for (segment, classify, embed, detect, instances) behind one
// interface, so that the job, the model and the output stage ask a task instead of naming it. A task says
// which model outputs it accepts (their shape), declares the flags it owns and parses them into settings of
// its own type, checks the flags against the model, gives a window's prediction size and type, what a window
// sends its image's owner (the prediction itself, or a record its rank makes) and makes the consumer that
// writes an image's outputs (the writers/formats rows that consume what it produces) with its settings.
// Promise: tasks are constant rows (tasks/registry), read from any thread; nothing outside a task's file
// knows its consumer's or its settings' type (but segment's, whose maps regress writes too). Adding a task
// is one file here plus one registry row; adding a task's flag is an edit of its file.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/grid.hpp"
#include "tiler/core/processing.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/io/polygons.hpp"
#include "tiler/model/probe.hpp"
#include "tiler/stitch/outputs.hpp"
#include "tiler/writers/formats.hpp"
#include "tiler/writers/map_writers.hpp"

namespace tiler {

// A flag a task owns (tiler infer's --NAME): the command line registers it from the registry
// (taskFlagDeclarations), its value reaches the task as given (FlagValues) and the task parses it into its
// settings (Task::parseSettings).
struct TaskFlag {
  // What the command line checks of it; kSwitch: a flag without a value ("true" when given, else "false").
  enum class Check { kNone, kNumber, kPositive, kNonNegative, kSwitch };
  const char* name;           // "nms": --nms, and a head's --head_opt KEY when `head`
  const char* help;           // --help's words
  const char* default_value;  // its value when not given
  bool show_default = false;  // --help shows the default
  Check check = Check::kNone;
  bool head = false;  // a head may set it for itself (--head_opt NAME.KEY=VALUE)
  bool map = false;   // it shapes a stitched map (a task that stitches none may refuse it given)
};

// Task flags' values by name, as given (a flag not here has its default).
using FlagValues = std::map<std::string, std::string>;

// A task's own flags parsed and checked (each task's own type); a flag of its set other than its default
// that the other tasks refuse says so (elsewhere()).
class TaskSettings {
 public:
  virtual ~TaskSettings() = default;
  // Its flag, given, that another task refuses ("--nms") and what it is for ("boxes"); empty: none.
  virtual std::pair<std::string, std::string> elsewhere() const { return {}; }
};

class Task;
// Every task's settings for one output (or head), in the registry's order: the task the model settles reads
// its own (settingsOf), and a task whose consumer is another's (regress: segment's) reads that one's.
using TaskSettingsList = std::vector<std::pair<const Task*, std::shared_ptr<const TaskSettings>>>;

// The job's flags every task reads, and each task's own settings; what a task checks and its outputs are
// made from.
struct TaskFlags {
  std::string model;                // the model's path, for messages
  std::optional<std::string> save;  // --save as given
  std::vector<std::string> kinds;   // the output kinds written (--save, or the task's defaults)
  std::string edge = "auto";        // --edge
  bool overlap_given = false;       // --overlap was given
  int64_t halo = 0;                 // --halo: output px of a window's edge not blended where windows meet
  // A card's postprocessing from its first statistics step on (splitAtStatistics' rest): applied to the
  // blended map of each image, over its statistics, before the map's writers see it. Empty: none.
  std::vector<ProcessingStep> blended_steps;
  Tta tta = Tta::kNone;
  Activation activation = Activation::kNone;
  std::string activation_name = "none";  // --activation as given
  std::vector<ClassInfo> classes;        // --classes
  std::string format = "tif";            // --format: a map's labels file
  // Flags that shape a stitched map, given other than their default ("--blend", "--format", ...).
  std::vector<std::string> map_flags;
  // A head of a model with several outputs: its outputs are the image's kinds headKind(head, kind).
  std::string head;
  TaskSettingsList settings;  // each task's, parsed from its flags (parseTaskSettings)
};

// Everything an image's consumer is made from: the stage's options (maps), the model's output and the grid
// as the task settled them, and the flags.
struct TaskOutputs {
  OutputOptions stage;
  ModelProbe probe;
  GridSpec spec;
  TaskFlags flags;
};

// What a window sends its image's owner in place of its prediction (object tasks): `output` is the window's
// prediction on the CPU (predictionType()).
using RecordMaker =
    std::function<std::string(const CatalogImage& image, int64_t window, const torch::Tensor& output)>;

// The most channels a stitched map may have (OpenCV's CV_CN_MAX: its pixels pass through cv::Mat).
constexpr int64_t kMaxMapChannels = 512;

class Task {
 public:
  virtual ~Task() = default;
  // Its --task word, which is who it is: the job, the model and the report hold the row, not a word.
  virtual const char* name() const = 0;
  // A model output of `sizes` (one window's, batch first) named by --task: "" when this task takes it,
  // else why not (the model's path and the shape are added by the registry).
  virtual std::string refuses(const std::vector<int64_t>& sizes) const = 0;
  // Whether --task auto takes a model output of `sizes` for this task (the registry asks in its order):
  // `activated` (--activation softmax or sigmoid) or `classes_named` (--classes) say class scores.
  virtual bool claims(const std::vector<int64_t>& /*sizes*/, bool /*activated*/,
                      bool /*classes_named*/) const {
    return false;
  }
  // Whether an output's shape can say this task (false: only --task or the --save kinds asked for say it).
  virtual bool claimedByShape() const { return true; }
  // The shape it takes, for the registry's list of choices: "NCHW maps (--task segment)".
  virtual std::string shapeWords() const = 0;
  // A fixed-size record (a vector, boxes) a window instead of a map.
  virtual bool perWindow() const { return false; }
  // A window's output is N boxes of 6 values ([batch, N, 6], N the same for every window, maybe 0).
  virtual bool givesBoxes() const { return false; }
  // Maps blended into one map per image (the stitcher; on the model's device with --stitch).
  virtual bool stitches() const { return false; }
  // The prediction's type: float32, but float64 for instance maps (ids past 2^24).
  virtual torch::ScalarType predictionType() const { return torch::kFloat32; }
  // Checks the flags against the model's output (ConfigError naming them), and settles the grid (overlap,
  // lattice) for this task's outputs; the kinds asked for are the registry's to check (settleTask).
  void settle(const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec) const;
  // A forward's output for `windows` windows.
  std::vector<int64_t> predictionSizes(const ModelProbe& probe, const GridSpec& spec, int64_t windows) const;
  // What a window sends its owner: null (the prediction, gathered as it is) or its record.
  virtual RecordMaker recordMaker(const TaskOutputs&) const { return nullptr; }
  // Its windows send records (recordMaker), not their predictions.
  virtual bool sendsRecords() const { return false; }
  // The consumer of an image's windows, with its partial files (the stage's writer options `writer`).
  virtual std::unique_ptr<ImageConsumer> makeConsumer(CatalogImage& image, const TaskOutputs& outputs,
                                                      const WriterOptions& writer) const = 0;
  // What it gives the formats to consume (writers/formats.hpp).
  virtual std::vector<Consumes> produces() const = 0;
  // The --save kinds it writes: the formats that consume what it produces, in the formats' order.
  std::vector<std::string> outputKinds() const;
  // Those it writes when --save is not given.
  virtual std::vector<std::string> defaultKinds() const = 0;
  // The kinds it writes of `flags.kinds` (--save's, or its defaults) with its own flags: another format in
  // place of one (classify's --wsinfer_layout: WSInfer's files for csv and tiles).
  virtual std::vector<std::string> settledKinds(const TaskFlags& flags) const { return flags.kinds; }
  // Whether it writes output kind `kind` (or a head's, "<head>/<kind>").
  bool writes(const std::string& kind) const;
  // The flags it owns, in --help's order.
  virtual std::vector<TaskFlag> flags() const { return {}; }
  // Its flags' `values` parsed into its settings, with the job's flags it reads (`job`; its settings unset):
  // a ConfigError naming the flag for a value it cannot take. Null: it has none.
  virtual std::shared_ptr<const TaskSettings> parseSettings(const FlagValues& /*values*/,
                                                            const TaskFlags& /*job*/) const {
    return nullptr;
  }

 protected:
  // This task's own flag rules (settle() has checked the kinds and the flags other tasks own).
  virtual void checkFlags(const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec) const = 0;
  // --halo, after checkFlags: refused for a vector a window; else the overlap raised to twice it (or, given
  // as --overlap, a ConfigError naming both when it is less).
  void settleHalo(const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec,
                  const std::string& shape) const;
  // The value of its flag `name` in `values` (its default when not given).
  std::string flagValue(const FlagValues& values, const std::string& name) const;
};

// `task`'s settings in `flags` (its parseSettings' type).
template <typename Settings>
const Settings& settingsOf(const Task& task, const TaskFlags& flags) {
  for (const auto& [owner, settings] : flags.settings)
    if (owner == &task && settings) return static_cast<const Settings&>(*settings);
  TILER_THROW(ConfigError, "--task " << task.name() << "'s flags were not parsed");
}
// A number flag's value: ConfigError naming `flag` when it is none.
double numberFlag(const std::string& flag, const std::string& value);

// segment's settings (its flags, and the job's --format, --classes and --activation it reads), which its
// consumer writes with; regress's maps are segment's, stitched and written with them.
struct SegmentSettings : TaskSettings {
  StitchOptions stitch;         // --blend, --sigma_scale
  MapSettings map;              // what the map's writers take: --probs_dtype, --classes, --format, --simplify
  float label_threshold = 0.f;  // one-channel models: 0 for logits, 0.5 for sigmoid probabilities
};

// Adds `more` non-finite prediction values to the image's count and, when it holds any, warns once that
// they mean nothing (a consumer's finalize(), before its files are committed).
void addNonFinite(CatalogImage& image, int64_t more);
// "output [1, 5, 6, 7] has 4 dimension(s)": a shape no task takes as it is (the registry adds the choices).
std::string dimensionsRefusal(const std::vector<int64_t>& sizes);
// Whether the probed output is a fixed-size record a window (its task's perWindow()), not a map.
bool perWindow(const ModelProbe& probe);

// classify and embed: one vector a window ([B, D], or [B, D, 1, 1] when named), into window_outputs' files.
class VectorTask : public Task {
 public:
  std::string refuses(const std::vector<int64_t>& sizes) const override;
  std::string shapeWords() const override {
    return "one vector per window, [batch, D] (--task classify | embed)";
  }
  bool perWindow() const override { return true; }
  // Its vector is class scores (classify: a CSV column and a colour a class).
  virtual bool classScores() const { return false; }
  std::unique_ptr<ImageConsumer> makeConsumer(CatalogImage& image, const TaskOutputs& outputs,
                                              const WriterOptions& writer) const override;
};
// classify and embed: whole windows on the patch lattice TRIDENT, CLAM and WSInfer cut (no overlap unless
// --overlap is given; the last windows on whole strides past the edge unless --edge shift).
void settlePatchLattice(const TaskFlags& flags, GridSpec& spec);

// The per-window writers (window_outputs) of classify, embed and detect as an image consumer: vectors are
// counted for non-finite values here, boxes where their rank made their records.
std::unique_ptr<ImageConsumer> windowOutputsConsumer(CatalogImage& image, const WindowOutputOptions& options);
// classify, embed and detect's window_outputs options, but for what a task adds (class scores, boxes).
WindowOutputOptions windowOutputOptions(const TaskOutputs& outputs);

}  // namespace tiler
