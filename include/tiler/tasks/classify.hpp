// tasks/classify: the task classify: one vector of K class scores a window (window_outputs: csv, tiles,
// heatmap).
#pragma once

#include "tiler/tasks/task.hpp"

namespace tiler {

// The registry's row.
const Task& classifyTask();

}  // namespace tiler
