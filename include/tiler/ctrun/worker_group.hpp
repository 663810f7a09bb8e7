// worker_group: one attempt's workers on this node (torch elastic's process context): each forked and
// exec'd in a process group of its own with torchrun's environment, its output carried by streams.hpp,
// reaped without blocking, and stopped together (SIGTERM to each group, SIGKILL after the grace period).
// It observes; the agent (agent.hpp) decides. No LibTorch.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tiler/ctrun/failures.hpp"
#include "tiler/ctrun/launch_options.hpp"
#include "tiler/ctrun/streams.hpp"

namespace tiler::ctrun {

// The environment a worker gets (added to the inherited one), exposed for tests.
std::map<std::string, std::string> workerEnvironment(const LaunchOptions& options, int nproc, int local_rank,
                                                     int restart_count, const std::string& error_file);

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  double exit_time = 0;
  std::string error_file;
  Stream out, err;
};

class WorkerGroup {
 public:
  // `command`: the argv every worker execs (options.hpp's workerCommand). `options` outlives the group.
  WorkerGroup(const LaunchOptions& options, std::vector<std::string> command, int nproc,
              std::string attempt_dir, int restart_count);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts every worker; LaunchError (after killing those already started) when one cannot be.
  void start();
  // Waits up to `timeout_ms` for output or a signal, drains output and reaps exited workers. Returns the
  // termination signal that reached ctrun meanwhile, or 0.
  int monitor(int timeout_ms);
  // SIGTERM (or `first_signal`) to every live worker, SIGKILL to what is left after the grace period (or at
  // once when a termination signal reaches ctrun meanwhile); drains output meanwhile and closes it. Returns
  // that signal, or 0: the caller decides what it means (after a failure: no restart).
  int stop(int first_signal);
  // Drains and closes every worker's output (all have exited).
  void closeStreams();

  int runningCount() const;
  bool allSucceeded() const { return started_ && runningCount() == 0 && failures_.empty(); }
  bool anyFailed() const { return !failures_.empty(); }
  // This node's failed workers, in the order they were reaped; those ctrun stopped are none (as torchrun's
  // summary has them not): one failed worker of three is one failure, on one node as across several.
  const std::vector<WorkerFailure>& failures() const { return failures_; }

 private:
  void reap();
  void signalAll(int sig);
  WorkerFailure failureOf(const Worker& w) const;
  void startWorker(int local_rank);
  void attachStreams(Worker& w, const std::string& worker_dir, const int out_pipe[2], const int err_pipe[2]);

  const LaunchOptions& options_;
  std::vector<std::string> command_;
  int nproc_;
  std::string attempt_dir_;
  int restart_count_;
  StdStreams redirects_;         // --tee needs nothing more: with --log_dir both logs are always written
  std::set<int> console_ranks_;  // empty: every local rank
  bool started_ = false;
  bool stopping_ = false;  // stop() began: what exits now was stopped, it did not fail
  std::vector<Worker> workers_;
  std::vector<WorkerFailure> failures_;
};

}  // namespace tiler::ctrun
