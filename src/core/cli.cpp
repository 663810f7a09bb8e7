#include "tiler/core/cli.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>
#include <sstream>

#include "tiler/core/error.hpp"

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

namespace {

CLI::Validator numberCheck(const std::string& name, const std::string& requirement, bool (*accept)(double)) {
  return CLI::Validator(
      [requirement, accept](std::string& text) -> std::string {
        double value = 0;
        if (!parseNumber(text, value)) return "not a number: '" + text + "'";
        if (!std::isfinite(value) || !accept(value)) return "must be " + requirement + "; got " + text;
        return "";
      },
      requirement, name);
}

}  // namespace

bool parseNumber(const std::string& text, double& value) {
  size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  return used > 0 && used == text.size();
}

CLI::Validator finiteNumber() {
  return numberCheck("FINITE", "a finite number", [](double) { return true; });
}
CLI::Validator positiveNumber() {
  return numberCheck("POSITIVE", "> 0", [](double v) { return v > 0; });
}
CLI::Validator nonNegativeNumber() {
  return numberCheck("NONNEGATIVE", ">= 0", [](double v) { return v >= 0; });
}

int parseCommandLine(CLI::App& app, int argc, char** argv, const std::string& tool, bool throw_errors) {
  app.allow_config_extras(false);
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version: printed, exit 0
  } catch (const CLI::ParseError& e) {
    if (throw_errors) throw ConfigError(e.what());
    std::cerr << tool << ": error: " << e.what() << "\nRun '" << tool << " --help' for the flags."
              << std::endl;
    return kExitFatal;
  }
}

}  // namespace tiler
