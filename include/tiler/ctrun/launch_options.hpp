// launch_options: what one ctrun is asked to do, as its flags settle it (options.hpp parses and checks them):
// the one record every layer of ctrun reads. No LibTorch.
#pragma once

#include <string>
#include <vector>

namespace tiler {

struct LaunchOptions {
  std::string nproc_per_node = "1";     // N | auto | gpu | cpu
  int nnodes = 1;                       // nodes of the current world (set from nnodes_range at rendezvous)
  std::string nnodes_range;             // --nnodes N | MIN:MAX; empty: 1
  int node_rank = -1;                   // --node_rank; -1: assigned at rendezvous (0 on one node)
  std::string rdzv_backend = "static";  // static: --node_rank given; c10d, file: node ranks assigned
  // HOST:PORT of the agents' store (static default MASTER_ADDR:MASTER_PORT+1), or file's shared directory
  std::string rdzv_endpoint;
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

}  // namespace tiler
