// summary: the end of an infer run on rank 0: every rank's image results, statistics and fetched bytes
// into the report (RunSummary's named fields beside them), one line of totals in the log, and the exit code.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "tiler/dist/report.hpp"
#include "tiler/io/catalog.hpp"

namespace tiler {

// What every rank sent at the end (allgather, rank order).
struct RanksAtEnd {
  std::vector<std::string> results;    // OutputStage::ownedResults of each rank
  std::vector<torch::Tensor> stats;    // RankStats::pack of each rank (double)
  std::vector<torch::Tensor> fetched;  // fetchedBytesPerImage of each rank (double); empty: no remote input
};

// Writes the report to `path` (atomically) and returns the run's exit code (exitCodeOf).
int writeRunReport(WindowCatalog& catalog, const RunSummary& run, const RanksAtEnd& ranks,
                   const std::string& path);

}  // namespace tiler
