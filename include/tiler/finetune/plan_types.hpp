// finetune/plan_types: what `tiler finetune`'s plan holds (FinetunePlan: the flags parsed into typed values,
// the label source chosen), apart from the planning (plan.hpp), so that the label sources, which the planning
// chooses among, read a plan without depending on it. Plain data.
#pragma once

#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/dist/loader.hpp"

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

}  // namespace tiler
