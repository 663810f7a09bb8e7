// catalog: the window catalog. Inputs become images (header read, channel adaptation, input scale, grid) and
// the windows of all images that will be processed are pooled into one global list, numbered in input
// order then row-major; locate() maps a global index back to (image, local window).
// Promise: every rank that sees the same files builds the same catalog (inputs sorted, the same checks); an
// input that cannot be opened or does not fit the model is kept with status "error" and its message, never
// thrown. No LibTorch; the catalog is plain data, read by every stage and changed only by the thread that
// owns a status (see pipeline).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/core/output_kinds.hpp"
#include "tiler/core/processing.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/mask.hpp"
#include "tiler/io/resolution.hpp"

namespace tiler {

// Files under `inputs` (directories walked, recursive when asked) with image extensions, sorted; a named
// file or URL is taken as it is (if it is missing, its error is the image's); a named *.txt file gives the
// inputs it lists (readInputList), each taken as named.
std::vector<std::string> listImages(const std::vector<std::string>& inputs, bool recursive);
// Default input scale for a sample type: 1/max for integers, 1 for float.
double defaultScale(SampleType type);

// How an image's channels become the model's: as is, gray repeated to 3, RGBA without alpha, palette indices
// through their colour map to RGB.
enum class ChannelAdapt { kNone, kRepeatGray, kDropAlpha, kPalette };
// Throws ModelError naming both numbers when no adaptation exists. `palette`: the image is a palette image
// (ImageInfo::colormap), whose single channel holds indices.
ChannelAdapt channelAdaptation(int image_channels, int model_channels, const std::string& image_path,
                               bool palette = false);

// --channels: the input channels to take, in order, 0-based ("2,0,1", "0-2", "3,1-2"); empty: all, as
// they are. Throws ConfigError in one line on anything else (a negative index, a reversed range, junk).
std::vector<int> parseChannelList(const std::string& list);

struct CatalogImage {
  std::string input;
  std::string label;  // finetune: the paired label file
  // info: the image as processed (width and height at the processing resolution; levels, mpp, reader of the
  // source); label_info: finetune's label file.
  ImageInfo info, label_info;
  ProcessingResolution resolution;  // the level read and how it is resampled
  WindowGrid grid;
  ChannelAdapt adapt = ChannelAdapt::kNone;
  std::vector<int> channels;  // the source channels read for the model, in order (--channels); empty: all
  double scale = 1.0;         // raw sample value -> model input, before mean/std
  // Infer with a card's preprocessing chain (JobOptions::preprocessing): the per-channel map of raw values to
  // the model's input (scale, mean, std and the chain's affine steps, with this image's statistics), set
  // before any of its windows is read, and the statistics it was made from (when the chain reads any).
  // statistics_error: why they could not be gathered (its windows then fail as a failed read does).
  ChannelAffine input_affine;
  std::optional<ImageStatistics> input_statistics;
  std::string statistics_error;
  // Infer with a card's postprocessing over the output's statistics (TaskFlags::blended_steps): the blended
  // output's statistics, and the per-channel map its affine steps made of them (set by the image's owner).
  std::optional<ImageStatistics> output_statistics;
  ChannelAffine output_affine;
  int64_t first_window = -1;  // global index of its window 0; -1: not planned
  std::string status = "ok";  // ok | skipped | error (infer: done once its outputs are committed)
  std::string error;
  int64_t non_finite_values = 0;    // infer: NaN/Inf values in this image's stitched predictions
  int64_t f16_overflow_values = 0;  // infer, --probs_dtype f16: finite values past 65504 stored as Inf
  int64_t remote_bytes_read = 0;    // infer, a remote input: the bytes every rank fetched from the server
  // detect: the objects written (-1: not an object task) and those of them a window edge inside the image
  // cut.
  int64_t objects = -1, objects_at_window_edge = 0;
  std::map<std::string, std::string> outputs;  // kind (labels, probs) -> final path
  // Infer: a file in the output directory that a rank creates as it starts reading the image and the image's
  // owner removes once the image is finished (done or failed): left behind, it says a run died while the
  // image was being read, and the next run reads a slide whole in a probe process before any rank reads it.
  std::string reading_mark;
  // Masking: the grid windows kept (ascending), the mask's share of the image and how it was made.
  bool masked = false;
  std::vector<int64_t> kept;
  double mask_coverage = 1.0;
  std::string mask_method;

  // Windows this image contributes to the global list, and the grid window of its k-th.
  int64_t plannedWindows() const { return masked ? int64_t(kept.size()) : grid.count(); }
  int64_t gridWindow(int64_t k) const { return masked ? kept[size_t(k)] : k; }
};

// What the images are cut for: the model's input channels and output scale, the grid, the input scale.
// `tiler info` describes images without a model (input_channels 0: no channel adaptation) and, without
// --window, without a grid (with_grid false: no windows, none kept; the mask's coverage still).
struct CatalogSpec {
  GridSpec grid;
  int input_channels = 3;
  Scale output_scale;
  double scale = 0.0;  // 0: defaultScale of each image's sample type
  MaskSpec mask;       // which windows to keep (infer)
  ResolutionSpec resolution;
  bool with_grid = true;
  std::vector<int> channels = {};  // --channels (parseChannelList); info.channels is then their count
};

class WindowCatalog {
 public:
  // Opens `path`'s header and fills an image for `spec` at its processing resolution (spec.resolution),
  // with the channels spec.channels selects (an index past the image's channels is its error), keeping only
  // the windows with at least spec.mask.fraction of their pixels inside its mask (if any); a failure (a mask
  // that cannot be made too) becomes status "error", never a throw.
  static CatalogImage describe(const std::string& path, const CatalogSpec& spec);
  // Appends an image; when `planned` its windows join the global list after those already there.
  int add(CatalogImage image, bool planned);

  const std::vector<CatalogImage>& images() const { return images_; }
  CatalogImage& image(int id) { return images_[size_t(id)]; }
  const CatalogImage& image(int id) const { return images_[size_t(id)]; }
  int64_t totalWindows() const { return total_windows_; }
  int plannedImages() const { return int(planned_.size()); }
  // (image id, grid window index) of global window `global` (0 <= global < totalWindows()).
  std::pair<int, int64_t> locate(int64_t global) const;
  // The lengths of the consecutive stretches of the global list that lie in one grid row of one image, in
  // order (windows of one row neighbour each other and share input tiles); they sum to totalWindows().
  std::vector<int64_t> rowLengths() const;

 private:
  std::vector<CatalogImage> images_;
  std::vector<int> planned_;            // ids of images with windows, in global order
  std::vector<int64_t> planned_first_;  // their first global window
  int64_t total_windows_ = 0;
};

// An output an image will have: its kind and how that kind is named.
struct SavedOutput {
  std::string kind;
  OutputKind naming;
};

// `tiler infer`'s catalog: outputs named <output_dir>/outputFileName(naming, kind, stem, format)
// (output_kinds); images whose outputs all exist are skipped with `resume`; existing outputs without
// resume/overwrite are a ConfigError listing them; two inputs with one stem, or whose outputs' names meet
// (a.tif's head b_x and a_b.tif's head x), are an error for the second.
struct InferCatalogOptions {
  std::vector<std::string> inputs;
  bool recursive = false;
  std::string output_dir;
  std::string format = "tif";
  // The outputs saved (--save): each kind (a head's: "<head>/<kind>") with its naming (writers/formats' row).
  std::vector<SavedOutput> outputs;
  bool resume = false, overwrite = false;
  bool remove_stale_partials = false;  // one rank (0) removes the .partial files a killed run left
  std::vector<std::string> also_read;  // other files the run reads (the model, the mask): never overwritten
  std::string roi;  // --roi: a file, or a directory of <stem>.geojson read for each input (roiFileFor)
};
WindowCatalog buildInferCatalog(const InferCatalogOptions& options, const CatalogSpec& spec);
// The image's reading mark (CatalogImage::reading_mark), made (never through a link) or removed; errors are
// ignored: a mark is evidence for the next run, not a condition of this one.
void markReading(const CatalogImage& img);
void unmarkReading(const CatalogImage& img);

}  // namespace tiler
