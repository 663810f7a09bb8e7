// finetune/plan: `tiler finetune`'s flags parsed and checked once, into typed values the trainer's parts read
// (as infer's plan is; numbers are read from FinetuneOptions as given).
// Promise: planFinetune throws a ConfigError naming the flag for any value training cannot run, in the order
// and words the command has always used; the label source's own flags are its row's to check
// (label_source.hpp). What depends on the model (its classes, the task a window label trains) is settled once
// it is probed.
#pragma once

#include "tiler/finetune/options.hpp"
#include "tiler/finetune/plan_types.hpp"

namespace tiler {

// Parses and checks `o`'s flags; fills its defaulted report path (<output>.report.json).
FinetunePlan planFinetune(FinetuneOptions& o);

// The learning rate at `progress` (steps done / all steps) of the run: --lr after a linear warm-up of
// --warmup_epochs, constant or on a cosine to 0.
double learningRate(const FinetuneOptions& o, const FinetunePlan& plan, double progress);

}  // namespace tiler
