#include "tiler/infer/plan.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "tiler/core/cpu_layout.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/core/processing.hpp"
#include "tiler/dist/session.hpp"
#include "tiler/stitch/outputs.hpp"
#include "tiler/tasks/registry.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// Threads past what can be busy only cost memory (each has its stack and buffers; a huge count exhausts it):
// a flag's count is capped at 4 a CPU this rank may use and at `useful`, with a warning.
int usefulThreads(const char* flag, int requested, int useful) {
  const int cap = std::max(1, std::min(useful, 4 * usableCpus()));
  if (requested <= cap) return requested;
  spdlog::warn("{} {}: capped at {} (4 threads a usable CPU, and no more than can be busy)", flag, requested,
               cap);
  return cap;
}

// --save's kinds, checked against `requested` (--task) when it is given; a task no output shape says (detect,
// instances) becomes `requested` when the kinds say it.
std::vector<std::string> saveKindsOf(const std::string& save, const Task*& requested) {
  std::vector<std::string> kinds;
  const std::string bad_save = "--save takes " + saveKindsText() + ", comma-separated; got '" + save + "'";
  // "" and "labels," name nothing (or end in nothing), which getline would not return.
  TILER_CHECK(!save.empty() && save.back() != ',', ConfigError, bad_save);
  std::stringstream ss(save);
  std::string part;
  while (std::getline(ss, part, ',')) {
    TILER_CHECK(taskOfOutputKind(part) != nullptr, ConfigError, bad_save);
    TILER_CHECK(requested == nullptr || requested->writes(part), ConfigError,
                "--save " << part << " is an output of --task " << taskName(taskOfOutputKind(part))
                          << ", not of --task " << taskName(requested));
    if (std::find(kinds.begin(), kinds.end(), part) == kinds.end()) kinds.push_back(part);
  }
  // The first task that writes every kind asked for (objects: detect, unless --task instances says so).
  const Task* task = requested;
  for (const Task* t : allTasks())
    if (task == nullptr &&
        std::all_of(kinds.begin(), kinds.end(), [t](const std::string& kind) { return t->writes(kind); }))
      task = t;
  TILER_CHECK(task != nullptr, ConfigError,
              "--save " << save << " mixes the outputs of two tasks ("
                        << taskName(taskOfOutputKind(kinds.front())) << " and "
                        << taskName(taskOfOutputKind(kinds.back())) << ")");
  // No output shape says "boxes" or "instances" for sure: the outputs asked for say it.
  if (!task->claimedByShape()) requested = task;
  return kinds;
}

// `f` with each task's settings of its own flags `values` (the job's, or a head's) and the flags among them
// that shape a stitched map.
TaskFlags withTaskSettings(const InferOptions& o, TaskFlags f, const FlagValues& values) {
  f.settings = parseTaskSettings(values, f);
  f.map_flags = givenMapFlags(values);
  const InferOptions defaults;
  if (o.format != defaults.format) f.map_flags.push_back("--format");
  if (o.stitch != defaults.stitch) f.map_flags.push_back("--stitch");
  return f;
}

// --heads and --head_opt, each head's flags parsed (a head without its own takes the job-wide flag).
std::vector<InferHead> plannedHeads(const InferOptions& o, const InferPlan& p) {
  std::vector<InferHead> heads;
  for (const HeadSpec& spec : parseHeads(o.heads, o.head_opt)) {
    InferHead head;
    head.spec = spec;
    head.task = spec.task.value_or(p.task);
    head.flags = p.flags;
    const auto activation = spec.setting("activation"), classes = spec.setting("classes"),
               save = spec.setting("save");
    if (activation) head.flags.activation = parseActivation(*activation);
    head.flags.activation_name = activation.value_or(o.activation);
    if (classes) head.flags.classes = parseClasses(*classes);
    head.flags.save = save ? save : o.save;
    head.flags.kinds.clear();
    if (head.flags.save) head.flags.kinds = saveKindsOf(*head.flags.save, head.task);
    head.flags.head = spec.name;
    FlagValues values = o.task_flags;
    for (const auto& [key, value] : spec.settings) values[key] = value;
    head.flags = withTaskSettings(o, head.flags, values);
    heads.push_back(head);
  }
  TILER_CHECK(heads.empty() || o.output_key.empty(), ConfigError,
              "--output_key picks one output, --heads several: give one of them");
  // A card describes one output: its postprocessing is that output's, and no head is it.
  TILER_CHECK(heads.empty() || o.postprocessing.empty(), ConfigError,
              "--heads " << o.heads << ": the model card's outputs[0].postprocessing ("
                         << stepNames(o.postprocessing)
                         << ") is of the card's one output, not of each head, and tiler would apply it to "
                            "none: run the card's output without --heads (or --output_key NAME for it)");
  return heads;
}

}  // namespace

InferPlan planInfer(InferOptions& o) {
  InferPlan p;
  const JobPlan job = planJob(o);  // the flags finetune shares, checked alike
  p.spec = job.spec;
  p.pad = job.pad;
  p.channels = job.channels;
  p.flags.model = o.model;
  p.flags.activation = parseActivation(o.activation);
  p.flags.activation_name = o.activation;
  p.flags.tta = parseTta(o.tta);
  TILER_CHECK(p.flags.tta != Tta::kD4 || p.spec.window_w == p.spec.window_h, ConfigError,
              "--tta d4 rotates windows, so they must be square; got --window " << o.window);
  // A card's binarize runs on each window's output: blended with its neighbours' (any blend but crop) or
  // averaged over views (--tta), its 0s and 1s would come out as fractions.
  const auto [per_window_steps, blended_steps] = splitAtStatistics(o.postprocessing);
  const bool binarizes = std::any_of(per_window_steps.begin(), per_window_steps.end(),
                                     [](const ProcessingStep& s) { return s.id == "binarize"; });
  if (binarizes) {
    const auto blend = o.task_flags.find("blend");
    const std::string how = blend == o.task_flags.end() ? "gaussian" : blend->second;
    const bool maps = o.task == "segment" || o.task == "regress";
    TILER_CHECK((!maps || how == "crop") && p.flags.tta == Tta::kNone, ConfigError,
                "the model card's outputs[0].postprocessing binarize is applied to each window's output, "
                "which "
                    << (p.flags.tta != Tta::kNone ? "--tta " + o.tta + " averages over views"
                                                  : "--blend " + how + " blends with its neighbours'")
                    << ": its 0s and 1s would come out as fractions; run with --blend crop and without --tta "
                       "(or give --activation and read the labels, tiler's threshold of the blended map)");
  }
  TILER_CHECK(
      o.read_threads >= 0, ConfigError,
      "--read_threads must be >= 0 (0: the CPUs the forward leaves, up to " << kMaxAutoReadThreads << ")");
  TILER_CHECK(o.shard_buffer >= 0, ConfigError,
              "--shard_buffer must be >= 0 (MiB; 0: one batch a rank per piece of a row)");
  TILER_CHECK(o.on_error == "skip" || o.on_error == "abort", ConfigError, "--on_error must be skip or abort");
  p.abort_on_error = o.on_error == "abort";
  TILER_CHECK(o.format == "tif" || o.format == "png", ConfigError, "--format must be tif or png");
  p.flags.format = o.format;
  TILER_CHECK(!(o.resume && o.overwrite), ConfigError, "--resume and --overwrite exclude each other");
  if (!o.compression.empty()) {
    p.compression = parseCompression(o.compression);
    checkCompression(*p.compression);
  }
  TILER_CHECK(o.stitch == "auto" || o.stitch == "host" || o.stitch == "device", ConfigError,
              "--stitch must be auto, host or device; got '" << o.stitch << "'");
  p.stitch_place = o.stitch == "device" ? StitchPlace::kDevice
                   : o.stitch == "host" ? StitchPlace::kHost
                                        : StitchPlace::kAuto;
  TILER_CHECK(o.write_threads >= 0, ConfigError,
              "--write_threads must be >= 0 (0: the CPUs this rank may use)");
  o.read_threads = usefulThreads("--read_threads", o.read_threads, o.batch_size);
  o.write_threads = usefulThreads("--write_threads", o.write_threads, std::numeric_limits<int>::max());
  TILER_CHECK(o.edge == "auto" || o.edge == "lattice" || o.edge == "shift", ConfigError,
              "--edge must be auto, lattice or shift; got '" << o.edge << "'");
  p.flags.edge = o.edge;
  p.flags.overlap_given = o.overlap_given;
  TILER_CHECK(o.halo >= 0, ConfigError,
              "--halo must be >= 0 (px at the output's resolution); got " << o.halo);
  p.flags.halo = o.halo;
  p.flags.blended_steps = blended_steps;
  p.task = findTask(o.task);
  p.flags.save = o.save;
  if (o.save) p.flags.kinds = saveKindsOf(*o.save, p.task);  // else the task's default, once it is known
  p.mask = parseMaskSpec(o.mask, o.mask_fraction, o.roi, o.roi_class);
  TILER_CHECK((o.level >= 0) + (o.mpp > 0) + (o.magnification > 0) <= 1, ConfigError,
              "--level, --mpp and --magnification choose the same thing; give at most one");
  TILER_CHECK(o.mpp >= 0 && o.magnification >= 0 && o.input_mpp >= 0, ConfigError,
              "--mpp, --magnification and --input_mpp must be positive");
  p.resolution = ResolutionSpec{o.level, o.mpp, o.magnification, o.input_mpp, !o.no_upsample};
  p.flags.classes = parseClasses(o.classes);
  TILER_CHECK(o.replicas >= 0, ConfigError,
              "--replicas must be >= 0 (0: one per CPU core, up to " << kMaxAutoReplicas << ")");
  if (o.inputs.empty()) o.inputs = {bundledSamplesDir() + "/images"};
  if (o.report.empty()) o.report = (fs::path(o.output_dir) / "report.json").string();
  p.flags = withTaskSettings(o, p.flags, o.task_flags);
  p.heads = plannedHeads(o, p);  // after the job-wide flags, which are each head's defaults
  return p;
}

}  // namespace tiler
