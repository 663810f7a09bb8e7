// tasks/registry: the tasks, one row each, in the order --task auto asks them (segment, classify, embed,
// detect, instances). Promise: every question about a task (which it is for a model's output, its outputs,
// its consumer) goes through its row; the rows are constant and read from any thread.
#pragma once

#include <string>
#include <vector>

#include "tiler/tasks/task.hpp"

namespace tiler {

// Every task, in the registry's order.
const std::vector<const Task*>& allTasks();
// The row of `task` (not kAuto: a ConfigError).
const Task& taskOf(ModelTask task);
// The task of a model whose output for one window has `sizes`, when `requested` (--task): the named task if
// it takes that shape, else the first that claims it for --task auto. Throws ModelError naming `path`, the
// shape and the --task choices for a shape no task takes or a task that does not take it.
ModelTask resolveTask(ModelTask requested, const std::vector<int64_t>& sizes, Activation activation,
                      bool classes_named, const std::string& path);
// "tiler takes NCHW maps (--task segment), ... or instance maps, [batch, 1 + K, h, w] (--task instances)".
std::string taskChoicesText();
// The consumer of each image's windows for `task`'s outputs (OutputOptions::consumer).
ConsumerFactory consumersFor(ModelTask task, TaskOutputs outputs);

}  // namespace tiler
