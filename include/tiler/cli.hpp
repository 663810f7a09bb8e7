// cli: helpers shared by the tools' option tables. Every flag is accepted as --snake_case and
// --kebab-case, as torchrun does.
#pragma once

#include <string>

namespace tiler {

// "-i,--input_dir" -> "-i,--input_dir,--input-dir": the CLI11 name list with both spellings.
std::string flagNames(const std::string& names);

}  // namespace tiler
