#include "tiler/ctrun/worker_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tiler/core/platform.hpp"
#include "tiler/ctrun/failures.hpp"
#include "tiler/ctrun/signals.hpp"

namespace fs = std::filesystem;

namespace tiler::ctrun {
namespace {

int openLog(const std::string& dir, const char* name) {
  // Created anew: a --log_dir others can write must not redirect a worker's log through a planted link.
  const int fd = createFileExclusively(dir + "/" + name);
  TILER_CHECK(fd >= 0, IoError, "cannot write " << dir << "/" << name << ": " << std::strerror(errno));
  return fd;
}

// The child's side of fork (signals blocked since before it): its own process group, death with ctrun,
// default signals, the pipes as its stdout and stderr, torchrun's environment, then exec. Never returns.
[[noreturn]] void execWorker(const std::vector<std::string>& command,
                             const std::map<std::string, std::string>& env, pid_t parent,
                             const int out_pipe[2], const int err_pipe[2]) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(137);  // ctrun died between fork and prctl
  resetSignalsInChild();
  if (out_pipe[1] >= 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
  }
  for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  for (auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const std::string msg = "ctrun: cannot run '" + command[0] + "': " + std::strerror(errno) + "\n";
  writeAll(2, msg);
  _exit(127);
}

}  // namespace

WorkerGroup::WorkerGroup(const LaunchOptions& options, std::vector<std::string> command, int nproc,
                         std::string attempt_dir, int restart_count)
    : options_(options),
      command_(std::move(command)),
      nproc_(nproc),
      attempt_dir_(std::move(attempt_dir)),
      restart_count_(restart_count),
      redirects_(StdStreams::parse(options.redirects, "--redirects")),
      console_ranks_(parseLocalRanksFilter(options.local_ranks_filter)) {}

WorkerGroup::~WorkerGroup() {
  // An exception between start and stop: no worker outlives its group.
  if (runningCount() > 0) {
    signalAll(SIGKILL);
    for (auto& w : workers_)
      if (w.running) waitpid(w.pid, nullptr, 0);
  }
  for (auto& w : workers_) {
    w.out.close();
    w.err.close();
  }
}

void WorkerGroup::start() {
  try {
    for (int lr = 0; lr < nproc_; ++lr) startWorker(lr);
  } catch (const LaunchError&) {
    signalAll(SIGKILL);
    for (auto& w : workers_) waitpid(w.pid, nullptr, 0);
    workers_.clear();
    throw;
  }
  started_ = true;
}

int WorkerGroup::monitor(int timeout_ms) {
  std::vector<pollfd> fds;
  fds.push_back({signalPipeFd(), POLLIN, 0});
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
  if (poll(fds.data(), fds.size(), timeout_ms) > 0) {
    if (fds[0].revents & POLLIN) got_signal = takeSignal();
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) streams[i - 1]->drain(false);
    }
  }
  reap();
  return got_signal;
}

void WorkerGroup::reap() {
  for (auto& w : workers_) {
    if (!w.running) continue;
    int status = 0;
    if (waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
    w.running = false;
    w.status = status;
    w.exit_time = nowSeconds();
    // Whatever the worker wrote before it died still belongs to it.
    w.out.drain(true);
    w.err.drain(true);
    if (!stopping_ && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failures_.push_back(failureOf(w));
  }
}

int WorkerGroup::runningCount() const {
  int n = 0;
  for (auto& w : workers_) n += w.running ? 1 : 0;
  return n;
}

int WorkerGroup::stop(int first_signal) {
  reap();  // what failed on its own before the stop is a failure
  stopping_ = true;
  signalAll(first_signal);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(options_.grace_period * 1000));
  int got_signal = 0;
  while (runningCount() > 0 && std::chrono::steady_clock::now() < deadline) {
    if ((got_signal = monitor(50)) != 0) break;  // ctrun is asked to stop: no more patience
  }
  if (runningCount() > 0) {
    signalAll(SIGKILL);
    while (runningCount() > 0)
      if (const int sig = monitor(50)) got_signal = sig;
  }
  closeStreams();
  return got_signal != 0 ? got_signal : takeSignal();
}

void WorkerGroup::closeStreams() {
  for (auto& w : workers_) {
    w.out.drain(true);
    w.err.drain(true);
    w.out.close();
    w.err.close();
  }
}

// Each worker leads a process group of its own: the group gets the signal, so what a worker started (a
// wrapper's child, a data loader) goes with it, even after the worker itself has exited.
void WorkerGroup::signalAll(int sig) {
  for (auto& w : workers_) kill(-w.pid, sig);
}

WorkerFailure WorkerGroup::failureOf(const Worker& w) const {
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
  // The error file's time when there is one: it was written at the failure, the exit came later.
  struct stat st {};
  f.time = stat(w.error_file.c_str(), &st) == 0
               ? double(st.st_mtim.tv_sec) + double(st.st_mtim.tv_nsec) * 1e-9
               : w.exit_time;
  f.node = options_.node_rank;
  f.host = hostName();
  f.error_file = w.error_file;
  f.error_message = errorMessageFromFile(w.error_file);
  return f;
}

void WorkerGroup::startWorker(int local_rank) {
  Worker w;
  w.local_rank = local_rank;
  w.rank = options_.node_rank * nproc_ + local_rank;
  const std::string worker_dir = attempt_dir_ + "/" + std::to_string(local_rank);
  fs::create_directories(worker_dir);
  w.error_file = worker_dir + "/error.json";
  std::error_code ec;
  fs::remove(w.error_file, ec);

  // With one worker, no log files and no filter, the worker writes straight to our terminal (progress bars
  // stay bars).
  const bool pipe_output =
      nproc_ * options_.nnodes > 1 || !options_.log_dir.empty() || !console_ranks_.empty();
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  if (pipe_output && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) {
    const int error = errno;
    for (int fd : {out_pipe[0], out_pipe[1]})
      if (fd >= 0) ::close(fd);
    TILER_THROW(LaunchError, "cannot start worker " << local_rank << ": pipe: " << std::strerror(error));
  }
  const auto env = workerEnvironment(options_, nproc_, local_rank, restart_count_, w.error_file);
  const pid_t parent = getpid();
  pid_t pid;
  int fork_error = 0;
  {
    const SignalsBlocked blocked;
    pid = fork();
    if (pid == 0) execWorker(command_, env, parent, out_pipe, err_pipe);
    if (pid < 0)
      fork_error = errno;
    else
      setpgid(pid, pid);  // also here: the group exists before any signal, whichever process runs first
  }
  if (pid < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
      if (fd >= 0) ::close(fd);
    TILER_THROW(LaunchError, "cannot start worker " << local_rank << ": fork: " << std::strerror(fork_error));
  }
  w.pid = pid;
  w.running = true;
  workers_.push_back(std::move(w));
  if (pipe_output) attachStreams(workers_.back(), worker_dir, out_pipe, err_pipe);
}

void WorkerGroup::attachStreams(Worker& w, const std::string& worker_dir, const int out_pipe[2],
                                const int err_pipe[2]) {
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  const bool logs = !options_.log_dir.empty();
  const bool shown = console_ranks_.empty() || console_ranks_.count(w.local_rank) > 0;
  const int redirected = logs ? redirects_.of(w.local_rank) : 0;
  w.out.fd = out_pipe[0];
  w.err.fd = err_pipe[0];
  w.out.prefix = w.err.prefix = nproc_ * options_.nnodes > 1 ? "[rank " + std::to_string(w.rank) + "]: " : "";
  w.out.console_fd = shown && !(redirected & 1) ? 1 : -1;
  w.err.console_fd = shown && !(redirected & 2) ? 2 : -1;
  if (logs) {
    // Log files are written when redirected or teed; with neither, torchrun writes none either, but a user
    // who named --log_dir wants them, so they always get both.
    w.out.log_fd = openLog(worker_dir, "stdout.log");
    w.err.log_fd = openLog(worker_dir, "stderr.log");
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

}  // namespace tiler::ctrun
