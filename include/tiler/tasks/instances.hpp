// tasks/instances: the task instances: a map of object ids and K class scores a window, [1 + K, h, w], whose
// objects are found and kept where the window ran and sent to the owner as records (instances: objects,
// objects_csv, instances).
#pragma once

#include "tiler/tasks/task.hpp"

namespace tiler {

// The registry's row.
const Task& instancesTask();

}  // namespace tiler
