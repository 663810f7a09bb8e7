// cli_commands: tiler's subcommands, each a function of its argv (its flags parsed into the library's
// parameter structs, a model card's settings taken for the flags not given, then the library called). The
// command's main dispatches to them, and the Python module (python/) builds an argv from keywords, so that
// both take the same flags with the same checks and words.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "tiler/infer/options.hpp"

namespace tiler::tools {

// What a caller other than the command's main asks of a subcommand; the defaults are the command's.
struct CommandHooks {
  // A bad flag throws a ConfigError holding CLI11's message, where the command prints it and returns 1.
  bool throw_parse_errors = false;
  // infer: InferOptions::after_step.
  std::function<void(int64_t done, int64_t total)> after_step;
  // infer, finetune: JobOptions::check_interrupt.
  std::function<void()> check_interrupt;
  // infer: InferOptions::load_model.
  ModelLoader load_model;
  // infer, finetune: set to the path of the report the run writes, before it runs.
  std::string* report_path = nullptr;
};

// Each returns the command's exit code (0 after --help); a fatal error is thrown.
int runInferCli(int argc, char** argv, const CommandHooks& hooks = {});
int runFinetuneCli(int argc, char** argv, const CommandHooks& hooks = {});
int runInfoCli(int argc, char** argv);
int runOverlayCli(int argc, char** argv);
int runCheckModelCli(int argc, char** argv);
int runViewCli(int argc, char** argv);

}  // namespace tiler::tools
