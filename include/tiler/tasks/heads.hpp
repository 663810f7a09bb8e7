// tasks/heads: a model with several outputs (a tuple's or a dict's tensors) run once per batch, each output
// ("head") its own task with its own outputs. --heads names them: NAME[:TASK],... (NAME: a dict key, else a
// tuple index; TASK: headTaskWords(), default --task); --head_opt NAME.KEY=VALUE (repeatable; KEY:
// headSettingWords()) gives a head its own flag, where the job-wide one is the
// default. Plain parsing: ConfigError naming the flag and the part that is wrong.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tiler {

class Task;

struct HeadSpec {
  std::string name;                 // its outputs: <stem>_<name>_...; the model output's key or index
  std::optional<const Task*> task;  // unset: --task; null: auto (the registry's row otherwise)
  // Its own flags (--head_opt NAME.KEY=VALUE) by KEY, one of headSettingWords(); a flag not here is the
  // job-wide one.
  std::map<std::string, std::string> settings;
  // Its own value of flag `key`; unset: the job-wide flag.
  std::optional<std::string> setting(const std::string& key) const;
};

// "segment, classify, embed or regress": the tasks a head can be, those whose windows send their predictions
// (a task whose windows send records runs alone), in the registry's order.
std::string headTaskWords();
// "activation, classes, save or probs_dtype": --head_opt's keys: the job's flags a head may set for itself,
// then the tasks' flags that say so (TaskFlag::head).
std::string headSettingWords();
// --heads and its --head_opt settings; empty `heads`: none (one output, --output_key).
std::vector<HeadSpec> parseHeads(const std::string& heads, const std::vector<std::string>& options);

}  // namespace tiler
