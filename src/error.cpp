#include "tiler/error.hpp"

#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <thread>

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

std::optional<Fault> Fault::fromEnvironment() {
  const char* spec = std::getenv("TILER_FAULT");
  if (spec == nullptr || *spec == '\0') return std::nullopt;
  // Only the first attempt faults, so that a restarted group (ctrun --max_restarts) can finish.
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (restart != nullptr && std::string(restart) != "0") return std::nullopt;
  Fault f;
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    auto colon = part.find(':');
    TILER_CHECK(colon != std::string::npos, ConfigError, "TILER_FAULT: bad item '" << part << "'");
    std::string key = part.substr(0, colon), value = part.substr(colon + 1);
    try {
      if (key == "rank")
        f.rank = std::stoi(value);
      else if (key == "after_windows")
        f.after_windows = std::stoll(value);
      else if (key == "kind")
        f.kind = value;
      else if (key == "stage")
        f.stage = value;
      else
        TILER_THROW(ConfigError, "TILER_FAULT: unknown key '" << key << "'");
    } catch (const std::logic_error&) {
      TILER_THROW(ConfigError, "TILER_FAULT: '" << value << "' is not a number");
    }
  }
  TILER_CHECK(
      f.kind == "crash" || f.kind == "hang" || f.kind == "exit" || f.kind == "throw" || f.kind == "oom",
      ConfigError, "TILER_FAULT: kind must be crash, hang, exit, throw or oom");
  if (f.kind == "oom") f.stage = "forward";
  if (f.kind == "throw") {
    TILER_CHECK(f.stage == "read" || f.stage == "forward" || f.stage == "write" || f.stage == "checkpoint",
                ConfigError, "TILER_FAULT: kind:throw needs stage:read|forward|write|checkpoint");
  }
  return f;
}

bool Fault::hits(int rank_, const std::string& stage_, int64_t windows) const {
  return rank == rank_ && stage == stage_ && windows >= after_windows;
}

void Fault::trigger(const std::string& what) const {
  std::cerr << "tiler: TILER_FAULT: injecting '" << kind << "' " << what << std::endl;
  if (kind == "crash") raise(SIGSEGV);
  if (kind == "exit") std::_Exit(3);
  if (kind == "throw") throw std::runtime_error("TILER_FAULT: injected failure " + what);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace tiler
