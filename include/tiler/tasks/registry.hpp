// tasks/registry: the tasks, one row each, in the order --task auto asks them (segment, classify, embed,
// detect, instances). A task is its row: --task NAME is looked up here, and a null `const Task*` is "auto"
// (no task chosen yet: the model's output says it). Promise: every question about a task (which it is for a
// model's output, its outputs, --save's help and refusals) goes through its row; the rows are constant and
// read from any thread.
#pragma once

#include <string>
#include <vector>

#include "tiler/tasks/task.hpp"

namespace tiler {

// Every task, in the registry's order.
const std::vector<const Task*>& allTasks();
// --task's word: the row named `name`, null for "auto"; ConfigError listing the words for any other.
const Task* findTask(const std::string& name);
// The word of `task`: its name, "auto" for null.
const char* taskName(const Task* task);
// "auto | segment | classify | ...": --task's words, for its help.
std::string taskWordsText();
// The first task that writes output kind `kind` (objects and objects_csv: detect); null: no such kind.
const Task* taskOfOutputKind(const std::string& kind);
// The task of a model whose output for one window has `sizes`, when `requested` (--task): the named task if
// it takes that shape, else (null: auto) the first that claims it. Throws ModelError naming `path`, the
// shape and the --task choices for a shape no task takes or a task that does not take it.
const Task& resolveTask(const Task* requested, const std::vector<int64_t>& sizes, Activation activation,
                        bool classes_named, const std::string& path);
// Checks that `task` writes every kind asked for (ConfigError naming the task that does), then settles it
// (Task::settle).
void settleTask(const Task& task, const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec);
// "tiler takes NCHW maps (--task segment), ... or instance maps, [batch, 1 + K, h, w] (--task instances)".
std::string taskChoicesText();
// "labels, probs and polygons (segment), ...": what --save takes, for its help and its refusals.
std::string saveKindsText();
// --save's help: each task's kinds and its defaults ("labels, probs, ... (segment; default labels), ...").
std::string saveHelpText();
// docs/cli.md's table of outputs, one line a format: its word, file, tasks (those that write it by default),
// what it takes, the feature it needs and what it is.
std::string outputsTableMarkdown();
// Every task's flags (Task::flags), in the registry's order, each once (a flag two tasks declare is the
// first's): what tiler infer's command line registers.
const std::vector<TaskFlag>& taskFlagDeclarations();
// Every task's settings, parsed from `values` (each task's flags as given) with the job's flags `job`.
TaskSettingsList parseTaskSettings(const FlagValues& values, const TaskFlags& job);
// The task flags that shape a stitched map (TaskFlag::map) whose value in `values` is not their default:
// "--blend", ...
std::vector<std::string> givenMapFlags(const FlagValues& values);
// The consumer of each image's windows for `task`'s outputs (OutputOptions::consumer).
ConsumerFactory consumersFor(const Task& task, TaskOutputs outputs);

}  // namespace tiler
