#include "tiler/error.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>

#include "tiler/platform.hpp"

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
  // Best effort: the error is on its way to stderr already.
  (void)writeFileAtomically(path, [&](std::ostream& out) { out << j.dump() << "\n"; });
}

std::string withoutBacktrace(std::string what) {
  const auto cut = what.find("\nException raised from");
  if (cut != std::string::npos) what.resize(cut);
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return what;
}

int reportFatal(const std::string& tool, const std::exception& e) {
  std::string msg = errorRankPrefix() + withoutBacktrace(e.what());
  std::cerr << tool << ": error: " << msg << std::endl;
  writeElasticErrorFile(msg);
  return kExitFatal;
}

std::string describeException(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.message();
  } catch (const std::bad_alloc&) {
    return "out of memory (std::bad_alloc)";
  } catch (const std::exception& err) {
    const std::string what = withoutBacktrace(err.what());
    return what.empty() ? "unknown error" : what;
  } catch (...) {
    return "unknown exception";
  }
}

std::string describeImageException(const std::exception_ptr& e, const std::string& path) {
  std::string message = describeException(e);
  if (message.find(path) == std::string::npos) message = "'" + path + "': " + message;
  return message;
}

}  // namespace tiler
