// failures: what ctrun knows of a failed worker or a lost node (torch elastic's errors/): the record read
// from the worker's exit and its error file, the record's JSON form on the rendezvous store (every node's
// failures in one place), and the summary that names the root cause first; and LaunchError, ctrun's own
// failure to start a worker. No LibTorch.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/launch_options.hpp"

namespace tiler {

// A worker could not be started (pipe, fork, a run directory): ctrun's own failure, not the program's.
class LaunchError : public Error {
 public:
  using Error::Error;
  const char* kind() const override { return "launch"; }
};

struct WorkerFailure {
  int node = 0;       // the node's rank
  std::string host;   // where it ran
  bool lost = false;  // the node's agent stopped answering (no worker exit is known)
  int rank = -1;
  int local_rank = -1;
  pid_t pid = -1;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;
  double time = 0;  // seconds since the epoch
  std::string error_file;
  std::string error_message;  // from the worker's error file, if it wrote one
};

}  // namespace tiler

namespace tiler::ctrun {

double nowSeconds();
std::string hostName();
// "SIGSEGV", or "signal N" for one without a name.
std::string signalName(int sig);

// The message of a worker's error file: tiler's and torchrun's formats ({"message": "..."} and
// {"message": {"message": ...}}), or the text itself; "" when there is none.
std::string errorMessageFromFile(const std::string& path);

nlohmann::json failureToJson(const WorkerFailure& f);
// The record `failureToJson` wrote; nlohmann::json's exception when a field is missing or mistyped.
WorkerFailure failureFromJson(const nlohmann::json& j);

// The failure "ctrun on this node received SIG..." other nodes see when this agent is interrupted.
WorkerFailure interruptedAgent(int node_rank, int sig);

// Prints the group's failure summary on stderr, root cause (the first record) first.
void printSummary(const std::vector<WorkerFailure>& failures, const LaunchOptions& options, int attempts);

}  // namespace tiler::ctrun
