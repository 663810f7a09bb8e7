// tasks/embed: the task embed: one feature vector a window, an encoder's (window_outputs: features,
// features_pt).
#pragma once

#include "tiler/tasks/task.hpp"

namespace tiler {

// The registry's row.
const Task& embedTask();

}  // namespace tiler
