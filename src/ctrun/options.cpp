#include "tiler/ctrun/options.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "tiler/core/cli.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/core/version.hpp"
#include "tiler/ctrun/rendezvous/registry.hpp"
#include "tiler/ctrun/signals.hpp"
#include "tiler/ctrun/streams.hpp"
#include "tiler/net/tcp_store.hpp"

namespace tiler::ctrun {
namespace {

// torchrun's flags that cannot mean anything for ctrun: accepted, each given one noted.
struct MeaninglessFlags {
  std::string start_method = "spawn", event_log_handler = "null", logs_specs, numa_binding;
};

// torchrun reads every flag also from PET_<NAME> (torch.distributed.argparse_util's env action).
std::string petName(const std::string& names) {
  std::string name = names.substr(names.rfind("--") + 2);
  for (auto& c : name) c = c == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(c)));
  return "PET_" + name;
}

template <typename T>
CLI::Option* torchrunOption(CLI::App& app, const std::string& names, T& value, const std::string& help) {
  return app.add_option(flagNames(names), value, help)->envname(petName(names));
}

CLI::Option* torchrunFlag(CLI::App& app, const std::string& names, bool& value, const std::string& help) {
  return app.add_flag(flagNames(names), value, help)->envname(petName(names));
}

void addWorldOptions(CLI::App& app, LaunchOptions& o) {
  torchrunOption(app, "--nnodes", o.nnodes_range, "nodes: N, or MIN:MAX (c10d and file rendezvous)")
      ->default_str("1");
  torchrunOption(app, "--nproc_per_node", o.nproc_per_node, "workers on this node: N, auto, gpu or cpu")
      ->capture_default_str();
  torchrunOption(app, "--rdzv_backend", o.rdzv_backend, rendezvousBackendNames())->capture_default_str();
  torchrunOption(app, "--rdzv_endpoint", o.rdzv_endpoint,
                 "HOST:PORT of the agents' rendezvous store, hosted by the agent on HOST (static default: "
                 "MASTER_ADDR:MASTER_PORT+1); file: a directory every node sees");
  torchrunOption(app, "--rdzv_id", o.run_id, "the job's id, the same on every node (= --run_id)");
  torchrunOption(app, "--rdzv_conf", o.rdzv_conf,
                 "KEY=VALUE,...: join_timeout (= --rdzv_timeout), last_call_timeout (= --rdzv_last_call), "
                 "keep_alive_interval (= --heartbeat_interval), keep_alive_max_attempt; other keys ignored");
  torchrunFlag(app, "--standalone", o.standalone, "one node, a free port on 127.0.0.1 and a random run id");
  torchrunOption(app, "--max_restarts", o.max_restarts, "restarts of a failed worker group")
      ->capture_default_str();
  torchrunOption(app, "--monitor_interval", o.monitor_interval, "seconds between worker checks")
      ->capture_default_str();
}

void addLaunchOptions(CLI::App& app, LaunchOptions& o, MeaninglessFlags& m) {
  torchrunOption(app, "--start_method", m.start_method,
                 "spawn | fork | forkserver: accepted and ignored (every worker is forked and exec'd)")
      ->check(CLI::IsMember({"spawn", "fork", "forkserver"}));
  torchrunOption(app, "--event_log_handler", m.event_log_handler, "accepted and ignored (no elastic events)");
  torchrunOption(app, "--role", o.role, "the workers' role (ROLE_NAME)")->capture_default_str();
  torchrunFlag(app, "-m,--module", o.module, "the program is a Python module: python3 -u -m MODULE ARGS");
  torchrunFlag(app, "--no_python", o.no_python, "run the program itself, never under python3");
  torchrunFlag(app, "--run_path", o.run_path,
               "run the script under python3 -u (takes precedence over --no_python)");
  torchrunOption(app, "--log_dir", o.log_dir,
                 "write <dir>/<run_id>_<random>/attempt_<k>/<local_rank>/{stdout,stderr}.log");
  torchrunOption(app, "-r,--redirects", o.redirects,
                 "with --log_dir, only to the logs: 1 stdout, 2 stderr, 3 both; or per local rank, 0:1,1:2")
      ->capture_default_str();
  torchrunOption(app, "-t,--tee", o.tee, "with --log_dir, to the logs and the console (same forms as -r)")
      ->capture_default_str();
  torchrunOption(app, "--local_ranks_filter", o.local_ranks_filter,
                 "only these local ranks' output on the console, e.g. 0,1 (log files keep everything)");
  torchrunOption(app, "--node_rank", o.node_rank, "rank of this node (static; c10d and file assign them)");
  torchrunOption(app, "--master_addr", o.master_addr, "address of rank 0's node")->capture_default_str();
  torchrunOption(app, "--master_port", o.master_port, "port of the c10d store on rank 0 (0: a free one)")
      ->capture_default_str();
  torchrunOption(app, "--local_addr", o.local_addr,
                 "this node's address for the others (c10d, file: MASTER_ADDR when it is node 0)");
  app.add_option(flagNames("--logs_specs"), m.logs_specs, "accepted and ignored (no Python entry points)");
  app.add_option(flagNames("--numa_binding"), m.numa_binding,
                 "node | socket | exclusive | core-complex: accepted and ignored (bind with numactl)")
      ->check(CLI::IsMember({"node", "socket", "exclusive", "core-complex"}));
  torchrunOption(app, "--signals_to_handle", o.signals_to_handle,
                 "signals that stop the workers and are forwarded to them, e.g. SIGTERM,SIGUSR1 (SIGINT, "
                 "SIGTERM, SIGHUP and SIGQUIT always are)")
      ->capture_default_str();
}

void addCtrunOptions(CLI::App& app, LaunchOptions& o) {
  const std::string group = "ctrun's own";
  app.add_option(flagNames("--rdzv_timeout"), o.rdzv_timeout, "seconds to wait for the other nodes")
      ->capture_default_str()
      ->group(group);
  app.add_option(flagNames("--rdzv_last_call"), o.rdzv_last_call,
                 "with MIN:MAX nodes, seconds to wait for more once MIN have joined")
      ->capture_default_str()
      ->group(group);
  app.add_option(flagNames("--heartbeat_interval"), o.heartbeat_interval, "seconds between node heartbeats")
      ->capture_default_str()
      ->group(group);
  app.add_option(flagNames("--heartbeat_timeout"), o.heartbeat_timeout,
                 "seconds of silence after which a node is lost")
      ->capture_default_str()
      ->group(group);
  app.add_option(flagNames("--grace_period"), o.grace_period, "seconds between SIGTERM and SIGKILL")
      ->capture_default_str()
      ->group(group);
  app.add_option(flagNames("--run_id"), o.run_id, "run id shown to workers")
      ->capture_default_str()
      ->group(group);
}

double secondsIn(const std::string& key, const std::string& value) {
  try {
    size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  TILER_THROW(ConfigError, "--rdzv_conf " << key << " must be a number; got '" << value << "'");
}

// torchrun's --rdzv_conf: the keys ctrun has a flag for set it; the others are noted.
void applyRendezvousConf(LaunchOptions& o, std::ostream& notes) {
  std::stringstream in(o.rdzv_conf);
  std::string pair;
  double keep_alive_attempts = 0;
  while (std::getline(in, pair, ',')) {
    const size_t eq = pair.find('=');
    TILER_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < pair.size(), ConfigError,
                "--rdzv_conf must be KEY=VALUE,KEY=VALUE,...; got '" << o.rdzv_conf << "'");
    const std::string key = pair.substr(0, eq), value = pair.substr(eq + 1);
    if (key == "join_timeout") {
      o.rdzv_timeout = secondsIn(key, value);
    } else if (key == "last_call_timeout") {
      o.rdzv_last_call = secondsIn(key, value);
    } else if (key == "keep_alive_interval") {
      o.heartbeat_interval = secondsIn(key, value);
    } else if (key == "keep_alive_max_attempt") {
      keep_alive_attempts = secondsIn(key, value);
    } else {
      notes << "ctrun: note: --rdzv_conf " << key << " means nothing for ctrun's rendezvous (ignored)\n";
    }
  }
  if (keep_alive_attempts > 0) o.heartbeat_timeout = keep_alive_attempts * o.heartbeat_interval;
}

void noteMeaningless(const CLI::App& app, const LaunchOptions& o, const MeaninglessFlags& m,
                     std::ostream& notes) {
  const auto given = [&](const char* name) { return app.get_option(name)->count() > 0; };
  const std::string ignored = " means nothing for ctrun";
  if (given("--start_method"))
    notes << "ctrun: note: --start_method " << m.start_method << ignored
          << ": every worker is a process of its own, forked and exec'd (ignored)\n";
  if (given("--event_log_handler") && m.event_log_handler != "null")
    notes << "ctrun: note: --event_log_handler " << m.event_log_handler << ignored
          << ": it records no torch elastic events (ignored)\n";
  if (given("--logs_specs"))
    notes << "ctrun: note: --logs_specs " << m.logs_specs << ignored
          << ": it loads no Python entry points; --log_dir, -r and -t place the output (ignored)\n";
  if (given("--numa_binding"))
    notes << "ctrun: note: --numa_binding " << m.numa_binding << ignored
          << ": it binds no worker; run the program under numactl (ignored)\n";
  if (o.log_dir.empty() && (o.redirects != "0" || o.tee != "0"))
    notes << "ctrun: note: -r/--redirects and -t/--tee without --log_dir mean nothing for ctrun: the output "
             "stays on the console (torchrun writes it under a temporary directory); give --log_dir\n";
  if (o.run_path)
    notes << "ctrun: note: --run_path runs the script as python3 -u SCRIPT (ctrun has no interpreter of its "
             "own to run it in)\n";
}

std::string randomRunId() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << rd() << rd();
  return os.str().substr(0, 12);
}

// Durations become milliseconds: NaN, infinities and negatives are refused by name, and none may exceed
// what a millisecond timer holds.
void checkDurations(const LaunchOptions& o) {
  const auto seconds = [](const char* flag, double v, bool zero_allowed) {
    TILER_CHECK(std::isfinite(v) && (v > 0 || (zero_allowed && v == 0)) && v <= kMaxLaunchSeconds,
                ConfigError,
                flag << " must be a number of seconds " << (zero_allowed ? ">= 0" : "> 0") << " and at most "
                     << int64_t(kMaxLaunchSeconds) << " (24.8 days); got " << v);
  };
  seconds("--monitor_interval", o.monitor_interval, false);
  seconds("--grace_period", o.grace_period, true);
  seconds("--rdzv_timeout", o.rdzv_timeout, false);
  seconds("--rdzv_last_call", o.rdzv_last_call, true);
  seconds("--heartbeat_interval", o.heartbeat_interval, false);
  seconds("--heartbeat_timeout", o.heartbeat_timeout, false);
  TILER_CHECK(o.heartbeat_timeout > o.heartbeat_interval, ConfigError,
              "--heartbeat_timeout must be longer than --heartbeat_interval");
}

// A Python script as torchrun would run it: named *.py, or a file execvp could not run (not executable).
bool isPythonScript(const std::string& program) {
  const bool py = program.size() > 3 && program.compare(program.size() - 3, 3, ".py") == 0;
  std::error_code ec;
  return py || (std::filesystem::is_regular_file(program, ec) && access(program.c_str(), X_OK) != 0);
}

// The option `arg` names: a whole name, or (long flags) an unambiguous prefix of one, as torchrun's argparse
// takes them (`--nproc 2`); nullptr when none. `ambiguous` lists the names a prefix could mean.
const CLI::Option* optionNamedBy(const CLI::App& app, const std::string& arg, std::string& ambiguous) {
  const bool long_flag = arg.rfind("--", 0) == 0;
  const std::string name = long_flag ? arg.substr(2, arg.find('=') - 2) : arg.substr(1, 1);  // -r3: r
  std::set<const CLI::Option*> prefixed;
  for (const CLI::Option* opt : app.get_options()) {
    const auto& names = long_flag ? opt->get_lnames() : opt->get_snames();
    for (const std::string& n : names) {
      if (n == name) return opt;
      if (long_flag && !name.empty() && n.rfind(name, 0) == 0) prefixed.insert(opt);
    }
  }
  if (prefixed.size() == 1) return *prefixed.begin();
  for (const CLI::Option* opt : prefixed)
    ambiguous += (ambiguous.empty() ? "--" : ", --") + opt->get_lnames()[0];
  return nullptr;
}

// torchrun's flags may be abbreviated (argparse takes any unambiguous prefix of a long flag, so argv written
// for torchrun does: `--nproc 2`); CLI11 takes whole names only. Spells out the flags before the program's
// name (its arguments are its own). ConfigError for an ambiguous prefix, as argparse refuses it.
void spellOutFlagPrefixes(const CLI::App& app, std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string arg = args[i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') return;
    std::string ambiguous;
    const CLI::Option* opt = optionNamedBy(app, arg, ambiguous);
    TILER_CHECK(ambiguous.empty(), ConfigError, "ambiguous option '" << arg << "' could be " << ambiguous);
    if (opt == nullptr) return;  // unknown: CLI11 or the program check names it
    const bool long_flag = arg.rfind("--", 0) == 0;
    const size_t eq = arg.find('=');
    if (long_flag) args[i] = "--" + opt->get_lnames()[0] + (eq == std::string::npos ? "" : arg.substr(eq));
    const bool value_attached = eq != std::string::npos || (!long_flag && arg.size() > 2);
    if (opt->get_items_expected_min() > 0 && !value_attached) ++i;  // its value
  }
}

}  // namespace

int parseCtrunCommandLine(int argc, char** argv, LaunchOptions& o, std::ostream& notes) {
  CLI::App app{
      "ctrun: torchrun's launcher in C++: start and supervise N workers of a program, a Python "
      "script or a module the way torchrun does"};
  app.prefix_command();  // everything from the program name on belongs to the program
  app.set_version_flag("--version", [] {
    return buildInfo("ctrun") + "NVIDIA GPUs visible: " + std::to_string(countNvidiaGpus()) + "\n";
  });
  MeaninglessFlags meaningless;
  addWorldOptions(app, o);
  addLaunchOptions(app, o, meaningless);
  addCtrunOptions(app, o);
  app.footer(
      "training_script [ARGS...]: the program each worker runs. A Python script (*.py, or a file that is not "
      "executable) runs as python3 -u SCRIPT ARGS, -m MODULE as python3 -u -m MODULE ARGS (PYTHON_EXEC names "
      "another interpreter), anything else (or everything with --no_python) as it is. Every torchrun flag is "
      "also read from PET_<FLAG> (e.g. PET_NPROC_PER_NODE), and a long flag may be shortened to any "
      "unambiguous "
      "prefix (--nproc 2), as torchrun's.");
  std::vector<std::string> args(argv, argv + argc);
  try {
    spellOutFlagPrefixes(app, args);
  } catch (const ConfigError& e) {
    std::cerr << "ctrun: error: " << e.message() << std::endl;
    return kExitFatal;
  }
  std::vector<char*> spelled;
  for (auto& a : args) spelled.push_back(a.data());
  if (const int code = parseCommandLine(app, int(spelled.size()), spelled.data(), "ctrun"); code >= 0)
    return code;
  o.command = app.remaining();
  // The program starts at the first word CLI11 does not know; one that looks like a flag is a typo, as
  // torchrun's argparse says (a program really named so can follow "--").
  if (!o.command.empty() && o.command.front() != "--" && o.command.front().rfind('-', 0) == 0) {
    std::cerr << "ctrun: error: unknown option '" << o.command.front()
              << "'\nRun 'ctrun --help' for the flags." << std::endl;
    return kExitFatal;
  }
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  try {
    TILER_CHECK(!o.command.empty(), ConfigError,
                "no program given (usage: ctrun [OPTIONS] PROGRAM [ARGS...])");
    applyRendezvousConf(o, notes);
  } catch (const ConfigError& e) {
    std::cerr << "ctrun: error: " << e.message() << std::endl;
    return kExitFatal;
  }
  noteMeaningless(app, o, meaningless, notes);
  return -1;
}

int countNvidiaGpus() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string v = visible;
    if (v.empty() || v == "-1" || v == "NoDevFiles") return 0;
    return int(std::count(v.begin(), v.end(), ',')) + 1;
  }
  int n = 0;
  for (int i = 0; i < 64; ++i) {
    if (std::filesystem::exists("/dev/nvidia" + std::to_string(i))) ++n;
  }
  if (n > 0) return n;
  FILE* p = popen("nvidia-smi -L 2>/dev/null", "r");
  if (p == nullptr) return 0;
  char line[512];
  while (fgets(line, sizeof line, p)) {
    if (std::strncmp(line, "GPU ", 4) == 0) ++n;
  }
  pclose(p);
  return n;
}

namespace {

int nprocFromSpec(const std::string& spec) {
  const int cores = usableCpus();
  if (spec == "cpu") return cores;
  if (spec == "auto" || spec == "gpu") {
    int gpus = countNvidiaGpus();
    if (gpus > 0) return gpus;
    TILER_CHECK(spec == "auto", ConfigError, "--nproc_per_node=gpu but no NVIDIA GPU is visible");
    return cores;
  }
  const auto n = wholeNumber(spec, 1, std::numeric_limits<int>::max());
  TILER_CHECK(n.has_value(), ConfigError,
              "--nproc_per_node must be a positive integer, auto, gpu or cpu; got '" << spec << "'");
  return *n;
}

}  // namespace

int resolveNprocPerNode(const std::string& spec) {
  const int n = nprocFromSpec(spec);
  TILER_CHECK(n <= kMaxWorkersPerNode, ConfigError,
              "--nproc_per_node " << spec << " is " << n << " workers; ctrun starts at most "
                                  << kMaxWorkersPerNode << " on a node");
  return n;
}

std::pair<int, int> parseNodeRange(const std::string& spec) {
  const size_t colon = spec.find(':');
  try {
    size_t used_min = 0, used_max = 0;
    const int lo = std::stoi(spec.substr(0, colon), &used_min);
    const int hi = colon == std::string::npos ? lo : std::stoi(spec.substr(colon + 1), &used_max);
    const bool whole = used_min == (colon == std::string::npos ? spec.size() : colon) &&
                       (colon == std::string::npos || used_max == spec.size() - colon - 1);
    if (whole && lo >= 1 && hi >= lo) return {lo, hi};
  } catch (const std::exception&) {
  }
  TILER_THROW(ConfigError, "--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX; got '" << spec << "'");
}

std::vector<std::string> workerCommand(const LaunchOptions& o) {
  const char* exec = std::getenv("PYTHON_EXEC");
  const std::string python = exec && *exec ? exec : "python3";
  std::vector<std::string> argv;
  if (o.run_path || (!o.no_python && (o.module || isPythonScript(o.command.at(0))))) {
    argv = {python, "-u"};
    if (o.module && !o.run_path) argv.push_back("-m");
  }
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

LaunchPlan settleOptions(LaunchOptions& o) {
  TILER_CHECK(!o.command.empty(), ConfigError, "no program to run");
  TILER_CHECK(!(o.no_python && o.module && !o.run_path), ConfigError,
              "--no_python and -m/--module together: a module needs the interpreter (as torchrun says)");
  LaunchPlan plan;
  std::tie(plan.min_nodes, plan.max_nodes) =
      parseNodeRange(o.nnodes_range.empty() ? std::to_string(o.nnodes) : o.nnodes_range);
  plan.rendezvous = makeRendezvousBackend(o.rdzv_backend);
  TILER_CHECK(o.max_restarts >= 0, ConfigError, "--max_restarts must be >= 0");
  checkDurations(o);
  StdStreams::parse(o.redirects, "--redirects");
  StdStreams::parse(o.tee, "--tee");
  const std::set<int> shown_ranks = parseLocalRanksFilter(o.local_ranks_filter);
  plan.signals = parseSignalList(o.signals_to_handle, "--signals_to_handle");
  o.nnodes = plan.max_nodes;
  if (!plan.multi()) {
    if (o.node_rank < 0) o.node_rank = 0;
    TILER_CHECK(o.node_rank == 0, ConfigError, "--node_rank " << o.node_rank << " outside --nnodes 1");
  }
  plan.nproc = resolveNprocPerNode(o.nproc_per_node);
  // Each worker holds two of ctrun's descriptors (its stdout and stderr pipes), four with --log_dir: past the
  // limit a start would fail at some worker after the others had begun.
  rlimit files{};
  const rlim_t needed = rlim_t(plan.nproc) * (o.log_dir.empty() ? 2 : 4);
  TILER_CHECK(
      getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY || needed <= files.rlim_cur,
      ConfigError,
      "--nproc_per_node " << o.nproc_per_node << " is " << plan.nproc << " workers, which need at least "
                          << needed << " open files" << (o.log_dir.empty() ? "" : " with --log_dir")
                          << "; this process may open " << files.rlim_cur << " (raise it with ulimit -n)");
  // A filter naming no worker of this node would hide every worker's output, errors included.
  TILER_CHECK(shown_ranks.empty() || *shown_ranks.rbegin() < plan.nproc, ConfigError,
              "--local_ranks_filter " << o.local_ranks_filter << " names local rank " << *shown_ranks.rbegin()
                                      << ", but this node runs " << plan.nproc << " (local ranks 0.."
                                      << plan.nproc - 1 << ")");
  if (o.standalone) {
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
    TILER_CHECK(!plan.multi(), ConfigError, "--standalone runs one node; drop --nnodes");
  }
  if (!plan.multi() && o.master_port == 0) {
    o.master_port = findFreePort();
    if (o.run_id == "none") o.run_id = randomRunId();
  }
  TILER_CHECK(o.master_port >= 0 && o.master_port < 65536, ConfigError,
              "--master_port must be in 0..65535, got " << o.master_port);
  plan.rendezvous->settle(o, plan.min_nodes, plan.max_nodes);
  return plan;
}

}  // namespace tiler::ctrun
