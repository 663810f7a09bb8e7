// cli: helpers shared by the tools' option tables. Every flag is accepted as --snake_case and
// --kebab-case, as torchrun does.
#pragma once

#include <string>

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace tiler {

// Parses argv into `app`, and a --config file's keys with the same rules (a key that names no flag is an
// error there too, as a mistyped flag is on the command line). Returns -1 when the tool should go on;
// otherwise the exit code: 0 after --help or
// --version (printed), 1 (kExitFatal) for a bad flag, with CLI11's message and a pointer to `<tool> --help`
// on stderr; with `throw_errors`, a bad flag throws a ConfigError holding CLI11's message instead.
int parseCommandLine(CLI::App& app, int argc, char** argv, const std::string& tool,
                     bool throw_errors = false);

// "-i,--input_dir" -> "-i,--input_dir,--input-dir": the CLI11 name list with both spellings.
std::string flagNames(const std::string& names);

// Number checks for option tables, with short messages ("must be > 0; got -1"; CLI11's own ranges print
// their bound, DBL_MAX, in 300 digits). Each also refuses nan and inf.
CLI::Validator finiteNumber();       // any finite number
CLI::Validator positiveNumber();     // finite and > 0
CLI::Validator nonNegativeNumber();  // finite and >= 0
// The whole of `text` as a number (std::stod's syntax, nothing after it); false when it is none.
bool parseNumber(const std::string& text, double& value);

}  // namespace tiler
