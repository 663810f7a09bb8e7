#include "tiler/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tiler/error.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

int g_signal_pipe[2] = {-1, -1};

void onSignal(int signo) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(signo);
  if (write(g_signal_pipe[1], &b, 1) < 0) {
  }
  errno = saved;
}

double nowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string formatTime(double t) {
  std::time_t secs = std::time_t(t);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

std::string hostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string signalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

void writeAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += size_t(n);
  }
}

// One output stream of one worker: a pipe, a line buffer and where its lines go.
struct Stream {
  int fd = -1;          // read end; -1 when closed
  int console_fd = -1;  // 1 or 2; -1 when redirected only to the log
  int log_fd = -1;      // log file; -1 when none
  std::string prefix;   // "[rank N]: " or empty
  std::string pending;  // partial line

  void emit(const std::string& line) {
    if (console_fd >= 0) writeAll(console_fd, prefix + line);
    if (log_fd >= 0) writeAll(log_fd, line);
  }
  void drain(bool eof) {
    char buf[65536];
    for (;;) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0 || eof) close();
        break;
      }
      pending.append(buf, size_t(n));
      size_t start = 0, nl;
      // Whole lines only, each in one write, so ranks never interleave mid-line.
      while ((nl = pending.find('\n', start)) != std::string::npos) {
        emit(pending.substr(start, nl + 1 - start));
        start = nl + 1;
      }
      pending.erase(0, start);
    }
  }
  void close() {
    if (!pending.empty()) emit(pending + "\n");
    pending.clear();
    if (fd >= 0) ::close(fd);
    if (log_fd >= 0) ::close(log_fd);
    fd = log_fd = -1;
  }
};

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

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string errorMessageFromFile(const std::string& path) {
  std::string text = readFile(path);
  if (text.empty()) return "";
  try {
    auto j = nlohmann::json::parse(text);
    if (j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
    // torchelastic's own format: {"message": {"message": ..., "extraInfo": ...}}
    if (j.contains("message") && j["message"].contains("message"))
      return j["message"]["message"].get<std::string>();
  } catch (const std::exception&) {
  }
  return text;
}

class WorkerGroup {
 public:
  WorkerGroup(const LaunchOptions& options, int nproc, std::string attempt_dir, int restart_count)
      : options_(options),
        nproc_(nproc),
        attempt_dir_(std::move(attempt_dir)),
        restart_count_(restart_count) {}

  void start() {
    for (int lr = 0; lr < nproc_; ++lr) startWorker(lr);
    state_ = GroupState::kHealthy;
  }

  // Drains output, reaps exited workers and updates the state. Returns the signal number that arrived on
  // the self-pipe, if any.
  int monitor(int timeout_ms) {
    std::vector<pollfd> fds;
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    std::vector<Stream*> streams;
    for (auto& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
    }
    int got_signal = 0;
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n > 0) {
      if (fds[0].revents & POLLIN) {
        unsigned char b;
        while (read(g_signal_pipe[0], &b, 1) == 1) {
          if (b != SIGCHLD) got_signal = b;
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) streams[i - 1]->drain(false);
      }
    }
    reap();
    return got_signal;
  }

  void reap() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      pid_t r = waitpid(w.pid, &status, WNOHANG);
      if (r != w.pid) continue;
      w.running = false;
      w.status = status;
      w.exit_time = nowSeconds();
      // Whatever the worker wrote before it died still belongs to it.
      w.out.drain(true);
      w.err.drain(true);
      bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed) {
        failures_.push_back(failureOf(w));
        if (state_ == GroupState::kHealthy) state_ = GroupState::kFailed;
      }
    }
    if (state_ == GroupState::kHealthy && runningCount() == 0) state_ = GroupState::kSucceeded;
  }

  int runningCount() const {
    int n = 0;
    for (auto& w : workers_) n += w.running ? 1 : 0;
    return n;
  }

  // SIGTERM to every live worker, SIGKILL to what is left after the grace period; drains output meanwhile.
  void stop(int first_signal) {
    state_ = GroupState::kStopping;
    signalAll(first_signal);
    auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(options_.grace_period * 1000));
    while (runningCount() > 0 && std::chrono::steady_clock::now() < deadline) {
      int extra = monitor(50);
      if (extra != 0) break;  // a second signal to ctrun: no more patience
    }
    if (runningCount() > 0) {
      signalAll(SIGKILL);
      while (runningCount() > 0) monitor(50);
    }
    closeStreams();
    state_ = GroupState::kDone;
  }

  void closeStreams() {
    for (auto& w : workers_) {
      w.out.drain(true);
      w.err.drain(true);
      w.out.close();
      w.err.close();
    }
  }

  GroupState state() const { return state_; }
  const std::vector<WorkerFailure>& failures() const { return failures_; }

 private:
  // Each worker leads a process group of its own: the group gets the signal, so what a worker started (a
  // wrapper's child, a data loader) goes with it, even after the worker itself has exited.
  void signalAll(int sig) {
    for (auto& w : workers_) kill(-w.pid, sig);
  }

  WorkerFailure failureOf(const Worker& w) {
    WorkerFailure f;
    f.rank = w.rank;
    f.local_rank = w.local_rank;
    f.pid = w.pid;
    if (WIFSIGNALED(w.status)) {
      f.signal = WTERMSIG(w.status);
      f.exit_code = 128 + f.signal;
    } else {
      f.exit_code = WEXITSTATUS(w.status);
    }
    f.time = w.exit_time;
    f.error_file = w.error_file;
    f.error_message = errorMessageFromFile(w.error_file);
    return f;
  }

  int openLog(const std::string& dir, const char* name) {
    int fd = ::open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TILER_CHECK(fd >= 0, ConfigError,
                "ctrun: cannot write " << dir << "/" << name << ": " << std::strerror(errno));
    return fd;
  }

  void startWorker(int local_rank) {
    Worker w;
    w.local_rank = local_rank;
    w.rank = options_.node_rank * nproc_ + local_rank;
    std::string worker_dir = attempt_dir_ + "/" + std::to_string(local_rank);
    fs::create_directories(worker_dir);
    w.error_file = worker_dir + "/error.json";
    std::error_code ec;
    fs::remove(w.error_file, ec);

    const bool logs = !options_.log_dir.empty();
    // With one worker and no log files, the worker writes straight to our terminal (progress bars stay bars).
    const bool pipe_output = nproc_ * options_.nnodes > 1 || logs;
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (pipe_output) {
      TILER_CHECK(pipe2(out_pipe, O_CLOEXEC) == 0 && pipe2(err_pipe, O_CLOEXEC) == 0, ConfigError,
                  "ctrun: pipe: " << std::strerror(errno));
    }
    auto env = workerEnvironment(options_, nproc_, local_rank, restart_count_, w.error_file);
    pid_t parent = getpid();
    pid_t pid = fork();
    TILER_CHECK(pid >= 0, ConfigError, "ctrun: fork: " << std::strerror(errno));
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(137);  // ctrun died between fork and prctl
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) signal(s, SIG_DFL);
      if (pipe_output) {
        dup2(out_pipe[1], 1);
        dup2(err_pipe[1], 2);
      }
      for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : options_.command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      std::string msg = "ctrun: cannot run '" + options_.command[0] + "': " + std::strerror(errno) + "\n";
      writeAll(2, msg);
      _exit(127);
    }
    setpgid(pid, pid);  // also here: the group exists before any signal, whichever process runs first
    w.pid = pid;
    w.running = true;
    if (pipe_output) {
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
      fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
      std::string prefix = nproc_ * options_.nnodes > 1 ? "[rank " + std::to_string(w.rank) + "]: " : "";
      w.out.fd = out_pipe[0];
      w.err.fd = err_pipe[0];
      w.out.prefix = w.err.prefix = prefix;
      w.out.console_fd = (options_.redirects & 1) && logs ? -1 : 1;
      w.err.console_fd = (options_.redirects & 2) && logs ? -1 : 2;
      if (logs) {
        // Log files are written when redirected or teed; with neither, torchrun writes none either, but a
        // user who named --log_dir wants them, so they always get both.
        w.out.log_fd = openLog(worker_dir, "stdout.log");
        w.err.log_fd = openLog(worker_dir, "stderr.log");
      }
    }
    workers_.push_back(std::move(w));
  }

  const LaunchOptions& options_;
  int nproc_;
  std::string attempt_dir_;
  int restart_count_;
  GroupState state_ = GroupState::kInit;
  std::vector<Worker> workers_;
  std::vector<WorkerFailure> failures_;
};

void printSummary(const std::vector<WorkerFailure>& failures, const LaunchOptions& options, int attempts) {
  std::ostringstream os;
  const std::string host = hostName();
  os << "ctrun: worker group FAILED (" << failures.size() << " worker(s) failed, attempt " << attempts
     << " of " << options.max_restarts + 1 << ", run_id " << options.run_id << ")\n";
  for (size_t i = 0; i < failures.size(); ++i) {
    const auto& f = failures[i];
    os << (i == 0 ? "Root cause (first failure):\n" : i == 1 ? "Other failures:\n" : "");
    os << "  rank:        " << f.rank << " (local_rank " << f.local_rank << ")\n"
       << "  host:        " << host << "\n"
       << "  pid:         " << f.pid << "\n"
       << "  time:        " << formatTime(f.time) << "\n";
    if (f.signal != 0) {
      os << "  exitcode:    " << -f.signal << " (signal " << f.signal << ": " << signalName(f.signal)
         << ")\n";
    } else {
      os << "  exitcode:    " << f.exit_code << "\n";
    }
    os << "  error_file:  " << (f.error_message.empty() ? "<N/A>" : f.error_file) << "\n";
    if (!f.error_message.empty()) os << "  error:       " << f.error_message << "\n";
  }
  writeAll(2, os.str());
}

std::string randomRunId() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << rd() << rd();
  return os.str().substr(0, 12);
}

}  // namespace

const char* groupStateName(GroupState state) {
  switch (state) {
    case GroupState::kInit:
      return "INIT";
    case GroupState::kHealthy:
      return "HEALTHY";
    case GroupState::kSucceeded:
      return "SUCCEEDED";
    case GroupState::kFailed:
      return "FAILED";
    case GroupState::kStopping:
      return "STOPPING";
    case GroupState::kDone:
      return "DONE";
  }
  return "?";
}

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

int resolveNprocPerNode(const std::string& spec) {
  int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  if (spec == "cpu") return cores;
  if (spec == "auto" || spec == "gpu") {
    int gpus = countNvidiaGpus();
    if (gpus > 0) return gpus;
    TILER_CHECK(spec == "auto", ConfigError, "ctrun: --nproc_per_node=gpu but no NVIDIA GPU is visible");
    return cores;
  }
  try {
    size_t used = 0;
    int n = std::stoi(spec, &used);
    if (used == spec.size() && n >= 1) return n;
  } catch (const std::exception&) {
  }
  TILER_THROW(ConfigError,
              "ctrun: --nproc_per_node must be a positive integer, auto, gpu or cpu; got '" << spec << "'");
}

int findFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TILER_CHECK(fd >= 0, ConfigError, "ctrun: socket: " << std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
           getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  TILER_CHECK(ok, ConfigError, "ctrun: cannot find a free port: " << std::strerror(errno));
  return ntohs(addr.sin_port);
}

bool portIsFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int one = 1;
  // The c10d store sets SO_REUSEADDR too, so a port in TIME_WAIT is usable; only a listener blocks it.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(uint16_t(port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
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
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
      {"TORCHELASTIC_ERROR_FILE", error_file},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
  };
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1, cores / nproc));
  }
  return env;
}

Launcher::Launcher(LaunchOptions options) : options_(std::move(options)) {}

int Launcher::run() {
  LaunchOptions& o = options_;
  TILER_CHECK(!o.command.empty(), ConfigError, "ctrun: no program to run");
  TILER_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes, ConfigError,
              "ctrun: --node_rank " << o.node_rank << " outside --nnodes " << o.nnodes);
  TILER_CHECK(o.max_restarts >= 0, ConfigError, "ctrun: --max_restarts must be >= 0");
  TILER_CHECK(o.monitor_interval > 0, ConfigError, "ctrun: --monitor_interval must be > 0");
  const int nproc = resolveNprocPerNode(o.nproc_per_node);
  if (o.standalone) {
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
    TILER_CHECK(o.nnodes == 1, ConfigError, "ctrun: --standalone runs one node; drop --nnodes");
  }
  if (o.master_port == 0) {
    o.master_port = findFreePort();
    if (o.run_id == "none") o.run_id = randomRunId();
  }
  TILER_CHECK(o.master_port > 0 && o.master_port < 65536, ConfigError,
              "ctrun: --master_port must be in 0..65535, got " << o.master_port);
  if (o.node_rank == 0) {
    TILER_CHECK(portIsFree(o.master_port), ConfigError,
                "ctrun: --master_port " << o.master_port
                                        << " is already in use on this host (rank 0 hosts the "
                                        << "store there); pick another or use --master_port 0");
  }

  // Signals arrive on a self-pipe so the monitor loop handles them in order, outside handler context.
  TILER_CHECK(pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, ConfigError, "ctrun: pipe failed");
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Error files (and logs) live under one directory per run; without --log_dir, a temporary one.
  std::string base_dir;
  bool temp_dir = o.log_dir.empty();
  if (temp_dir) {
    std::string tmpl = (fs::temp_directory_path() / "ctrun-XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    TILER_CHECK(mkdtemp(buf.data()) != nullptr, ConfigError, "ctrun: mkdtemp failed");
    base_dir = buf.data();
  } else {
    base_dir = o.log_dir + "/" + o.run_id;
  }

  int exit_code = 0;
  int interrupted_by = 0;
  std::vector<WorkerFailure> last_failures;
  int attempt = 0;
  for (;; ++attempt) {
    WorkerGroup group(o, nproc, base_dir + "/attempt_" + std::to_string(attempt), attempt);
    group.start();
    const int interval_ms = std::max(1, int(o.monitor_interval * 1000));
    while (group.state() == GroupState::kHealthy) {
      int sig = group.monitor(interval_ms);
      if (sig != 0) {
        interrupted_by = sig;
        break;
      }
    }
    if (interrupted_by != 0) {
      std::cerr << "ctrun: received " << signalName(interrupted_by) << ", stopping workers" << std::endl;
      group.stop(interrupted_by == SIGINT ? SIGINT : SIGTERM);
      exit_code = 128 + interrupted_by;
      break;
    }
    if (group.state() == GroupState::kSucceeded) {
      group.closeStreams();
      exit_code = 0;
      last_failures.clear();
      break;
    }
    // kFailed: the first failure fails the group.
    group.stop(SIGTERM);
    last_failures = group.failures();
    exit_code = last_failures.front().exit_code;
    if (attempt < o.max_restarts) {
      const auto& f = last_failures.front();
      std::cerr << "ctrun: rank " << f.rank << " failed ("
                << (f.signal ? signalName(f.signal) : "exit code " + std::to_string(f.exit_code))
                << "); restarting worker group (" << attempt + 1 << " of " << o.max_restarts << ")"
                << std::endl;
      continue;
    }
    break;
  }
  if (!last_failures.empty()) printSummary(last_failures, o, attempt + 1);
  if (temp_dir) {
    std::error_code ec;
    fs::remove_all(base_dir, ec);
  }
  return exit_code;
}

}  // namespace tiler
