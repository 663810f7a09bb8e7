// options: ctrun's command line, which is torchrun's (1.x and 2.x: every flag, both spellings, PET_* from
// the environment, the -r/-t mapping forms, script and module modes) plus ctrun's own rendezvous timings,
// and the checks that settle it before any worker starts. A torchrun flag that cannot mean anything for ctrun
// is accepted with one line saying so, never refused. No LibTorch.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tiler/ctrun/launch_options.hpp"

namespace tiler::ctrun {

// The longest duration a flag may hold, as tiler's --timeout: 2^31-1 ms, what poll() and the store's
// millisecond timers hold (24.8 days).
constexpr double kMaxLaunchSeconds = 2147483.647;

class RendezvousBackend;

// What ctrun's flags settle: the nodes the world may have, the workers of this node, and the rendezvous
// backend that settled its flags and that the agent then joins and leaves with.
struct LaunchPlan {
  int min_nodes = 1, max_nodes = 1;
  int nproc = 1;
  std::vector<int> signals;  // --signals_to_handle's, by number
  std::shared_ptr<RendezvousBackend> rendezvous;
  bool multi() const { return max_nodes > 1; }
};

// Number of NVIDIA GPUs visible, found without CUDA (CUDA_VISIBLE_DEVICES, /dev/nvidiaN, nvidia-smi -L).
int countNvidiaGpus();
// The most workers ctrun starts on one node (torchrun has no bound; a typo of 100000 forks until the
// descriptors run out).
constexpr int kMaxWorkersPerNode = 1024;
// Resolves --nproc_per_node (cpu, and auto without a GPU: usableCpus()); throws ConfigError on nonsense and
// on more than kMaxWorkersPerNode (settleOptions also holds it to the open-file limit).
int resolveNprocPerNode(const std::string& spec);
// --nnodes: "N" or "MIN:MAX" -> (min, max); throws ConfigError.
std::pair<int, int> parseNodeRange(const std::string& spec);

// Parses ctrun's argv into `o`. Returns -1 to go on, else the exit code: 0 after --help or --version, 1 for
// a bad flag or no program (the message on stderr). Each flag given that means nothing for ctrun gets one
// line on `notes`.
int parseCtrunCommandLine(int argc, char** argv, LaunchOptions& o, std::ostream& notes);

// The argv each worker execs, as torchrun builds it: with --run_path, or for a Python script (a name ending
// in .py, or a file that is not executable), `python3 -u SCRIPT ARGS`; with -m, `python3 -u -m MODULE ARGS`;
// with --no_python, or for any other program, the command as it is. PYTHON_EXEC names another interpreter
// (as torchrun's); python3 is found on PATH.
std::vector<std::string> workerCommand(const LaunchOptions& o);

// Checks ctrun's flags (ConfigError naming the flag) and fills in what they leave to it: one node's rank,
// a static world's endpoint, a free port and a run id for one node; makes the rendezvous backend, which
// checks its own flags.
LaunchPlan settleOptions(LaunchOptions& o);

}  // namespace tiler::ctrun
