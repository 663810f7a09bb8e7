// cli: helpers shared by the tools' option tables. Every flag is accepted as --snake_case and
// --kebab-case, as torchrun does.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace tiler {

// Parses argv into `app`. Returns -1 when the tool should go on; otherwise the exit code: 0 after --help or
// --version (printed), 1 (kExitFatal) for a bad flag, with CLI11's message and a pointer to `<tool> --help`
// on stderr.
int parseCommandLine(CLI::App& app, int argc, char** argv, const std::string& tool);

// "-i,--input_dir" -> "-i,--input_dir,--input-dir": the CLI11 name list with both spellings.
std::string flagNames(const std::string& names);

}  // namespace tiler
