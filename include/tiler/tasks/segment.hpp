// tasks/segment: the task segment: a map a window (NCHW), blended into one map an image (blend,
// device_stitch) and written by its map writers (map_writers: labels, probs, polygons, zarr).
#pragma once

#include "tiler/tasks/task.hpp"

namespace tiler {

// The registry's row.
const Task& segmentTask();

}  // namespace tiler
