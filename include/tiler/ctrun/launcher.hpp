// launcher: ctrun, a torchrun-compatible launcher and supervisor for any program. No LibTorch.
// Promise: starts nproc_per_node workers with torchrun's environment (a Python script or module under the
// interpreter, as torchrun runs them; any other program as it is), supervises them as one group (the agent's
// state table, ctrun/agent.hpp), forwards signals, and never leaves an orphan or a zombie: workers get
// PR_SET_PDEATHSIG(SIGKILL), a failed group gets SIGTERM then SIGKILL after grace_period, sent to each
// worker's process group (what a worker started goes with it). Across nodes (nnodes > 1) the agents meet at a
// rendezvous store (ctrun/rendezvous/: static and c10d behind a registry): node ranks, one
// MASTER_ADDR:MASTER_PORT, heartbeats; a failure or a lost node on any node stops every node's workers, and
// all restart together while restarts remain (the restart count is the shared round). The summary names the
// first failure (root cause: the earliest, whichever node it was on).
// Layers (torch elastic's): ctrun/options (flags), ctrun/agent (the state table and the rounds),
// ctrun/worker_group (fork/exec, reaping), ctrun/streams (pipes, tee, log files), ctrun/failures (records,
// error files, the summary), ctrun/signals (the self-pipe), ctrun/rendezvous/ (handlers and their registry).
// Not thread safe: one Launcher per process, run() from the main thread (it installs signal handlers).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "tiler/core/error.hpp"

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
  double monitor_interval = 0.1;   // seconds
  double grace_period = 10.0;      // seconds between SIGTERM and SIGKILL
  std::string log_dir;             // empty: no log files
  std::string redirects = "0";     // 1 stdout, 2 stderr, 3 both only to log files; or LOCAL:N,... per rank
  std::string tee = "0";           // the same, to log files and console
  std::string local_ranks_filter;  // "0,2": only these local ranks' output on the console; empty: all
  // Signals that stop the workers, forwarded to them (torchrun 2.x's --signals_to_handle; SIGINT, SIGTERM,
  // SIGHUP and SIGQUIT always are, as SIGINT to the workers for SIGINT, else SIGTERM); e.g. Slurm's SIGUSR1.
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string run_id = "none";
  std::string role = "default";  // ROLE_NAME of the workers
  std::string local_addr;        // where the other nodes reach this one (c10d's MASTER_ADDR); empty: found
  std::string rdzv_conf;         // torchrun's KEY=VALUE,...: join_timeout, last_call_timeout, ...
  bool module = false;           // -m: the program is a Python module (python3 -u -m MODULE)
  bool no_python = false;        // run the program itself, never under the interpreter
  bool run_path = false;         // torchrun's runpy.run_path: the script under the interpreter
  std::vector<std::string> command;  // program (or script, or module) and its arguments, as given
};

// A worker could not be started (pipe, fork, a run directory): ctrun's own failure, not the program's.
class LaunchError : public Error {
 public:
  using Error::Error;
  const char* kind() const override { return "launch"; }
};

// Number of NVIDIA GPUs visible, found without CUDA (CUDA_VISIBLE_DEVICES, /dev/nvidiaN, nvidia-smi -L).
int countNvidiaGpus();
// The most workers ctrun starts on one node (torchrun has no bound; a typo of 100000 forks until the
// descriptors run out).
constexpr int kMaxWorkersPerNode = 1024;
// Resolves --nproc_per_node (cpu, and auto without a GPU: usableCpus()); throws ConfigError on nonsense and
// on more than kMaxWorkersPerNode (settleOptions also holds it to the open-file limit).
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

}  // namespace tiler
