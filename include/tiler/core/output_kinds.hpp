// output_kinds: how an output is named, whatever writes it. An output kind's naming is its --save word, its
// file or directory name beside the outputs, and the partial paths its writer holds while it writes; the
// catalog names, checks (--resume, --overwrite) and sweeps outputs from it alone. The formats themselves,
// what they consume and who opens them, are rows on the writers floor (writers/formats.hpp), each holding its
// naming. Plain data, no LibTorch.
#pragma once

#include <string>
#include <vector>

namespace tiler {

struct OutputKind {
  const char* name;        // --save's word
  const char* pattern;     // its name beside the outputs: {stem}, {format} are replaced
  bool directory = false;  // a store (a directory committed whole) rather than a file
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

// The kind `kind` of head `head` of a model with several outputs (--heads): "<head>/<kind>", written as
// <stem>_<head>_... (outputFileName); an empty head: `kind` itself.
std::string headKind(const std::string& head, const std::string& kind);
// A kind's word without its head: "labels" for "np/labels".
std::string bareKind(const std::string& kind);

// The name of output `kind` (a head's: "<head>/<kind>", which puts _<head> after the stem), named by `row`,
// for an image's stem.
std::string outputFileName(const OutputKind& row, const std::string& kind, const std::string& stem,
                           const std::string& format);
// Every partial path a writer of `kind` may leave at output `path` when its run dies: "<path>.partial" (a
// store's: a directory) first, then its scratch files and its levels' (the catalog sweeps them when stale).
std::vector<std::string> partialPaths(const OutputKind& kind, const std::string& path);

}  // namespace tiler
