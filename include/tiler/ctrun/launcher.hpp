// launcher: ctrun, a torchrun-compatible launcher and supervisor for any program. No LibTorch.
// Promise: starts nproc_per_node workers with torchrun's environment (a Python script or module under the
// interpreter, as torchrun runs them; any other program as it is), supervises them as one group (the agent's
// state table, ctrun/agent.hpp), forwards signals, and never leaves an orphan or a zombie: workers get
// PR_SET_PDEATHSIG(SIGKILL), a failed group gets SIGTERM then SIGKILL after grace_period, sent to each
// worker's process group (what a worker started goes with it). Across nodes (nnodes > 1) the agents meet at a
// rendezvous store (ctrun/rendezvous/: static, c10d and file behind a registry): node ranks, one
// MASTER_ADDR:MASTER_PORT, heartbeats; a failure or a lost node on any node stops every node's workers, and
// all restart together while restarts remain (the restart count is the shared round). The summary names the
// first failure (root cause: the earliest, whichever node it was on).
// Layers (torch elastic's): ctrun/launch_options (the settled flags), ctrun/options (parsing them),
// ctrun/agent (the state table and the rounds), ctrun/worker_group (fork/exec, reaping), ctrun/streams
// (pipes, tee, log files), ctrun/failures (records, error files, the summary), ctrun/signals (the self-pipe),
// ctrun/rendezvous/ (the backends and their registry). Not thread safe: one Launcher per process, run() from
// the main thread (it installs signal handlers).
#pragma once

#include "tiler/ctrun/launch_options.hpp"

namespace tiler {

class Launcher {
 public:
  explicit Launcher(LaunchOptions options);
  // Runs the group to completion; returns ctrun's exit code (0, the root cause's code, or 128+signal).
  int run();

 private:
  LaunchOptions options_;
};

}  // namespace tiler
