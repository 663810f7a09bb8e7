#include "tiler/cli.hpp"

#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>

#include "tiler/error.hpp"

namespace tiler {

std::string flagNames(const std::string& names) {
  std::string out = names;
  std::stringstream ss(names);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.rfind("--", 0) != 0 || part.find('_') == std::string::npos) continue;
    std::string kebab = part;
    for (auto& c : kebab) c = c == '_' ? '-' : c;
    out += "," + kebab;
  }
  return out;
}

int parseCommandLine(CLI::App& app, int argc, char** argv, const std::string& tool) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version: printed, exit 0
  } catch (const CLI::ParseError& e) {
    std::cerr << tool << ": error: " << e.what() << "\nRun '" << tool << " --help' for the flags."
              << std::endl;
    return kExitFatal;
  }
}

}  // namespace tiler
