// writers/formats: the one table of what --save can name. A format is one row: its naming (core's
// OutputKind: word, file pattern, scratch paths), the build feature it needs, what it consumes of a task's
// results, a format whose file it reads (made after it), its limits, a sentence for the docs, and its opener.
// A task writes the formats that consume what it produces (tasks/task.hpp), so a new format is its writer's
// file and its row here; --save's help, refusals and docs/cli.md's table come from the rows. Promise: the
// table is constant, read from any thread, and every `after` names an earlier row (checked the first time it
// is read). No LibTorch; the writers' types are only named here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tiler/core/output_kinds.hpp"

namespace tiler {

struct CatalogImage;
struct MapOutput;
class MapWriter;
struct RowContext;
class WindowRowOutput;
class BoxOutput;

// What a format takes of a task's results.
enum class Consumes {
  kMapValues,      // a stitched map's values, band by band (segment's probabilities, regress's maps)
  kMapLabels,      // a stitched class map's labels (segment)
  kWindowScores,   // one vector of class scores a window (classify)
  kWindowVectors,  // one feature vector a window (embed)
  kBoxes,          // boxes kept by the windows' cores (detect)
  kObjects,        // objects, boxes or traced instances (detect, instances)
  kInstanceMap,    // an image of object ids (instances)
  kStoredObjects,  // objects, or classified windows as boxes (detect, instances, classify)
};
// "a stitched map's values", ...: for the docs.
const char* consumesWords(Consumes consumes);

// Its writer, by what it consumes: exactly one is set, but for an instance format, which the instances
// consumer writes itself (writers/instances.hpp), and for one that takes a window's scores (row) and boxes
// (box) alike.
struct FormatOpener {
  std::unique_ptr<MapWriter> (*map)(const std::string& path, const MapOutput& output) = nullptr;
  std::unique_ptr<WindowRowOutput> (*row)(const RowContext& context) = nullptr;
  // A box format's writer: the image, its output path and the image's level-0 size.
  std::unique_ptr<BoxOutput> (*box)(const CatalogImage& image, const std::string& path, double width,
                                    double height) = nullptr;
};

struct OutputFormat {
  OutputKind naming;
  Consumes consumes;
  const char* summary;       // what it is, one sentence for docs/cli.md
  const char* feature = "";  // the build feature it needs (requireFeature), "" none
  const char* after = "";    // the format whose file it reads: made after that one's writer
  const char* limits = "";   // what it cannot hold, for the docs ("" none)
  FormatOpener open = {};
};

// Every format, in the order they are made, listed and documented.
const std::vector<OutputFormat>& outputFormats();
// The row of `kind` (a head's kind "<head>/<kind>" is its kind's row); null when --save has no such word.
const OutputFormat* findOutputFormat(const std::string& kind);
// Throws requireFeature's error when this build lacks the feature --save `kind` needs.
void requireFormatFeature(const std::string& kind);
// The naming of `kind`; ConfigError when --save has no such word.
const OutputKind& outputNaming(const std::string& kind);

}  // namespace tiler
