#include "tiler/error.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

namespace tiler {
namespace {
std::string& rankPrefixStorage() {
  static std::string prefix;
  return prefix;
}

std::string withLocation(const std::string& what, const char* file, int line) {
  if (file == nullptr) return what;
  std::string f = file;
  auto slash = f.find_last_of('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return what + " [" + f + ":" + std::to_string(line) + "]";
}
}  // namespace

Error::Error(const std::string& what, const char* file, int line)
    : std::runtime_error(withLocation(what, file, line)), message_(what) {}

void setErrorRankPrefix(const std::string& prefix) {
  rankPrefixStorage() = prefix;
}
const std::string& errorRankPrefix() {
  return rankPrefixStorage();
}

void writeElasticErrorFile(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  const char* rank = std::getenv("RANK");
  nlohmann::json j = {
      {"message", message},
      {"rank", rank ? std::atoi(rank) : 0},
      {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}};
  std::string tmp = std::string(path) + ".partial";
  {
    std::ofstream out(tmp);
    if (!out) return;
    out << j.dump() << "\n";
    if (!out) return;
  }
  std::rename(tmp.c_str(), path);
}

int reportFatal(const std::string& tool, const std::exception& e) {
  std::string msg = errorRankPrefix() + e.what();
  std::cerr << tool << ": error: " << msg << std::endl;
  writeElasticErrorFile(msg);
  return kExitFatal;
}

}  // namespace tiler
