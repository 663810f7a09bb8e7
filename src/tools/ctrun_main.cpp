// ctrun: torchrun's launcher contract in C++. Parses torchrun's flags and hands them to tiler::Launcher.
#include <iostream>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/launcher.hpp"
#include "tiler/ctrun/options.hpp"

int main(int argc, char** argv) {
  tiler::LaunchOptions o;
  if (const int code = tiler::ctrun::parseCtrunCommandLine(argc, argv, o, std::cerr); code >= 0) return code;
  try {
    return tiler::Launcher(o).run();
  } catch (const std::exception& e) {
    std::cerr << "ctrun: error: " << e.what() << std::endl;
    return tiler::kExitFatal;
  }
}
