// pipeline: the inference job. plan -> prefetch -> forward -> gather -> stitch -> write -> report.
// Promise: every rank builds the same plan (sorted inputs, windows of all images pooled in one global list),
// takes its DistributedSampler shard, and makes the same sequence of collectives whatever happens to an
// image. Rank 0 stitches in global window order on its own thread, so outputs are byte-identical for any
// world size (for the same --threads); an image that fails on any rank is failed everywhere, reported, and
// leaves no file under a final name. Memory per rank: the prefetch queue, the open readers' tile caches, and
// on rank 0 the stitcher rows and one row of output tiles per open image.
#pragma once

#include <chrono>
#include <nlohmann/json_fwd.hpp>
#include <opencv2/core.hpp>
#include <string>
#include <vector>

#include "tiler/grid.hpp"
#include "tiler/image_io.hpp"

namespace tiler {

// The flat parameter struct of `tiler infer`, one field per flag (see DESIGN.md).
struct InferOptions {
  std::vector<std::string> inputs;  // files or directories; empty: the bundled samples
  std::string output_dir = "tiler-out";
  std::string model;  // empty: the bundled sample model
  std::string window = "256";
  std::string overlap = "0.25";  // F or FX,FY
  std::string blend = "gaussian";
  double sigma_scale = 0.125;
  std::string pad = "constant";
  double cval = 0.0;
  int batch_size = 8;
  std::string device = "auto";
  std::string backend = "auto";
  std::string precision = "auto";
  double scale = 0.0;  // 0: by sample type (u8 1/255, u16 1/65535, f32 1)
  std::vector<double> mean, std;
  std::string activation = "none";
  std::string save = "labels";
  std::string format = "tif";
  std::string compression = "deflate";
  bool resume = false;
  bool overwrite = false;
  std::string on_error = "skip";
  std::string report;  // empty: <output>/report.json
  int threads = 0;
  double timeout = 300.0;
  bool no_progress = false;
  bool recursive = false;
  std::string output_key;
  bool jit_optimize = false;
  int prefetch = 2;  // batches read ahead
};

// Runs the job; returns kExitOk, or kExitSomeFailed when images failed. Throws on fatal errors.
int runInfer(InferOptions options);

// `tiler info`: what the reader sees, and the grid when window is given. Returns an exit code.
int runInfo(const std::vector<std::string>& paths, const std::string& window, const std::string& overlap);

// A colour overlay PNG of `labels` on `image`, at most max_side pixels a side (for looking at results);
// with a grid, the outlines of its windows too.
void writeOverlay(const std::string& image_path, const std::string& labels_path, const std::string& out_path,
                  int max_side = 2048, const GridSpec* grid = nullptr);

// ---- pieces shared with finetune ----

std::string bundledSamplesDir();
// Files under `inputs` (directories walked, recursive when asked) with image extensions, sorted.
std::vector<std::string> listImages(const std::vector<std::string>& inputs, bool recursive);
// Parses "F" or "FX,FY" into spec's overlaps (each in [0,1)).
void parseOverlap(const std::string& text, GridSpec& spec);

enum class PadMode { kConstant, kReflect, kReplicate };
PadMode parsePadMode(const std::string& name);
// The pixels of image window `local_index`, padded where the window reaches outside the image.
cv::Mat readWindow(ImageReader& reader, const WindowGrid& grid, int64_t local_index, PadMode pad,
                   double cval);
// Default input scale for a sample type: 1/max for integers, 1 for float.
double defaultScale(SampleType type);
// Rank 0's progress display: a bar with rate and ETA on a terminal, a plain line every 5 s otherwise.
class Progress {
 public:
  Progress(int64_t total, std::string unit, bool enabled);
  void update(int64_t done);

 private:
  int64_t total_;
  std::string unit_;
  bool enabled_, tty_;
  std::chrono::steady_clock::time_point start_, last_;
};

// Peak resident memory of this process so far, in MiB.
double peakRssMegabytes();
// Writes `j` to "<path>.partial" and renames it into place; throws IoError.
void writeJsonAtomically(const std::string& path, const nlohmann::json& j);

}  // namespace tiler
