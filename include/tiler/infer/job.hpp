// infer/job: `tiler infer`, a composition of the stage units: catalog -> loader (read-ahead) -> model ->
// step exchange -> outputs (each image's owner rank) -> report (rank 0).
// Promise: every rank builds the same catalog, takes its part of every row of windows (dealRows) and makes
// the same collectives in the same order whatever happens. Any exception while reading, running, stitching or
// writing one image fails that image on every rank (report entry with its message, exit 2) and the run goes
// on; a fatal error on any rank (--on_error abort, a failed report, a dead stage) ends every rank at the
// same step with that rank's message (exit 1). Outputs are byte-identical for any world size (for the same
// --threads, and replicas of one thread each for one thread). Memory per rank: the read-ahead batches and the
// readers' caches; on an image's owner also its stitcher rows and one row of output tiles while it is open.
#pragma once

#include "tiler/infer/options.hpp"

namespace tiler {

// Runs the job; returns kExitOk, or kExitSomeFailed when images failed. Throws on fatal errors (on every
// rank alike).
int runInfer(InferOptions options);

}  // namespace tiler
