// output_kinds: the one table of what `--save` can name. Each row is an output kind: its word, its file or
// directory name, the optional build feature it needs, and the partial paths its writer holds while it
// writes. Which tasks write a kind, and by default, is each task's own (tasks/task.hpp, tasks/registry.hpp:
// --save's help and refusals are made there). The output names the catalog checks for --resume/--overwrite,
// the stale partial paths it sweeps, and the build features a job requires all read this table, so a new
// output is one row here plus its writer (src/writers/, docs/design.md) and the task that writes it.
// Plain data, no LibTorch; the table is constant and read from any thread.
#pragma once

#include <string>
#include <vector>

namespace tiler {

struct OutputKind {
  const char* name;          // --save's word
  const char* pattern;       // its name beside the outputs: {stem}, {format} are replaced
  bool directory = false;    // a store (a directory committed whole) rather than a file
  const char* feature = "";  // the build feature it needs (requireFeature), "" none
  // The scratch files its writer holds beside "<name>.partial": "<name><suffix>.partial" each.
  std::vector<const char*> scratch = {};
  // A TIFF with reduced levels (--pyramid): each level, and each scratch's, is "<...>.level<N>.partial".
  bool tiff_levels = false;
  // A store: the file its writer writes last, inside it; a store without it is unfinished (--resume redoes
  // it).
  const char* complete_when = "";
};

// The most reduced levels a TIFF pyramid has (image_io's halving down to a tile: 2^32 pixels a side).
constexpr int kMaxTiffLevels = 32;

// Every kind, in the order --help and the docs list them.
const std::vector<OutputKind>& outputKinds();
// The row of `name` (or of a head's kind, "<head>/<kind>"), or null when --save has no such word.
const OutputKind* findOutputKind(const std::string& name);
// The kind `kind` of head `head` of a model with several outputs (--heads): "<head>/<kind>", written as
// <stem>_<head>_... (outputFileName); an empty head: `kind` itself.
std::string headKind(const std::string& head, const std::string& kind);

// An output's name for an image's stem, by kind (the row's pattern; a head's kind puts _<head> after the
// stem); throws ConfigError for no such kind.
std::string outputFileName(const std::string& kind, const std::string& stem, const std::string& format);
// Every partial path a writer of `kind` may leave at output `path` when its run dies: "<path>.partial" (a
// store's: a directory) first, then its scratch files and its levels' (the catalog sweeps them when stale).
std::vector<std::string> partialPaths(const OutputKind& kind, const std::string& path);

}  // namespace tiler
