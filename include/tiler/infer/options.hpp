// infer/options: `tiler infer`'s flags as the command line gives them (InferOptions), which the plan
// (plan.hpp) parses and checks once; plain data, no LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tiler/core/job_options.hpp"

namespace tiler {

class ModelRunner;    // model/model.hpp
struct ModelOptions;  // model/model.hpp
// Makes a job's model for its options and window (w, h); InferOptions::load_model.
using ModelLoader = std::function<std::shared_ptr<ModelRunner>(const ModelOptions& options, int64_t window_w,
                                                               int64_t window_h)>;

// The flat parameter struct of `tiler infer`: the shared job flags plus one field per infer flag.
struct InferOptions : JobOptions {
  std::vector<std::string> inputs;  // files or directories; empty: the bundled samples
  std::string output_dir = "tiler-out";
  double cval = 0.0;
  std::string activation = "none";
  std::string tta = "none";  // none | flip | d4
  // The model's output halo, px at the output's resolution: the band of each window's edge that is not
  // blended where windows meet (StitchOptions::halo); the overlap is raised to twice it unless --overlap.
  int64_t halo = 0;
  // Outputs, comma-separated (each task's outputKinds): labels, probs, polygons (segment); features,
  // features_pt (embed); csv, tiles, heatmap (classify); objects, objects_csv, coco (detect); objects,
  // objects_csv, instances (instances). Unset: the task's default (defaultKinds).
  std::optional<std::string> save;
  std::string task = "auto";  // auto | segment | classify | embed | detect | instances (tasks/registry)
  // A model with several outputs run once per batch, each its own task and outputs (tasks/heads.hpp):
  // NAME[:TASK],...; empty: one output (--output_key).
  std::string heads;
  std::vector<std::string> head_opt;  // NAME.KEY=VALUE: a head's own flag (tasks/heads' headSettingWords)
  // Each task's own flags (Task::flags, tasks/registry's taskFlagDeclarations: --blend, --nms, ...) by name,
  // as given; a flag not here has its default.
  std::map<std::string, std::string> task_flags;
  // --overlap given: a per-window task (classify, embed) uses it; else its windows do not overlap (0).
  bool overlap_given = false;
  // Where the last column and row of windows go: lattice (whole strides, padded past the edge: TRIDENT's
  // and CLAM's patches), shift (back to end at the edge: MONAI's grid); auto: lattice for per-window tasks,
  // shift for segment (the only one it allows).
  std::string edge = "auto";
  std::string format = "tif";
  std::string compression;  // --compression; "": each output's defaultCompression
  bool resume = false;
  bool overwrite = false;
  std::string on_error = "skip";
  std::string report;  // empty: <output>/report.json
  bool recursive = false;
  // --jit_optimize: freeze + optimize_for_inference, asked for; --no_jit_optimize: never; neither: where the
  // probe's check finds the same outputs (ModelOptions::jit_optimize_default).
  bool jit_optimize = false, no_jit_optimize = false;
  std::string mask = "none";    // none | auto | PATH
  double mask_fraction = 0.05;  // share of a window inside the mask for it to be processed
  std::string roi;              // GeoJSON file or directory of <stem>.geojson: windows only where it is
  std::string roi_class;        // only the ROI features of this classification name
  bool pyramid = false;         // reduced-resolution pages in the TIFF outputs
  std::string classes;          // NAME[:#rrggbb],... for classes 0..K-1
  // Processing resolution (at most one of the first three) and the sources' µm/px.
  int level = -1;
  double mpp = 0.0;
  double magnification = 0.0;
  double input_mpp = 0.0;
  bool no_upsample = false;  // a target finer than an image's level 0 fails it instead of upsampling
  // Model replicas, each on a thread of its own with --threads intra-op threads; 0: one per CPU core (up to
  // kMaxAutoReplicas) without --threads, else one.
  int replicas = 0;
  // Threads reading a batch's windows (the read-ahead thread and helpers); 0: chooseReadThreads().
  int read_threads = 0;
  // MiB an image's owner may hold of predictions that arrive before their turn to be stitched: it sets how
  // long a piece of a grid row the ranks split between them (dealRows), so that each rank's part of a row is
  // long and ranks decode few shared input tiles twice; 0: one batch a rank per piece.
  int shard_buffer = 64;
  // Ranks of one host gather predictions through the process group's sockets, not shared memory.
  bool no_shared_memory = false;
  // Threads compressing output tiles (every output of the rank); 0: usableCpus().
  int write_threads = 0;
  // Where a segment model's windows are blended: auto (device on a GPU, else host) | host | device (on the
  // model's device, a CPU one too, where the owner's windows arrive there: one rank, NCCL, gloo between
  // CPUs).
  std::string stitch = "auto";
  // Called after each step on every rank, with the windows done of the total (the progress line's numbers),
  // on the thread that called runInfer: a caller's progress display, or its interruption (what it throws
  // ends the run, as a fatal error of this rank). Empty: none.
  std::function<void(int64_t done, int64_t total)> after_step;
  // Makes the model instead of loading it anew: a caller that runs many jobs of one model (the Python
  // module's Model) keeps it loaded between them. Empty: each run loads its model.
  ModelLoader load_model;
};

}  // namespace tiler
