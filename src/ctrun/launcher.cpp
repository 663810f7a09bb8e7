#include "tiler/ctrun/launcher.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/core/rendezvous.hpp"
#include "tiler/ctrun/agent.hpp"
#include "tiler/ctrun/options.hpp"
#include "tiler/ctrun/signals.hpp"
#include "tiler/ctrun/streams.hpp"

namespace fs = std::filesystem;

namespace tiler {

int countNvidiaGpus() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string v = visible;
    if (v.empty() || v == "-1" || v == "NoDevFiles") return 0;
    return int(std::count(v.begin(), v.end(), ',')) + 1;
  }
  int n = 0;
  for (int i = 0; i < 64; ++i) {
    if (fs::exists("/dev/nvidia" + std::to_string(i))) ++n;
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
  const auto n = ctrun::wholeNumber(spec, 1, std::numeric_limits<int>::max());
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

int findFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TILER_CHECK(fd >= 0, ConfigError, "socket: " << std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
           getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  TILER_CHECK(ok, ConfigError, "cannot find a free port: " << std::strerror(errno));
  return ntohs(addr.sin_port);
}

bool portIsFree(int port) {
  // The c10d store sets SO_REUSEADDR as the rendezvous store does, so a port in TIME_WAIT is usable; only a
  // listener blocks it.
  try {
    StoreServer probe("", port);
    return true;
  } catch (const DistError&) {
    return false;
  }
}

std::map<std::string, std::string> workerEnvironment(const LaunchOptions& o, int nproc, int local_rank,
                                                     int restart_count, const std::string& error_file) {
  std::map<std::string, std::string> env = {
      {"RANK", std::to_string(o.node_rank * nproc + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * nproc)},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_RANK", std::to_string(o.node_rank * nproc + local_rank)},
      {"ROLE_WORLD_SIZE", std::to_string(o.nnodes * nproc)},
      {"ROLE_NAME", o.role},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
      {"TORCHELASTIC_ERROR_FILE", error_file},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
  };
  // NCCL's errors and timeouts end the worker instead of hanging it (torchrun 1.x's name, then 2.x's), unless
  // the user chose otherwise.
  for (const char* name : {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"})
    if (std::getenv(name) == nullptr) env[name] = "1";
  if (std::getenv("OMP_NUM_THREADS") == nullptr)
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1, usableCpus() / nproc));
  return env;
}

namespace {

// A new directory named `prefix` and six random characters (mkdtemp), made with its parents.
std::string makeUniqueDirectory(const fs::path& prefix, const char* what) {
  std::error_code ec;
  fs::create_directories(prefix.parent_path(), ec);
  std::string tmpl = prefix.string() + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  TILER_CHECK(mkdtemp(buf.data()) != nullptr, LaunchError,
              "cannot make a directory for " << what << " under " << prefix.parent_path() << ": "
                                             << std::strerror(errno));
  return buf.data();
}

// Where error files (and logs) live, one directory per run. With --log_dir, torchrun's
// `<dir>/<run_id>_<random>` (never an earlier run's: a second run with the same id, or another node writing
// to the same shared directory, keeps its own logs), said on stderr; without, a temporary one, removed at the
// end.
struct RunDirectory {
  std::string path;
  bool temporary = false;
  explicit RunDirectory(const LaunchOptions& o) : temporary(o.log_dir.empty()) {
    if (!temporary) {
      path = makeUniqueDirectory(fs::path(o.log_dir) / (o.run_id + "_"), "the workers' logs");
      std::cerr << "ctrun: logs under " << path << "\n";
      return;
    }
    path = makeUniqueDirectory(fs::temp_directory_path() / "ctrun-", "the workers' error files");
  }
  ~RunDirectory() {
    if (temporary) removeTree(path);
  }
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
};

}  // namespace

Launcher::Launcher(LaunchOptions options) : options_(std::move(options)) {}

int Launcher::run() {
  const ctrun::LaunchPlan plan = ctrun::settleOptions(options_);
  ctrun::installSignalPipe(plan.signals);
  const RunDirectory run_dir(options_);
  return ctrun::runAgent(options_, plan, run_dir.path);
}

}  // namespace tiler
