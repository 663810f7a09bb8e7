// finetune/trainer: the training job on this rank, as its phases: join the world, plan the flags, load the
// model, connect and load the data (every rank stops there together), resume, broadcast rank 0's weights, run
// the epochs (steps, validation, checkpoint, the epochs CSV and plot), check that every rank holds the same
// parameters, and let rank 0 write the model and the report.
// Promise: gradients are summed over --grad_accum_steps micro-batches, then all-reduced in ~25 MB flat
// buckets and averaged, so every rank holds identical parameters (K ranks x batch B equal 1 rank x K
// micro-batches of B); a failure on any rank ends every rank at the same step with its message.
#pragma once

#include "tiler/finetune/options.hpp"

namespace tiler {

// The job's exit code on this rank (kExitOk); throws what stops it.
int runTraining(const FinetuneOptions& options);

}  // namespace tiler
