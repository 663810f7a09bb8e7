// report: what a run tells its user. The report JSON of `tiler infer` (fields in the README), written
// atomically by rank 0 also when images failed; the exit code it implies; the progress line.
// No LibTorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tiler/io/catalog.hpp"

namespace tiler {

// One rank's share of the work, as the final exchange collects it.
struct RankStats {
  int64_t windows = 0;
  double read_seconds = 0, forward_seconds = 0, gather_seconds = 0, peak_rss_mb = 0;
  int64_t tiles_decoded = 0;  // TIFF tiles or strips (tiffChunksDecoded)
  // The rank's output stage (OutputStats): its busy seconds, the bytes it committed, the images it owns.
  double write_seconds = 0;
  int64_t bytes_written = 0, images_owned = 0;
  // From the process's start (loading LibTorch included) to its first step: model load, probe, planning.
  double startup_seconds = 0;
  // The rank's wall time, the process's start to its final statistics, as the main thread spent it (the
  // critical path: each of its seconds in exactly one part, so the parts add up to wall_seconds): start-up
  // (libtorch_seconds to the job's start: the process, LibTorch's load, the command line; model_load_seconds;
  // probe_seconds: the probe, the optimised model's check, the light-model timing; setup_seconds: the process
  // group, the plan, the replicas), then in the steps wait_read_seconds (for a batch's windows),
  // wait_forward_seconds (for a batch's forward), gather_seconds (the step exchange), submit_seconds (handing
  // a step to the output stage), other_seconds (the rest of a step), and drain_seconds (the output stage's
  // last images after the last step). read_seconds, forward_seconds (normalize_seconds of it) and
  // write_seconds are busy seconds of other threads, which overlap these.
  double wall_seconds = 0, libtorch_seconds = 0, model_load_seconds = 0, probe_seconds = 0, setup_seconds = 0;
  double wait_read_seconds = 0, wait_forward_seconds = 0, submit_seconds = 0, other_seconds = 0,
         drain_seconds = 0, normalize_seconds = 0;
  std::vector<double> pack() const;
  static RankStats unpack(const std::vector<double>& values);
};

struct RunSummary {
  int world_size = 1;
  std::string backend, device, precision, model;
  double seconds = 0;
  GridSpec window;
  double output_scale = 1.0;
  std::string tta = "none";
  int replicas = 1, threads = 1;        // model replicas of this rank, intra-op threads of each
  int read_threads = 1;                 // threads reading each batch's windows
  int64_t shard_run = 1;                // the most windows one rank takes in a row (RowDeal::longest_part)
  std::string cpu_blas;                 // cpuBlasName()
  std::string gather = "none";          // how predictions reached their owners (DistContext::gatherTransport)
  std::string task = "segment";         // segment | classify | embed | detect | instances
  int64_t feature_dim = 0;              // classify: classes K; embed: features D; segment: 0
  std::string runtime = "torchscript";  // torchscript | pt2 (ModelRuntime::name)
  // Whether the model ran frozen + optimize_for_inference, and why not where it was the default.
  bool jit_optimize = false;
  std::string jit_optimize_fallback;
  // Without --threads and --replicas on the CPU: the layouts timed on the first batches ("RxT" and seconds a
  // window each), the faster one kept (replicas, threads); empty: not measured.
  std::vector<std::pair<std::string, double>> layouts_timed;
  std::string stitch = "host";  // where the windows were blended: host | device (--stitch)
  int64_t halo = 0;             // --halo (or the card's): output px not blended where windows meet
  // The model card read (JobOptions::model_card) and where each setting came from; empty: no card.
  std::string model_card;
  std::vector<std::pair<std::string, std::string>> settings_from;
};

// A rank's stage seconds as the report gives them: "wall", "critical_path" (the main thread's parts, in
// order, which add up to the wall), their "critical_path_sum", and the "overlapped" busy seconds of the
// read, forward (normalisation's share of it) and output threads.
nlohmann::json stageSeconds(const RankStats& s);
// The report of an infer run: statuses as the catalog holds them after the output stage finished ("done"
// is reported as ok; a planned image never finished is an error).
nlohmann::json inferReport(const RunSummary& run, const WindowCatalog& catalog,
                           const std::vector<RankStats>& per_rank);
// Remote inputs (remote_input.hpp): whether the catalog has any; per image, the bytes this process fetched
// for it (0 for a local input), which every rank sends and addFetchedBytes sums into remote_bytes_read.
bool anyRemoteInput(const WindowCatalog& catalog);
std::vector<double> fetchedBytesPerImage(const WindowCatalog& catalog);
void addFetchedBytes(WindowCatalog& catalog, const std::vector<double>& per_image);
// kExitOk, or kExitSomeFailed when any image of the report failed.
int exitCodeOf(const nlohmann::json& report);
// Writes `j` to "<path>.partial" and renames it into place; throws IoError.
void writeJsonAtomically(const std::string& path, const nlohmann::json& j);

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

}  // namespace tiler
