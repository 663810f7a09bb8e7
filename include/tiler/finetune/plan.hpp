// finetune/plan: `tiler finetune`'s flags parsed and checked once, into typed values the trainer's parts read
// (as infer's plan is; numbers are read from FinetuneOptions as given).
// Promise: planFinetune throws a ConfigError naming the flag for any value training cannot run, in the order
// and words the command has always used; the label source's own flags are its row's to check
// (label_source.hpp). What depends on the model (its classes, the task a window label trains) is settled once
// it is probed.
#pragma once

#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/finetune/finetune.hpp"

namespace tiler {

enum class LossKind { kCe, kBce, kMse, kDice };  // --loss
enum class OptimizerKind { kAdam, kSgd };        // --optimizer
enum class Schedule { kConstant, kCosine };      // --schedule

struct LabelSourceRow;  // label_source.hpp

struct FinetunePlan {
  GridSpec spec;
  PadMode pad = PadMode::kReflect;
  LossKind loss = LossKind::kCe;
  OptimizerKind optimizer = OptimizerKind::kAdam;
  Schedule schedule = Schedule::kConstant;
  const LabelSourceRow* labels = nullptr;  // the one of --labels, --annotations, --window_labels given
  std::vector<std::string> class_names;    // --classes (empty: unnamed)
  bool unlabeled_background = false;       // --unlabeled background
  bool auto_class_weights = false;         // --class_weights auto: counted from the training windows
  std::vector<float> class_weights;        // --class_weights w1,w2,...; empty: none (or auto)
};

// Parses and checks `o`'s flags; fills its defaulted report path (<output>.report.json).
FinetunePlan planFinetune(FinetuneOptions& o);

// The learning rate at `progress` (steps done / all steps) of the run: --lr after a linear warm-up of
// --warmup_epochs, constant or on a cosine to 0.
double learningRate(const FinetuneOptions& o, const FinetunePlan& plan, double progress);

}  // namespace tiler
