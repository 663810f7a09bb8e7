// output_kinds: the one table of what `--save` can name. Each row is an output kind: its word, the tasks
// that write it (the first of which it belongs to when no task is named), its file or directory name, the
// optional build feature it needs, whether a task writes it by default, and the partial paths its writer
// holds while it writes. `--save`'s parsing, help and refusals, the output names the catalog checks for
// --resume/--overwrite, the stale partial paths it sweeps, and the build features a job requires all read
// this table, so a new output is one row here plus its writer (src/writers/, docs/design.md).
// Plain data, no LibTorch; the table is constant and read from any thread.
#pragma once

#include <string>
#include <vector>

#include "tiler/core/job_options.hpp"

namespace tiler {

struct OutputKind {
  const char* name;                    // --save's word
  std::vector<ModelTask> tasks;        // the tasks that write it, the one it is taken for first
  const char* pattern;                 // its name beside the outputs: {stem}, {format} are replaced
  bool directory = false;              // a store (a directory committed whole) rather than a file
  const char* feature = "";            // the build feature it needs (requireFeature), "" none
  std::vector<ModelTask> default_for;  // tasks that write it when --save is not given
  // The scratch files its writer holds beside "<name>.partial": "<name><suffix>.partial" each.
  std::vector<const char*> scratch = {};
  // A TIFF with reduced levels (--pyramid): each level, and each scratch's, is "<...>.level<N>.partial".
  bool tiff_levels = false;
};

// The most reduced levels a TIFF pyramid has (image_io's halving down to a tile: 2^32 pixels a side).
constexpr int kMaxTiffLevels = 32;

// --task's words: auto | segment | classify | embed | detect | instances (ConfigError otherwise).
ModelTask parseTask(const std::string& name);
const char* taskName(ModelTask task);

// Every kind, in the order --help and the docs list them.
const std::vector<OutputKind>& outputKinds();
// The row of `name` (or of a head's kind, "<head>/<kind>"), or null when --save has no such word.
const OutputKind* findOutputKind(const std::string& name);
// The kind `kind` of head `head` of a model with several outputs (--heads): "<head>/<kind>", written as
// <stem>_<head>_... (outputFileName); an empty head: `kind` itself.
std::string headKind(const std::string& head, const std::string& kind);

// The output kinds (--save) a task writes, in table order; its defaults (defaultOutputKinds) among them.
std::vector<std::string> outputKindsOf(ModelTask task);
std::vector<std::string> defaultOutputKinds(ModelTask task);
// Whether `task` writes output kind `kind`.
bool taskWrites(ModelTask task, const std::string& kind);
// The first task that writes an output kind (objects and objects_csv: detect; kAuto: no such kind).
ModelTask taskOfOutputKind(const std::string& kind);
// An output's name for an image's stem, by kind (the row's pattern; a head's kind puts _<head> after the
// stem); throws ConfigError for no such kind.
std::string outputFileName(const std::string& kind, const std::string& stem, const std::string& format);
// Every partial path a writer of `kind` may leave at output `path` when its run dies: "<path>.partial" (a
// store's: a directory) first, then its scratch files and its levels' (the catalog sweeps them when stale).
std::vector<std::string> partialPaths(const OutputKind& kind, const std::string& path);
// "labels, probs and polygons (segment), ...": what --save takes, for its help and its refusals.
std::string saveKindsText();
// --save's help: each task's kinds and its defaults ("labels, probs, ... (segment; default labels), ...").
std::string saveHelpText();

}  // namespace tiler
