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
#include "tiler/dist/session.hpp"
#include "tiler/stitch/outputs.hpp"
#include "tiler/tasks/registry.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// Threads past what can be busy only cost memory (--write_threads 100000 took 3.7 GB and aborted): a flag's
// count is capped at 4 a CPU this rank may use and at `useful`, with a warning.
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

// --heads and --head_opt, each head's flags parsed (a head without its own takes the job-wide flag).
std::vector<InferHead> plannedHeads(const InferOptions& o, const InferPlan& p) {
  std::vector<InferHead> heads;
  for (const HeadSpec& spec : parseHeads(o.heads, o.head_opt)) {
    InferHead head;
    head.spec = spec;
    head.task = spec.task.value_or(p.task);
    head.activation = spec.activation ? parseActivation(*spec.activation) : p.activation;
    head.classes = spec.classes ? parseClasses(*spec.classes) : p.classes;
    head.probs_type = spec.probs_dtype ? parseProbsType(*spec.probs_dtype) : p.probs_type;
    if (spec.save || o.save) head.kinds = saveKindsOf(spec.save.value_or(o.save.value_or("")), head.task);
    heads.push_back(head);
  }
  TILER_CHECK(heads.empty() || o.output_key.empty(), ConfigError,
              "--output_key picks one output, --heads several: give one of them");
  return heads;
}

}  // namespace

InferPlan planInfer(InferOptions& o) {
  InferPlan p;
  const JobPlan job = planJob(o);  // the flags finetune shares, checked alike
  p.spec = job.spec;
  p.pad = job.pad;
  p.channels = job.channels;
  p.stitch.mode = parseBlendMode(o.blend);
  p.stitch.sigma_scale = o.sigma_scale;
  if (p.stitch.mode == BlendMode::kGaussian) gaussianImportance(4, 4, o.sigma_scale);  // validates sigma
  p.activation = parseActivation(o.activation);
  p.tta = parseTta(o.tta);
  TILER_CHECK(p.tta != Tta::kD4 || p.spec.window_w == p.spec.window_h, ConfigError,
              "--tta d4 rotates windows, so they must be square; got --window " << o.window);
  TILER_CHECK(
      o.read_threads >= 0, ConfigError,
      "--read_threads must be >= 0 (0: the CPUs the forward leaves, up to " << kMaxAutoReadThreads << ")");
  TILER_CHECK(o.shard_buffer >= 0, ConfigError,
              "--shard_buffer must be >= 0 (MiB; 0: one batch a rank per piece of a row)");
  TILER_CHECK(o.on_error == "skip" || o.on_error == "abort", ConfigError, "--on_error must be skip or abort");
  p.abort_on_error = o.on_error == "abort";
  TILER_CHECK(o.format == "tif" || o.format == "png", ConfigError, "--format must be tif or png");
  TILER_CHECK(!(o.resume && o.overwrite), ConfigError, "--resume and --overwrite exclude each other");
  if (!o.compression.empty()) {
    p.compression = parseCompression(o.compression);
    checkCompression(*p.compression);
  }
  p.probs_type = parseProbsType(o.probs_dtype);
  TILER_CHECK(o.stitch == "auto" || o.stitch == "host" || o.stitch == "device", ConfigError,
              "--stitch must be auto, host or device; got '" << o.stitch << "'");
  p.stitch_place = o.stitch == "device" ? StitchPlace::kDevice
                   : o.stitch == "host" ? StitchPlace::kHost
                                        : StitchPlace::kAuto;
  TILER_CHECK(o.write_threads >= 0, ConfigError,
              "--write_threads must be >= 0 (0: the CPUs this rank may use)");
  TILER_CHECK(o.edge == "auto" || o.edge == "lattice" || o.edge == "shift", ConfigError,
              "--edge must be auto, lattice or shift; got '" << o.edge << "'");
  o.read_threads = usefulThreads("--read_threads", o.read_threads, o.batch_size);
  o.write_threads = usefulThreads("--write_threads", o.write_threads, std::numeric_limits<int>::max());
  p.task = findTask(o.task);
  if (o.save) p.save_kinds = saveKindsOf(*o.save, p.task);  // else the task's default, once it is known
  p.mask = parseMaskSpec(o.mask, o.mask_fraction, o.roi, o.roi_class);
  TILER_CHECK((o.level >= 0) + (o.mpp > 0) + (o.magnification > 0) <= 1, ConfigError,
              "--level, --mpp and --magnification choose the same thing; give at most one");
  TILER_CHECK(o.mpp >= 0 && o.magnification >= 0 && o.input_mpp >= 0, ConfigError,
              "--mpp, --magnification and --input_mpp must be positive");
  p.resolution = ResolutionSpec{o.level, o.mpp, o.magnification, o.input_mpp};
  p.classes = parseClasses(o.classes);
  TILER_CHECK(o.simplify >= 0, ConfigError, "--simplify must be >= 0");
  TILER_CHECK(o.replicas >= 0, ConfigError,
              "--replicas must be >= 0 (0: one per CPU core, up to " << kMaxAutoReplicas << ")");
  if (o.inputs.empty()) o.inputs = {bundledSamplesDir() + "/images"};
  if (o.report.empty()) o.report = (fs::path(o.output_dir) / "report.json").string();
  p.heads = plannedHeads(o, p);  // after the job-wide flags, which are each head's defaults
  return p;
}

}  // namespace tiler
