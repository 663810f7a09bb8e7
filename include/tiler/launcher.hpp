// launcher: ctrun, a torchrun-compatible launcher and supervisor for any program. No LibTorch.
// Promise: starts nproc_per_node workers with torchrun's environment, supervises them as one group (an
// explicit state machine: kInit -> kHealthy -> kSucceeded | kFailed -> kStopping -> restart or kDone),
// forwards signals, and never leaves an orphan or a zombie: workers get PR_SET_PDEATHSIG(SIGKILL), a failed
// group gets SIGTERM then SIGKILL after grace_period, sent to each worker's process group (what a worker
// started goes with it). Across nodes (nnodes > 1) the agents meet at a rendezvous store (rendezvous.hpp):
// node ranks, one MASTER_ADDR:MASTER_PORT, heartbeats; a failure or a lost node on any node stops every
// node's workers, and all restart together while restarts remain (the restart count is the shared round).
// The summary names the first failure (root cause: the earliest, whichever node it was on).
// Not thread safe: one Launcher per process, run() from the main thread (it installs signal handlers).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace tiler {

struct LaunchOptions {
  std::string nproc_per_node = "1";     // N | auto | gpu | cpu
  int nnodes = 1;                       // nodes of the current world (set from nnodes_range at rendezvous)
  std::string nnodes_range;             // --nnodes N | MIN:MAX; empty: 1
  int node_rank = -1;                   // --node_rank; -1: assigned at rendezvous (0 on one node)
  std::string rdzv_backend = "static";  // static: --node_rank given; c10d: node ranks assigned
  std::string rdzv_endpoint;   // HOST:PORT of the agents' store; static default MASTER_ADDR:MASTER_PORT+1
  double rdzv_timeout = 900;   // seconds to wait for the other nodes at each rendezvous
  double rdzv_last_call = 30;  // MIN:MAX: seconds to wait for more nodes once MIN have joined
  double heartbeat_interval = 1.0;
  double heartbeat_timeout = 10.0;  // a node silent this long is lost
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0: pick a free port
  bool standalone = false;
  int max_restarts = 0;
  double monitor_interval = 0.1;  // seconds
  double grace_period = 10.0;     // seconds between SIGTERM and SIGKILL
  std::string log_dir;            // empty: no log files
  int redirects = 0;              // bit 1: stdout, bit 2: stderr only to log files
  int tee = 0;                    // bit 1: stdout, bit 2: stderr to log files and console
  std::string run_id = "none";
  std::vector<std::string> command;  // program and its arguments
};

// Number of NVIDIA GPUs visible, found without CUDA (CUDA_VISIBLE_DEVICES, /dev/nvidiaN, nvidia-smi -L).
int countNvidiaGpus();
// Resolves --nproc_per_node (cpu, and auto without a GPU: usableCpus()); throws ConfigError on nonsense.
int resolveNprocPerNode(const std::string& spec);
// A free TCP port on 127.0.0.1 (bound and released).
int findFreePort();
// True when the TCP port can be bound on all interfaces right now.
bool portIsFree(int port);

// The environment a worker gets (added to the inherited one), exposed for tests.
std::map<std::string, std::string> workerEnvironment(const LaunchOptions& options, int nproc, int local_rank,
                                                     int restart_count, const std::string& error_file);

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

class Launcher {
 public:
  explicit Launcher(LaunchOptions options);
  // Runs the group to completion; returns ctrun's exit code (0, the root cause's code, or 128+signal).
  int run();

 private:
  LaunchOptions options_;
};

// The worker group's states.
enum class GroupState { kInit, kHealthy, kSucceeded, kFailed, kStopping, kDone };

}  // namespace tiler
