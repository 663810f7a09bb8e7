#include "tiler/ctrun/failures.hpp"

#include <string.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <sstream>

#include "tiler/core/platform.hpp"

namespace tiler::ctrun {
namespace {

std::string formatTime(double t) {
  std::time_t secs = std::time_t(t);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

void printFailure(std::ostream& os, const WorkerFailure& f, const LaunchOptions& options) {
  if (f.lost) {
    os << "  node:        " << f.node << " LOST (" << f.error_message << ")\n"
       << "  host:        " << f.host << "\n"
       << "  time:        " << formatTime(f.time) << "\n";
    return;
  }
  os << "  rank:        " << f.rank << " (local_rank " << f.local_rank
     << (options.nnodes > 1 ? ", node " + std::to_string(f.node) : std::string()) << ")\n"
     << "  host:        " << (f.host.empty() ? hostName() : f.host) << "\n"
     << "  pid:         " << f.pid << "\n"
     << "  time:        " << formatTime(f.time) << "\n";
  if (f.signal != 0) {
    os << "  exitcode:    " << -f.signal << " (signal " << f.signal << ": " << signalName(f.signal) << ")\n";
  } else {
    os << "  exitcode:    " << f.exit_code << "\n";
  }
  os << "  error_file:  " << (f.error_message.empty() ? "<N/A>" : f.error_file) << "\n";
  if (!f.error_message.empty()) os << "  error:       " << f.error_message << "\n";
}

}  // namespace

double nowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string signalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string errorMessageFromFile(const std::string& path) {
  std::string text = readWholeFile(path);
  if (text.empty()) return "";
  try {
    auto j = nlohmann::json::parse(text);
    if (j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
    // torchelastic's own format: {"message": {"message": ..., "extraInfo": ...}}
    if (j.contains("message") && j["message"].contains("message"))
      return j["message"]["message"].get<std::string>();
  } catch (const std::exception&) {
  }
  return text;
}

nlohmann::json failureToJson(const WorkerFailure& f) {
  return {{"node", f.node},
          {"host", f.host},
          {"lost", f.lost},
          {"rank", f.rank},
          {"local_rank", f.local_rank},
          {"pid", f.pid},
          {"exit_code", f.exit_code},
          {"signal", f.signal},
          {"time", f.time},
          {"error_file", f.error_file},
          {"error_message", utf8Safe(f.error_message)}};
}

WorkerFailure failureFromJson(const nlohmann::json& j) {
  WorkerFailure f;
  f.node = j.at("node");
  f.host = j.at("host");
  f.lost = j.at("lost");
  f.rank = j.at("rank");
  f.local_rank = j.at("local_rank");
  f.pid = j.at("pid");
  f.exit_code = j.at("exit_code");
  f.signal = j.at("signal");
  f.time = j.at("time");
  f.error_file = j.at("error_file");
  f.error_message = j.at("error_message");
  return f;
}

WorkerFailure interruptedAgent(int node_rank, int sig) {
  WorkerFailure f;
  f.node = node_rank;
  f.host = hostName();
  f.time = nowSeconds();
  f.exit_code = 128 + sig;
  f.error_message = "ctrun on this node received " + signalName(sig);
  return f;
}

void printSummary(const std::vector<WorkerFailure>& failures, const LaunchOptions& options, int attempts) {
  std::ostringstream os;
  os << "ctrun: worker group FAILED (" << failures.size() << " worker(s) failed, attempt " << attempts
     << " of " << options.max_restarts + 1 << ", run_id " << options.run_id << ")\n";
  for (size_t i = 0; i < failures.size(); ++i) {
    os << (i == 0 ? "Root cause (first failure):\n" : i == 1 ? "Other failures:\n" : "");
    printFailure(os, failures[i], options);
  }
  writeAll(2, os.str());
}

}  // namespace tiler::ctrun
