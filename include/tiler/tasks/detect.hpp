// tasks/detect: the task detect: N boxes a window, [N, 6] (x1, y1, x2, y2, score, class in window pixels),
// kept by the window whose core holds their centre where they ran and sent to the owner as records
// (window_outputs: objects, objects_csv, coco).
#pragma once

#include "tiler/tasks/task.hpp"

namespace tiler {

// The registry's row.
const Task& detectTask();

}  // namespace tiler
