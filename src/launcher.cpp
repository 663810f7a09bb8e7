#include "tiler/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "tiler/error.hpp"
#include "tiler/platform.hpp"
#include "tiler/rendezvous.hpp"

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

// A termination signal (SIGINT, SIGTERM, SIGHUP) that reached ctrun while it waited at the rendezvous.
struct Interrupted {
  int signal;
};

// Throws Interrupted when a termination signal waits on the self-pipe. SIGCHLD is dropped: no worker of
// this node runs while it waits for the others.
void throwIfInterrupted() {
  unsigned char b;
  while (read(g_signal_pipe[0], &b, 1) == 1)
    if (b != SIGCHLD) throw Interrupted{b};
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

std::string errorMessageFromFile(const std::string& path) {
  std::string text = readWholeFile(path);
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

  int openLog(const std::string& dir, const char* name) {
    // Created anew: a --log_dir others can write must not redirect a worker's log through a planted link.
    const int fd = createFileExclusively(dir + "/" + name);
    TILER_CHECK(fd >= 0, ConfigError, "cannot write " << dir << "/" << name << ": " << std::strerror(errno));
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
                  "pipe: " << std::strerror(errno));
    }
    auto env = workerEnvironment(options_, nproc_, local_rank, restart_count_, w.error_file);
    pid_t parent = getpid();
    pid_t pid = fork();
    TILER_CHECK(pid >= 0, ConfigError, "fork: " << std::strerror(errno));
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
    if (f.lost) {
      os << "  node:        " << f.node << " LOST (" << f.error_message << ")\n"
         << "  host:        " << f.host << "\n"
         << "  time:        " << formatTime(f.time) << "\n";
      continue;
    }
    os << "  rank:        " << f.rank << " (local_rank " << f.local_rank
       << (options.nnodes > 1 ? ", node " + std::to_string(f.node) : std::string()) << ")\n"
       << "  host:        " << (f.host.empty() ? host : f.host) << "\n"
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

nlohmann::json failureToJson(const WorkerFailure& f) {
  return {{"node", f.node},
          {"host", f.host},
          {"lost", f.lost},
          {"rank", f.rank},
          {"local_rank", f.local_rank},
          {"pid", f.pid},
          {"exit_code", f.exit_code},
          {"signal", f.signal},
          {"time", f.time},
          {"error_file", f.error_file},
          {"error_message", utf8Safe(f.error_message)}};
}

WorkerFailure failureFromJson(const nlohmann::json& j) {
  WorkerFailure f;
  f.node = j.at("node");
  f.host = j.at("host");
  f.lost = j.at("lost");
  f.rank = j.at("rank");
  f.local_rank = j.at("local_rank");
  f.pid = j.at("pid");
  f.exit_code = j.at("exit_code");
  f.signal = j.at("signal");
  f.time = j.at("time");
  f.error_file = j.at("error_file");
  f.error_message = j.at("error_message");
  return f;
}

// This agent's link to the others: the rendezvous store (hosted here when the endpoint is this host and
// its port is free), one round of keys per attempt, heartbeats, and the failures every node publishes.
class NodeLink {
 public:
  explicit NodeLink(const LaunchOptions& o) : o_(o) {
    auto [host, port] = parseEndpoint(o.rdzv_endpoint, "--rdzv_endpoint");
    endpoint_host_ = host;
    // Who hosts the store: in a static world node 0 (as torchrun), on the address the endpoint names; with
    // c10d, the first agent on the endpoint's host to bind it. Both retried until --rdzv_timeout: the host
    // may start later, and a port can be held a while by the local end of another connection.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(o.rdzv_timeout * 1000));
    const bool must_host = o.rdzv_backend == "static" && o.node_rank == 0;
    const bool may_host = must_host || (o.rdzv_backend != "static" && isLocalHost(host));
    for (;;) {
      throwIfInterrupted();
      const bool last = std::chrono::steady_clock::now() >= deadline;
      if (may_host && !server_) {
        try {
          StoreLimits limits;
          // An agent talks at least every heartbeat; a silent connection is dropped well after that.
          limits.idle_timeout =
              std::max(limits.idle_timeout, std::chrono::milliseconds(int64_t(4000 * o.heartbeat_interval)));
          server_ = std::make_unique<StoreServer>(host, port, limits);
        } catch (const DistError&) {
          // c10d: another agent on this host holds it (several agents on one machine, as in tests).
          if (must_host && last) throw;
        }
      }
      if (must_host && !server_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      try {
        client_ = std::make_unique<StoreClient>(host, port, std::chrono::milliseconds(last ? 0 : 500));
        break;
      } catch (const TimeoutError&) {
        if (last)
          TILER_THROW(TimeoutError, "cannot reach the rendezvous store at "
                                        << o.rdzv_endpoint << " within " << o.rdzv_timeout
                                        << " s (--rdzv_timeout): no agent hosts it");
      }
    }
    client_->setTimeout(std::chrono::milliseconds(int64_t(o.rdzv_timeout * 1000)));
  }

  struct Round {
    int node_rank = 0, nodes = 1;
    std::string master_addr;
    int master_port = 0;
  };

  Round join(int round, int min_nodes, int max_nodes) {
    prefix_ = o_.run_id + "/" + std::to_string(round) + "/";
    const auto timeout = std::chrono::milliseconds(int64_t(o_.rdzv_timeout * 1000));
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    Round r;
    const int64_t joined = client_->add(prefix_ + "joined", 1);
    if (o_.rdzv_backend == "static") {
      r.node_rank = o_.node_rank;
      r.nodes = max_nodes;
      TILER_CHECK(client_->add(prefix_ + "rank/" + std::to_string(r.node_rank), 1) == 1, ConfigError,
                  "two nodes joined with --node_rank " << r.node_rank);
      pollJoined(round, std::to_string(max_nodes), elapsed, [&](int64_t n) { return n >= max_nodes; });
    } else {
      r.node_rank = int(joined - 1);
      if (r.node_rank == 0) {
        // The first to join closes the round: at MAX nodes, or MIN and the last call over.
        double min_reached_at = -1;
        const int64_t n = pollJoined(round, "at least " + std::to_string(min_nodes), elapsed, [&](int64_t n) {
          if (n >= min_nodes && min_reached_at < 0) min_reached_at = elapsed();
          return n >= max_nodes || (min_reached_at >= 0 && elapsed() - min_reached_at >= o_.rdzv_last_call);
        });
        r.nodes = int(std::min<int64_t>(n, max_nodes));
        client_->set(prefix_ + "size", std::to_string(r.nodes));
      } else {
        r.nodes = int(parseStoreInteger(client_->wait(prefix_ + "size", timeout, throwIfInterrupted),
                                        prefix_ + "size", o_.rdzv_endpoint));
        TILER_CHECK(r.node_rank < r.nodes, DistError,
                    "rendezvous " << round << " closed with " << r.nodes
                                  << " nodes before this one joined; start it again for the next run");
      }
    }
    if (r.node_rank == 0) {
      std::string addr = o_.master_addr;
      int port = o_.master_port;
      if (o_.rdzv_backend == "c10d") {
        // Where the others reach this node: the endpoint's name when the store is here, else the address
        // this node talks to the store from.
        addr = server_ ? endpoint_host_ : client_->localAddress();
        port = findFreePort();
      }
      client_->set(prefix_ + "master", addr + ":" + std::to_string(port));
    }
    if (server_) client_->set(prefix_ + "store_host", std::to_string(r.node_rank) + " " + hostName());
    auto [addr, port] = parseEndpoint(client_->wait(prefix_ + "master", timeout, throwIfInterrupted),
                                      "the master address at the rendezvous store " + o_.rdzv_endpoint);
    r.master_addr = addr;
    r.master_port = port;
    // Which node hosts the store, so that losing it names that node (every round has the host among its
    // nodes).
    const std::string store_host = client_->wait(prefix_ + "store_host", timeout, throwIfInterrupted);
    const size_t space = store_host.find(' ');
    store_node_ =
        int(parseStoreInteger(store_host.substr(0, space), prefix_ + "store_host", o_.rdzv_endpoint));
    store_host_name_ = space == std::string::npos ? std::string() : store_host.substr(space + 1);
    nodes_ = r.nodes;
    me_ = r.node_rank;
    beats_.assign(size_t(nodes_), {std::string(), std::chrono::steady_clock::now()});
    beat_ = 0;
    last_beat_ = {};
    return r;
  }

  // Polls the round's count of joined nodes until `enough(count)`; after --rdzv_timeout, a TimeoutError
  // saying how many of `wanted` nodes joined. Returns the count.
  int64_t pollJoined(int round, const std::string& wanted, const std::function<double()>& elapsed,
                     const std::function<bool(int64_t)>& enough) {
    for (;;) {
      throwIfInterrupted();
      const int64_t n = client_->add(prefix_ + "joined", 0);
      if (enough(n)) return n;
      TILER_CHECK(elapsed() < o_.rdzv_timeout, TimeoutError,
                  "rendezvous " << round << ": " << n << " of " << wanted << " nodes joined within "
                                << o_.rdzv_timeout << " s (--rdzv_timeout)");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Sends this node's heartbeat and reads the others' (at most every heartbeat_interval). Returns the
  // failure of a node silent for heartbeat_timeout (lost), if any.
  std::optional<WorkerFailure> heartbeat() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_beat_ < std::chrono::milliseconds(int64_t(o_.heartbeat_interval * 1000)))
      return std::nullopt;
    last_beat_ = now;
    client_->set(prefix_ + "hb/" + std::to_string(me_), std::to_string(++beat_));
    for (int n = 0; n < nodes_; ++n) {
      if (n == me_ || client_->get(prefix_ + "done/" + std::to_string(n))) continue;
      const std::string value = client_->get(prefix_ + "hb/" + std::to_string(n)).value_or("");
      auto& [seen, since] = beats_[size_t(n)];
      if (value != seen) {
        seen = value;
        since = now;
      } else if (std::chrono::duration<double>(now - since).count() > o_.heartbeat_timeout) {
        WorkerFailure f;
        f.node = n;
        f.lost = true;
        f.host = "node " + std::to_string(n);
        f.time = nowSeconds();
        f.exit_code = kExitFatal;
        f.error_message = "no heartbeat for " + std::to_string(int(o_.heartbeat_timeout)) + " s";
        return f;
      }
    }
    return std::nullopt;
  }

  void publish(const std::vector<WorkerFailure>& failures) {
    for (const auto& f : failures) {
      const int64_t k = client_->add(prefix_ + "failures", 1);
      client_->set(prefix_ + "failure/" + std::to_string(k), failureToJson(f).dump());
    }
  }
  int64_t failureCount() { return client_->add(prefix_ + "failures", 0); }
  // Every published failure of this round, earliest first.
  std::vector<WorkerFailure> failures() {
    std::vector<WorkerFailure> all;
    const int64_t n = failureCount();
    for (int64_t k = 1; k <= n; ++k) {
      const std::string key = prefix_ + "failure/" + std::to_string(k);
      if (auto text = client_->get(key)) {
        try {
          all.push_back(failureFromJson(nlohmann::json::parse(*text)));
        } catch (const nlohmann::json::exception& e) {
          TILER_THROW(DistError, "malformed rendezvous data at "
                                     << o_.rdzv_endpoint << ": '" << key
                                     << "' is not a failure record: " << e.what());
        }
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.time < b.time; });
    return all;
  }
  void markDone() {
    client_->set(prefix_ + "done/" + std::to_string(me_), "1");
    client_->add(prefix_ + "done", 1);
  }
  bool allDone() { return client_->add(prefix_ + "done", 0) >= nodes_; }
  // The failure to report when the store cannot be reached: the node that hosted it is lost.
  WorkerFailure storeLost(const std::string& why) const {
    WorkerFailure f;
    f.lost = true;
    f.node = store_node_;
    f.host = store_host_name_.empty() ? o_.rdzv_endpoint : store_host_name_;
    f.time = nowSeconds();
    f.exit_code = kExitFatal;
    f.error_message = "it hosted the rendezvous store at " + o_.rdzv_endpoint + ", which is lost: " + why;
    return f;
  }
  // Before leaving: the store's host waits (a little) for the others to have read the outcome.
  void leave() {
    try {
      client_->add(prefix_ + "left", 1);
      for (int i = 0; server_ && i < 100 && client_->add(prefix_ + "left", 0) < nodes_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } catch (const DistError&) {
    }
  }

 private:
  const LaunchOptions& o_;
  std::string endpoint_host_;
  std::unique_ptr<StoreServer> server_;  // when this agent hosts the store
  std::unique_ptr<StoreClient> client_;
  int store_node_ = 0;           // the node whose agent hosts the store
  std::string store_host_name_;  // its host name
  int nodes_ = 1, me_ = 0;
  std::string prefix_;
  int64_t beat_ = 0;
  std::chrono::steady_clock::time_point last_beat_{};
  std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> beats_;  // last value, since
};

}  // namespace

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
  const int cores = usableCpus();
  if (spec == "cpu") return cores;
  if (spec == "auto" || spec == "gpu") {
    int gpus = countNvidiaGpus();
    if (gpus > 0) return gpus;
    TILER_CHECK(spec == "auto", ConfigError, "--nproc_per_node=gpu but no NVIDIA GPU is visible");
    return cores;
  }
  try {
    size_t used = 0;
    int n = std::stoi(spec, &used);
    if (used == spec.size() && n >= 1) return n;
  } catch (const std::exception&) {
  }
  TILER_THROW(ConfigError,
              "--nproc_per_node must be a positive integer, auto, gpu or cpu; got '" << spec << "'");
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
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
      {"TORCHELASTIC_ERROR_FILE", error_file},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
  };
  if (std::getenv("OMP_NUM_THREADS") == nullptr)
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1, usableCpus() / nproc));
  return env;
}

namespace {

// What ctrun's flags settle: the nodes the world may have and the workers of this node.
struct LaunchPlan {
  int min_nodes = 1, max_nodes = 1;
  int nproc = 1;
  bool multi() const { return max_nodes > 1; }
};

// Checks ctrun's flags and fills in what they leave to it: one node's rank, a static world's endpoint, a
// free port and a run id for one node.
LaunchPlan settleOptions(LaunchOptions& o) {
  TILER_CHECK(!o.command.empty(), ConfigError, "no program to run");
  LaunchPlan plan;
  std::tie(plan.min_nodes, plan.max_nodes) =
      parseNodeRange(o.nnodes_range.empty() ? std::to_string(o.nnodes) : o.nnodes_range);
  TILER_CHECK(o.rdzv_backend == "static" || o.rdzv_backend == "c10d", ConfigError,
              "--rdzv_backend must be static or c10d; got '" << o.rdzv_backend << "'");
  TILER_CHECK(o.max_restarts >= 0, ConfigError, "--max_restarts must be >= 0");
  // Durations become milliseconds in int64: NaN, infinities and negatives are refused by name, and a year
  // is long enough for any of them.
  const auto seconds = [](const char* flag, double v, bool zero_allowed) {
    constexpr double kYear = 365.0 * 24 * 3600;
    TILER_CHECK(std::isfinite(v) && (v > 0 || (zero_allowed && v == 0)) && v <= kYear, ConfigError,
                flag << " must be a number of seconds " << (zero_allowed ? ">= 0" : "> 0")
                     << " and at most a year; got " << v);
  };
  seconds("--monitor_interval", o.monitor_interval, false);
  seconds("--grace_period", o.grace_period, true);
  seconds("--rdzv_timeout", o.rdzv_timeout, false);
  seconds("--rdzv_last_call", o.rdzv_last_call, true);
  seconds("--heartbeat_interval", o.heartbeat_interval, false);
  seconds("--heartbeat_timeout", o.heartbeat_timeout, false);
  TILER_CHECK(o.heartbeat_timeout > o.heartbeat_interval, ConfigError,
              "--heartbeat_timeout must be longer than --heartbeat_interval");
  o.nnodes = plan.max_nodes;
  if (!plan.multi()) {
    if (o.node_rank < 0) o.node_rank = 0;
    TILER_CHECK(o.node_rank == 0, ConfigError, "--node_rank " << o.node_rank << " outside --nnodes 1");
  } else if (o.rdzv_backend == "static") {
    TILER_CHECK(plan.min_nodes == plan.max_nodes, ConfigError,
                "--nnodes MIN:MAX needs --rdzv_backend c10d (static worlds have a fixed size)");
    TILER_CHECK(o.node_rank >= 0 && o.node_rank < plan.max_nodes, ConfigError,
                "--node_rank " << o.node_rank << " outside --nnodes " << plan.max_nodes
                               << " (static rendezvous needs each node's rank; c10d assigns them)");
    TILER_CHECK(o.master_port > 0 && o.master_port < 65535, ConfigError,
                "several nodes need one --master_port (1..65534), the same on every node");
    if (o.rdzv_endpoint.empty()) o.rdzv_endpoint = o.master_addr + ":" + std::to_string(o.master_port + 1);
  } else {
    TILER_CHECK(!o.rdzv_endpoint.empty(), ConfigError,
                "--rdzv_backend c10d needs --rdzv_endpoint HOST:PORT (the same on every node)");
    TILER_CHECK(o.run_id != "none", ConfigError,
                "--rdzv_backend c10d needs --rdzv_id, the same on every node of the job");
  }
  plan.nproc = resolveNprocPerNode(o.nproc_per_node);
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
  if (o.rdzv_backend == "static" && o.node_rank == 0) {
    TILER_CHECK(portIsFree(o.master_port), ConfigError,
                "--master_port " << o.master_port << " is already in use on this host (rank 0 hosts the "
                                 << "store there); pick another or use --master_port 0");
  }
  return plan;
}

// Signals arrive on a self-pipe so the monitor loop handles them in order, outside handler context.
void installSignalPipe() {
  TILER_CHECK(pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, ConfigError, "pipe failed");
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// Where error files (and logs) live, one directory per run; without --log_dir a temporary one, removed at
// the end.
struct RunDirectory {
  std::string path;
  bool temporary = false;
  explicit RunDirectory(const LaunchOptions& o) : temporary(o.log_dir.empty()) {
    if (!temporary) {
      path = o.log_dir + "/" + o.run_id;
      return;
    }
    std::string tmpl = (fs::temp_directory_path() / "ctrun-XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    TILER_CHECK(mkdtemp(buf.data()) != nullptr, ConfigError, "mkdtemp failed");
    path = buf.data();
  }
  ~RunDirectory() {
    if (temporary) removeTree(path);
  }
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
};

// How one attempt of the worker group ended.
struct RoundEnd {
  int signal = 0;                            // ctrun itself was interrupted
  bool marked_done = false;                  // several nodes: this node's workers all succeeded
  std::vector<WorkerFailure> link_failures;  // a lost node or store, noticed here
  bool link_lost = false;                    // the store is gone: no restart can be agreed on
};

// Watches the group (and, with several nodes, the other nodes through `link`) until it succeeds or fails,
// another node fails or is lost, the store is lost, or a signal arrives.
RoundEnd superviseRound(WorkerGroup& group, NodeLink* link, double monitor_interval) {
  RoundEnd end;
  const int interval_ms = std::max(1, int(monitor_interval * 1000));
  for (;;) {
    end.signal = group.monitor(interval_ms);
    if (end.signal != 0) return end;
    if (!link) {
      if (group.state() != GroupState::kHealthy) return end;
      continue;
    }
    try {
      if (group.state() == GroupState::kFailed) {
        link->publish(group.failures());
        return end;
      }
      if (group.state() == GroupState::kSucceeded && !end.marked_done) {
        link->markDone();
        end.marked_done = true;
      }
      if (link->failureCount() > 0) return end;  // a node failed: every node stops
      if (auto lost = link->heartbeat()) {
        link->publish({*lost});
        return end;
      }
      if (end.marked_done && link->allDone()) return end;
    } catch (const DistError& e) {
      end.link_failures.push_back(link->storeLost(e.message()));
      end.link_lost = true;
      return end;
    }
  }
}

// ctrun was interrupted by `sig`: the other nodes hear of it (when the store is still there) and this
// node's workers stop.
void stopOnSignal(WorkerGroup& group, NodeLink* link, bool link_lost, int node_rank, int sig) {
  std::cerr << "ctrun: received " << signalName(sig) << ", stopping workers" << std::endl;
  if (link && !link_lost) {
    WorkerFailure f;
    f.node = node_rank;
    f.host = hostName();
    f.time = nowSeconds();
    f.exit_code = 128 + sig;
    f.error_message = "ctrun on this node received " + signalName(sig);
    try {
      link->publish({f});
    } catch (const DistError&) {
    }
  }
  group.stop(sig == SIGINT ? SIGINT : SIGTERM);
}

void announceRestart(const WorkerFailure& f, int attempt, int max_restarts) {
  std::cerr << "ctrun: "
            << (f.lost ? "node " + std::to_string(f.node) + " lost"
                       : "rank " + std::to_string(f.rank) + " failed (" +
                             (f.signal ? signalName(f.signal) : "exit code " + std::to_string(f.exit_code)) +
                             ")")
            << "; restarting worker group (" << attempt + 1 << " of " << max_restarts << ")" << std::endl;
}

// The rounds of one job: join (several nodes), start the group, supervise it, restart within bounds.
// Returns ctrun's exit code.
int superviseRounds(LaunchOptions& o, const LaunchPlan& plan, const RunDirectory& run_dir) {
  // Several nodes: the agents' link (the store is hosted here when the endpoint is this host).
  std::unique_ptr<NodeLink> link = plan.multi() ? std::make_unique<NodeLink>(o) : nullptr;

  int exit_code = 0;
  bool link_lost = false;  // the store is gone: no restart can be agreed on
  std::vector<WorkerFailure> last_failures;
  int attempt = 0;
  for (;; ++attempt) {
    LaunchOptions round = o;
    if (link) {
      const NodeLink::Round r = link->join(attempt, plan.min_nodes, plan.max_nodes);
      round.node_rank = r.node_rank;
      round.nnodes = r.nodes;
      round.master_addr = r.master_addr;
      round.master_port = r.master_port;
    }
    WorkerGroup group(round, plan.nproc, run_dir.path + "/attempt_" + std::to_string(attempt), attempt);
    group.start();
    const RoundEnd end = superviseRound(group, link.get(), o.monitor_interval);
    link_lost = link_lost || end.link_lost;
    if (end.signal != 0) {
      stopOnSignal(group, link.get(), link_lost, round.node_rank, end.signal);
      exit_code = 128 + end.signal;
      break;
    }
    const bool succeeded = link
                               ? end.marked_done && end.link_failures.empty() && !link_lost && link->allDone()
                               : group.state() == GroupState::kSucceeded;
    if (succeeded) {
      group.closeStreams();
      exit_code = 0;
      last_failures.clear();
      break;
    }
    // The first failure, on any node, fails the group.
    group.stop(SIGTERM);
    last_failures = end.link_failures;
    if (link && !link_lost) {
      try {
        last_failures = link->failures();
      } catch (const DistError&) {
        link_lost = true;
      }
    }
    if (last_failures.empty()) last_failures = group.failures();
    if (last_failures.empty()) {  // the store went away before any failure was recorded
      std::cerr << "ctrun: the worker group stopped and no failure was recorded (rendezvous store lost)\n";
      exit_code = 1;
      break;
    }
    exit_code = last_failures.front().exit_code;
    if (attempt >= o.max_restarts || link_lost) break;
    announceRestart(last_failures.front(), attempt, o.max_restarts);
  }
  if (!last_failures.empty()) printSummary(last_failures, o, attempt + 1);
  if (link && !link_lost) link->leave();
  return exit_code;
}

}  // namespace

Launcher::Launcher(LaunchOptions options) : options_(std::move(options)) {}

int Launcher::run() {
  LaunchOptions& o = options_;
  const LaunchPlan plan = settleOptions(o);
  installSignalPipe();
  const RunDirectory run_dir(o);
  try {
    return superviseRounds(o, plan, run_dir);
  } catch (const Interrupted& i) {
    // Waiting at the rendezvous: no worker of this node runs yet, nothing to stop.
    std::cerr << "ctrun: received " << signalName(i.signal) << " while waiting at the rendezvous; stopping"
              << std::endl;
    return 128 + i.signal;
  }
}

}  // namespace tiler
