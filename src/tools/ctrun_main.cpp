// ctrun: torchrun's launcher contract in C++. Parses flags and hands them to tiler::Launcher.
#include <CLI/CLI.hpp>
#include <iostream>

#include "tiler/cli.hpp"
#include "tiler/error.hpp"
#include "tiler/launcher.hpp"
#include "tiler/version.hpp"

int main(int argc, char** argv) {
  using tiler::flagNames;
  tiler::LaunchOptions o;
  CLI::App app{"ctrun: start and supervise N worker processes the way torchrun does"};
  app.prefix_command();  // everything from the program name on belongs to the program
  app.set_version_flag("--version", [] {
    std::string info = tiler::buildInfo("ctrun");
    info += "NVIDIA GPUs visible: " + std::to_string(tiler::countNvidiaGpus()) + "\n";
    return info;
  });
  app.add_option(flagNames("--nproc_per_node"), o.nproc_per_node, "workers on this node: N, auto, gpu or cpu")
      ->capture_default_str();
  app.add_option(flagNames("--nnodes"), o.nnodes_range, "nodes: N, or MIN:MAX (c10d rendezvous)")
      ->default_str("1");
  app.add_option(flagNames("--node_rank"), o.node_rank, "rank of this node (static; c10d assigns them)");
  app.add_option(flagNames("--rdzv_backend"), o.rdzv_backend, "static | c10d")->capture_default_str();
  app.add_option(flagNames("--rdzv_endpoint"), o.rdzv_endpoint,
                 "HOST:PORT of the agents' rendezvous store, hosted by the agent on HOST (static default: "
                 "MASTER_ADDR:MASTER_PORT+1)");
  app.add_option(flagNames("--rdzv_id"), o.run_id, "the job's id, the same on every node (= --run_id)");
  app.add_option(flagNames("--rdzv_timeout"), o.rdzv_timeout, "seconds to wait for the other nodes")
      ->capture_default_str();
  app.add_option(flagNames("--rdzv_last_call"), o.rdzv_last_call,
                 "with MIN:MAX nodes, seconds to wait for more once MIN have joined")
      ->capture_default_str();
  app.add_option(flagNames("--heartbeat_interval"), o.heartbeat_interval, "seconds between node heartbeats")
      ->capture_default_str();
  app.add_option(flagNames("--heartbeat_timeout"), o.heartbeat_timeout,
                 "seconds of silence after which a node is lost")
      ->capture_default_str();
  app.add_option(flagNames("--master_addr"), o.master_addr, "address of rank 0's node")
      ->capture_default_str();
  app.add_option(flagNames("--master_port"), o.master_port,
                 "port of the c10d store on rank 0 (0: a free one)")
      ->capture_default_str();
  app.add_flag("--standalone", o.standalone, "one node, a free port on 127.0.0.1 and a random run id");
  app.add_option(flagNames("--max_restarts"), o.max_restarts, "restarts of a failed worker group")
      ->capture_default_str();
  app.add_option(flagNames("--monitor_interval"), o.monitor_interval, "seconds between worker checks")
      ->capture_default_str();
  app.add_option(flagNames("--grace_period"), o.grace_period, "seconds between SIGTERM and SIGKILL")
      ->capture_default_str();
  app.add_option(flagNames("--log_dir"), o.log_dir, "write <dir>/<run_id>/attempt_<k>/<local_rank>/*.log");
  app.add_option(flagNames("-r,--redirects"), o.redirects,
                 "with --log_dir: 1 stdout, 2 stderr, 3 both only to logs")
      ->check(CLI::Range(0, 3));
  app.add_option(flagNames("-t,--tee"), o.tee,
                 "with --log_dir: 1 stdout, 2 stderr, 3 both to logs and console")
      ->check(CLI::Range(0, 3));
  app.add_option(flagNames("--run_id"), o.run_id, "run id shown to workers")->capture_default_str();
  if (const int code = tiler::parseCommandLine(app, argc, argv, "ctrun"); code >= 0) return code;
  o.command = app.remaining();
  // The program starts at the first word CLI11 does not know; one that looks like a flag is a typo, as
  // torchrun's argparse says (a program really named so can follow "--").
  if (!o.command.empty() && o.command.front() != "--" && o.command.front().rfind('-', 0) == 0) {
    std::cerr << "ctrun: error: unknown option '" << o.command.front()
              << "'\nRun 'ctrun --help' for the flags." << std::endl;
    return tiler::kExitFatal;
  }
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  try {
    if (o.command.empty())
      throw tiler::ConfigError("no program given (usage: ctrun [OPTIONS] PROGRAM [ARGS...])");
    return tiler::Launcher(o).run();
  } catch (const std::exception& e) {
    std::cerr << "ctrun: error: " << e.what() << std::endl;
    return tiler::kExitFatal;
  }
}
