#include "tiler/ctrun/launcher.hpp"

#include "test_util.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/ctrun/agent.hpp"
#include "tiler/ctrun/options.hpp"
#include "tiler/ctrun/signals.hpp"
#include "tiler/ctrun/streams.hpp"
#include "tiler/ctrun/worker_group.hpp"
#include "tiler/net/tcp_store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace tiler {
namespace {

const std::string kCtrun = std::string(TILER_BIN_DIR) + "/ctrun";
const std::string kHelper = CTRUN_HELPER;

auto run = test::runCommand;
using test::slurp;
std::string tempDir(const std::string& name) {
  return test::scratchDir("launcher_" + name);
}

bool alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  return close_paren != std::string::npos && stat[close_paren + 2] != 'Z';
}

// ctrun (or one agent of a multi-node job) started in the background: its output goes to `log`; with
// prefix "exec " the pid is ctrun's own.
pid_t startAgent(const std::string& args, const std::string& log, const std::string& prefix = "") {
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", (prefix + kCtrun + " " + args + " >" + log + " 2>&1").c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

// NAME=VALUE lines (the helper's env and environ modes).
std::map<std::string, std::string> envFile(const std::string& path) {
  std::map<std::string, std::string> env;
  std::istringstream in(test::slurp(path));
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

TEST(Launcher, EveryRankGetsTorchrunsEnvironment) {
  auto dir = tempDir("env");
  auto r = run("env -u OMP_NUM_THREADS " + kCtrun + " --nproc-per-node=3 --master_port 0 --run_id myrun " +
               kHelper + " env " + dir);
  ASSERT_EQ(r.code, 0) << r.output;
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    std::string env = slurp(dir + "/env_" + std::to_string(rank));
    EXPECT_NE(env.find("RANK=" + std::to_string(rank) + "\n"), std::string::npos) << env;
    EXPECT_NE(env.find("LOCAL_RANK=" + std::to_string(rank) + "\n"), std::string::npos);
    EXPECT_NE(env.find("WORLD_SIZE=3\n"), std::string::npos);
    EXPECT_NE(env.find("LOCAL_WORLD_SIZE=3\n"), std::string::npos);
    EXPECT_NE(env.find("GROUP_RANK=0\n"), std::string::npos);
    EXPECT_NE(env.find("GROUP_WORLD_SIZE=1\n"), std::string::npos);
    EXPECT_NE(env.find("MASTER_ADDR=127.0.0.1\n"), std::string::npos);
    EXPECT_NE(env.find("TORCHELASTIC_RESTART_COUNT=0\n"), std::string::npos);
    EXPECT_NE(env.find("TORCHELASTIC_MAX_RESTARTS=0\n"), std::string::npos);
    EXPECT_NE(env.find("TORCHELASTIC_RUN_ID=myrun\n"), std::string::npos);
    EXPECT_NE(env.find("/" + std::to_string(rank) + "/error.json\n"), std::string::npos)
        << "per-worker error file";
    // OMP_NUM_THREADS depends on the CPUs: CountsOnlyTheCpusItMayRunOn checks it under known masks.
    EXPECT_NE(env.find("OMP_NUM_THREADS="), std::string::npos);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(env, m, std::regex("MASTER_PORT=(\\d+)\n")));
    if (rank == 0) port = m[1];
    EXPECT_EQ(m[1], port) << "one port for the world";
    EXPECT_NE(port, "0");
  }
}

// Debian trixie's python3-torch 2.6 is built without libuv, yet its TCPStore asks for it unless USE_LIBUV=0
// (torch 2.4+ reads it; 1.13 ignores it): set for PyTorch's own launcher and scripts in these tests.
const std::string kNoLibuv = "USE_LIBUV=0";

// The whole environment of a worker, compared with what PyTorch's own torchrun (Debian's 1.13) gives the same
// worker for the same flags: every variable either sets, with the same value.
TEST(Launcher, EveryWorkerGetsTheEnvironmentTorchrunGivesIt) {
  if (run("/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null").code != 0)
    GTEST_SKIP() << "no PyTorch for /usr/bin/python3 (python3-torch)";
  // Debian trixie's 2.6 is built without libuv yet its TCPStore asks for it, and torchrun's static rendezvous
  // passes no use_libuv: torchrun itself cannot start there.
  if (run("/usr/bin/python3 -c 'import torch.distributed as d; d.TCPStore(\"127.0.0.1\", " +
          std::to_string(test::freePort()) + ", 1, True)' 2>/dev/null")
          .code != 0)
    GTEST_SKIP()
        << "this PyTorch's TCPStore cannot start with its defaults (built without libuv): no torchrun";
  const std::string ours = tempDir("environ_ctrun"), theirs = tempDir("environ_torchrun");
  const std::string flags = "--nproc_per_node 2 --master_port " + std::to_string(test::freePort()) +
                            " --rdzv_id envjob --max_restarts 1 --role trainer --monitor_interval 0.1 ";
  // Debian's 1.13 cannot parse its own -r/-t defaults (docs/cli.md).
  // USE_LIBUV=0 for both (a worker inherits it): trixie's torch 2.6 has no libuv (kNoLibuv).
  auto t = run("env -u NCCL_ASYNC_ERROR_HANDLING -u TORCH_NCCL_ASYNC_ERROR_HANDLING " + kNoLibuv +
               " /usr/bin/python3 -m torch.distributed.run -r 2 -t 2 " + flags + "--no_python " + kHelper +
               " environ " + theirs);
  ASSERT_EQ(t.code, 0) << t.output;
  auto c = run("env -u NCCL_ASYNC_ERROR_HANDLING -u TORCH_NCCL_ASYNC_ERROR_HANDLING " + kNoLibuv + " " +
               kCtrun + " " + flags + "--no_python " + kHelper + " environ " + ours);
  ASSERT_EQ(c.code, 0) << c.output;
  // Where they differ by design: each worker's own error file; OMP_NUM_THREADS is ctrun's share of the CPUs
  // (torchrun: 1); ctrun's agent serves no c10d store on MASTER_PORT, so tiler's rank 0 hosts it.
  const std::set<std::string> own_values = {"TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
                                            "TORCHELASTIC_USE_AGENT_STORE"};
  // torch 2.x's name for what 1.13 calls NCCL_ASYNC_ERROR_HANDLING: ctrun sets both.
  const std::string newer = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
  for (int rank = 0; rank < 2; ++rank) {
    auto a = envFile(theirs + "/environ_" + std::to_string(rank));
    auto b = envFile(ours + "/environ_" + std::to_string(rank));
    ASSERT_FALSE(a.empty() || b.empty()) << t.output << c.output;
    for (auto* env : {&a, &b}) {
      for (const auto& [name, value] : *env) {
        const std::string mine = b.count(name) ? b[name] : "<unset>";
        const std::string torchrun = a.count(name) ? a[name] : "<unset>";
        if (name == newer) {
          EXPECT_EQ(mine, "1") << name << " rank " << rank;
          EXPECT_TRUE(torchrun == "<unset>" || torchrun == "1") << name << "=" << torchrun;
        } else if (own_values.count(name)) {
          EXPECT_TRUE(a.count(name) && b.count(name)) << name << " rank " << rank;
        } else {
          EXPECT_EQ(mine, torchrun) << name << " rank " << rank;
        }
      }
    }
  }
}

TEST(Launcher, UserOmpNumThreadsIsKept) {
  auto dir = tempDir("omp");
  auto r =
      run("OMP_NUM_THREADS=7 " + kCtrun + " --nproc_per_node 2 --master_port 0 " + kHelper + " env " + dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(slurp(dir + "/env_1").find("OMP_NUM_THREADS=7\n"), std::string::npos);
}

// A Slurm or cgroup cpuset (here taskset) gives ctrun fewer CPUs than the machine has: the workers' share of
// OMP_NUM_THREADS and --nproc_per_node cpu come from those, not from every CPU of the machine (a 4-CPU job on
// a 64-core node would otherwise start 64 workers, or give each of 2 workers 32 threads).
TEST(Launcher, CountsOnlyTheCpusItMayRunOn) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  if (CPU_COUNT(&mine) < 2) GTEST_SKIP() << "needs 2 CPUs to run on one of them";
  int first = 0;
  while (!CPU_ISSET(first, &mine)) ++first;
  int second = first + 1;
  while (!CPU_ISSET(second, &mine)) ++second;
  cpu_set_t one, two;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  two = one;
  CPU_SET(second, &two);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int pinned = usableCpus();
  const int nproc = ctrun::resolveNprocPerNode("cpu");
  ASSERT_EQ(sched_setaffinity(0, sizeof two, &two), 0);
  const int paired = usableCpus();
  ASSERT_EQ(sched_setaffinity(0, sizeof mine, &mine), 0);
  EXPECT_EQ(pinned, 1);
  EXPECT_EQ(nproc, 1);
  // Two CPUs in the mask are two, unless this process's cgroup allows it only one (a quota of 1 CPU).
  const int quota = cgroupCpuQuota(slurp("/proc/self/cgroup"), "/sys/fs/cgroup");
  EXPECT_EQ(paired, quota == 1 ? 1 : 2);

  const std::string taskset = "env -u OMP_NUM_THREADS taskset -c " + std::to_string(first) + " ";
  auto dir = tempDir("cpuset");
  auto r = run(taskset + kCtrun + " --nproc_per_node 1 --master_port 0 " + kHelper + " env " + dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(slurp(dir + "/env_0").find("OMP_NUM_THREADS=1\n"), std::string::npos) << slurp(dir + "/env_0");
  auto per_cpu = tempDir("cpuset_cpu");
  r = run(taskset + kCtrun + " --nproc_per_node cpu --master_port 0 " + kHelper + " env " + per_cpu);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(slurp(per_cpu + "/env_0").find("LOCAL_WORLD_SIZE=1\n"), std::string::npos)
      << slurp(per_cpu + "/env_0");
  EXPECT_FALSE(fs::exists(per_cpu + "/env_1")) << "one worker for the one CPU";
  // Two CPUs: one worker takes both, two workers one each.
  const std::string pair = "env -u OMP_NUM_THREADS taskset -c " + std::to_string(first) + "," +
                           std::to_string(second) + " " + kCtrun + " --master_port 0 --nproc_per_node ";
  for (int workers : {1, 2}) {
    auto out = tempDir("cpuset_pair" + std::to_string(workers));
    r = run(pair + std::to_string(workers) + " " + kHelper + " env " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(
        slurp(out + "/env_0").find("OMP_NUM_THREADS=" + std::to_string(std::max(1, paired / workers)) + "\n"),
        std::string::npos)
        << slurp(out + "/env_0");
  }
}

// ctrun in a cgroup of one CPU's quota (as `docker --cpus 1` makes) on a machine of more: one worker of one
// thread. Needs a cgroup v1 cpu hierarchy it may write (root); skipped elsewhere.
TEST(Launcher, AContainersCpuQuotaSizesTheWorkers) {
  if (usableCpus() < 2) GTEST_SKIP() << "needs 2 CPUs";
  const std::string self = slurp("/proc/self/cgroup");
  std::smatch m;
  if (!std::regex_search(self, m, std::regex("(^|\n)\\d+:([^:\n]*\\bcpu\\b[^:\n]*):([^\n]*)")))
    GTEST_SKIP() << "no cgroup v1 cpu controller";
  const fs::path cgroup = fs::path("/sys/fs/cgroup") / m[2].str() / fs::path(m[3].str()).relative_path() /
                          ("tiler_test_" + std::to_string(getpid()));
  std::error_code ec;
  if (!fs::create_directory(cgroup, ec)) GTEST_SKIP() << "cannot make a cgroup: " << ec.message();
  struct Remove {
    fs::path dir;
    ~Remove() { rmdir(dir.c_str()); }  // empty once its processes have exited
  } remove{cgroup};
  std::ofstream(cgroup / "cpu.cfs_period_us") << "100000\n";
  std::ofstream(cgroup / "cpu.cfs_quota_us") << "100000\n";
  ASSERT_EQ(slurp((cgroup / "cpu.cfs_quota_us").string()), "100000\n");
  auto dir = tempDir("quota");
  auto r = run("env -u OMP_NUM_THREADS sh -c 'echo $$ > " + (cgroup / "cgroup.procs").string() + " && exec " +
               kCtrun + " --nproc_per_node cpu --master_port 0 " + kHelper + " env " + dir + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string env = slurp(dir + "/env_0");
  EXPECT_NE(env.find("LOCAL_WORLD_SIZE=1\n"), std::string::npos) << env;
  EXPECT_NE(env.find("OMP_NUM_THREADS=1\n"), std::string::npos) << env;
  EXPECT_FALSE(fs::exists(dir + "/env_1")) << "one worker for one CPU's quota";
}

TEST(Launcher, FailedRankTearsDownTheGroupAndIsNamedWithItsCode) {
  auto r = run(kCtrun + " --nproc_per_node 3 --master_port 0 --grace_period 2 " + kHelper + " exit-rank 1 3");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_LT(r.seconds, 10) << "the others were stopped after the 2 s grace, not left running";
  EXPECT_NE(r.output.find("Root cause (first failure):\n  rank:        1 (local_rank 1)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("exitcode:    3\n"), std::string::npos) << r.output;
  // The two ranks ctrun stopped did not fail (torchrun's summary: <NO_OTHER_FAILURES>).
  EXPECT_NE(r.output.find("(1 worker(s) failed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Other failures"), std::string::npos) << r.output;
}

TEST(Launcher, WhatAFailedWorkerStartedDiesWithTheGroup) {
  const std::string dir = test::scratchDir("launcher_children");
  // Rank 0 starts a long sleep in the background and fails; rank 1 runs on until it is stopped.
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 --grace_period 1 bash -c '" +
               "if [ $LOCAL_RANK = 0 ]; then sleep 300 & echo $! > " + dir + "/child; sleep 0.3; exit 4; " +
               "else sleep 300 & echo $! > " + dir + "/child1; wait; fi'");
  EXPECT_EQ(r.code, 4) << r.output;
  for (const char* f : {"/child", "/child1"}) {
    const pid_t child = pid_t(std::stol(test::slurp(dir + f)));
    for (int i = 0; i < 50 && alive(child); ++i) usleep(20000);
    EXPECT_FALSE(alive(child)) << f << " " << child << " outlived ctrun";
  }
}

TEST(Launcher, SignalDeathIsNamedBySignal) {
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 --grace_period 1 " + kHelper + " segv-rank 0");
  EXPECT_EQ(r.code, 128 + SIGSEGV) << r.output;
  EXPECT_NE(r.output.find("rank:        0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("SIGSEGV"), std::string::npos) << r.output;
}

TEST(Launcher, ErrorFileContentIsInTheSummary) {
  auto r = run(kCtrun + " --nproc_per_node 1 --master_port 0 " + kHelper + " error-file");
  EXPECT_EQ(r.code, 7);
  EXPECT_NE(r.output.find("error:       disk on fire"), std::string::npos) << r.output;
}

TEST(Launcher, RestartSucceedsOnTheSecondAttempt) {
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 --max_restarts 2 --grace_period 1 " + kHelper +
               " fail-first-attempt");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("restarting worker group (1 of 2)"), std::string::npos) << r.output;
  auto bad =
      run(kCtrun + " --nproc_per_node 2 --master_port 0 --max_restarts 0 " + kHelper + " fail-first-attempt");
  EXPECT_EQ(bad.code, 5) << bad.output;
}

TEST(Launcher, AWorkerSignalledBeforeItsExecIsNotASignalToCtrun) {
  // The group's SIGTERM can reach a worker forked but not yet exec'd (a rank failed at once on a loaded
  // machine): it must stop that worker, not run ctrun's handler in the child and so read, in ctrun, as a
  // signal that reached ctrun (which ends the job instead of reporting the failure). In a child process: the
  // handlers are ctrun's for its lifetime.
  const std::string dir = tempDir("term_before_exec");
  const pid_t child = fork();
  if (child == 0) {
    ctrun::installSignalPipe();
    LaunchOptions options;
    options.grace_period = 5;
    int misread = 0;
    for (int attempt = 0; attempt < 20; ++attempt) {
      ctrun::WorkerGroup group(options, {"sleep", "30"}, 4, dir + "/" + std::to_string(attempt), 0);
      group.start();
      misread += group.stop(SIGTERM) != 0 ? 1 : 0;
    }
    _exit(misread);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "of 20 groups stopped at once, this many read a signal to ctrun";
}

void killCtrunAndCheckNoWorkerSurvives(int sig, bool workers_ignore_term) {
  auto dir = tempDir("kill" + std::to_string(sig));
  pid_t ctrun = fork();
  if (ctrun == 0) {
    std::vector<std::string> args = {
        kCtrun, "--nproc_per_node", "2", "--master_port", "0", "--grace_period", "1", kHelper, "sleep", dir,
        "60"};
    if (workers_ignore_term) args.push_back("ignore-term");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  std::vector<pid_t> workers;
  for (int i = 0; i < 100 && workers.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    workers.clear();
    for (int rank = 0; rank < 2; ++rank) {
      std::string pid = slurp(dir + "/pid_" + std::to_string(rank));
      if (!pid.empty()) workers.push_back(std::stoi(pid));
    }
  }
  ASSERT_EQ(workers.size(), 2u);
  kill(ctrun, sig);
  int status = 0;
  waitpid(ctrun, &status, 0);
  if (sig != SIGKILL) {  // ctrun handles the signal: it stops the workers, then exits 128 + signal
    EXPECT_TRUE(WIFEXITED(status)) << "ctrun died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig);
  }
  auto deadline = Clock::now() + std::chrono::seconds(3);
  for (pid_t w : workers) {
    while (alive(w) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(alive(w)) << "worker " << w << " outlived ctrun (signal " << sig << ")";
  }
}

TEST(Launcher, SigtermToCtrunStopsEveryWorker) {
  killCtrunAndCheckNoWorkerSurvives(SIGTERM, false);
}
TEST(Launcher, SigtermEscalatesToSigkillAfterGrace) {
  killCtrunAndCheckNoWorkerSurvives(SIGTERM, true);
}
// torchrun handles SIGQUIT as SIGTERM (torch elastic's multiprocessing/api.py): so does ctrun, rather than
// dying of it and leaving the workers to PDEATHSIG's SIGKILL without a grace period or a summary.
TEST(Launcher, SigquitToCtrunStopsEveryWorkerAsTorchrunDoes) {
  killCtrunAndCheckNoWorkerSurvives(SIGQUIT, false);
}
// torch 2.x's --signals_to_handle: Slurm's SIGUSR1 (sent before a preemption) reaches the workers as
// SIGUSR1, so they can save their state, and stops the job; it used to kill ctrun outright, its workers
// following by PDEATHSIG's SIGKILL.
TEST(Launcher, SignalsToHandleAreForwardedToTheWorkers) {
  const std::string dir = tempDir("usr1");
  const pid_t ctrun = startAgent(
      "--nproc_per_node 2 --master_port 0 --signals_to_handle SIGTERM,SIGUSR1 "
      "bash -c 'trap \"touch " +
          dir + "/usr1_$LOCAL_RANK; exit 0\" USR1; touch " + dir +
          "/ready_$LOCAL_RANK; while :; do sleep 30 & wait; done'",
      dir + "/ctrun.log", "exec ");
  for (int i = 0; i < 400 && !(fs::exists(dir + "/ready_0") && fs::exists(dir + "/ready_1")); ++i)
    usleep(25000);
  ASSERT_TRUE(fs::exists(dir + "/ready_1")) << slurp(dir + "/ctrun.log");
  kill(ctrun, SIGUSR1);
  int status = 0;
  waitpid(ctrun, &status, 0);
  const std::string log = slurp(dir + "/ctrun.log");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGUSR1) << status << "\n" << log;
  EXPECT_TRUE(fs::exists(dir + "/usr1_0") && fs::exists(dir + "/usr1_1")) << "each worker got SIGUSR1\n"
                                                                          << log;
  EXPECT_NE(log.find("received SIGUSR1, stopping workers"), std::string::npos) << log;
  EXPECT_THROW(ctrun::parseSignalList("SIGTERM,SIGNOPE", "--signals_to_handle"), ConfigError);
  EXPECT_THROW(ctrun::parseSignalList("SIGKILL", "--signals_to_handle"), ConfigError);
  EXPECT_EQ(ctrun::parseSignalList("SIGUSR1,SIGUSR2", "--signals_to_handle"),
            (std::vector<int>{SIGUSR1, SIGUSR2}));
}

TEST(Launcher, SigkillToCtrunStillKillsWorkers) {
  killCtrunAndCheckNoWorkerSurvives(SIGKILL, true);
}

TEST(Launcher, BusyMasterPortIsReportedBeforeAnyWorkerStarts) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  auto dir = tempDir("busy");
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port " + std::to_string(port) + " " + kHelper +
               " env " + dir);
  close(fd);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--master_port " + std::to_string(port) + " is already in use"), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::is_empty(dir)) << "no worker may start";
}

// A progress bar (tqdm) redraws its line after a carriage return: each redraw is passed on as it comes,
// prefixed, rather than held until the bar's last newline; "\r\n" stays one line end.
TEST(Launcher, AProgressBarsRedrawsAreLinesOfTheirOwn) {
  auto r =
      run(kCtrun + " --nproc_per_node 2 --master_port 0 --local_ranks_filter 0 sh -c " +
          "'printf \"10%%\\r\"; sleep 0.2; printf \"50%%\\r\"; sleep 0.2; printf \"done\\r\\nnext\\n\"'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0]: 10%\r[rank 0]: 50%\r[rank 0]: done\r\n[rank 0]: next\n"),
            std::string::npos)
      << r.output;
}

TEST(Launcher, OutputLinesArePrefixedAndNeverBroken) {
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kHelper + " lines 3000");
  ASSERT_EQ(r.code, 0);
  std::istringstream in(r.output);
  std::string line;
  int count[2] = {0, 0};
  const std::regex pattern("\\[rank ([01])\\]: rank ([01]) line \\d+ x{200}");
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.find("no newline at the end") != std::string::npos) continue;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << "broken line: " << line.substr(0, 120);
    EXPECT_EQ(m[1], m[2]);
    ++count[std::stoi(m[1])];
  }
  EXPECT_EQ(count[0], 3000);
  EXPECT_EQ(count[1], 3000);
  EXPECT_NE(r.output.find("[rank 1]: no newline at the end\n"), std::string::npos)
      << "last partial line flushed";
}

// The run directories that ctrun made under `log_dir` for `run_id` (torchrun's `<run_id>_<random>`).
std::vector<std::string> runDirectories(const std::string& log_dir, const std::string& run_id) {
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(log_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(run_id + "_", 0) == 0 && name.size() == run_id.size() + 7)
      dirs.push_back(entry.path().string());
  }
  return dirs;
}

TEST(Launcher, LogDirRedirectsAndTees) {
  auto dir = tempDir("logs");
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 --run_id r1 --log_dir " + dir +
               " --redirects 3 " + kHelper + " lines 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("line 0"), std::string::npos) << "redirected output stays off the console";
  auto r1 = runDirectories(dir, "r1");
  ASSERT_EQ(r1.size(), 1u) << r.output;
  EXPECT_NE(r.output.find("ctrun: logs under " + r1[0]), std::string::npos) << r.output;
  std::string log = slurp(r1[0] + "/attempt_0/1/stdout.log");
  EXPECT_NE(log.find("rank 1 line 4 "), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(r1[0] + "/attempt_0/0/stderr.log"));
  auto tee = run(kCtrun + " --nproc_per_node 2 --master_port 0 --run_id r2 --log_dir " + dir + " --tee 3 " +
                 kHelper + " lines 5");
  EXPECT_NE(tee.output.find("[rank 0]: rank 0 line 4"), std::string::npos);
  auto r2 = runDirectories(dir, "r2");
  ASSERT_EQ(r2.size(), 1u) << tee.output;
  EXPECT_NE(slurp(r2[0] + "/attempt_0/0/stdout.log").find("rank 0 line 4"), std::string::npos);
  // The same run id again (a rerun, or another node on a shared directory) keeps the first run's logs.
  auto again = run(kCtrun + " --nproc_per_node 1 --master_port 0 --run_id r1 --log_dir " + dir +
                   " --redirects 3 " + kHelper + " lines 1");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(runDirectories(dir, "r1").size(), 2u);
  EXPECT_NE(slurp(r1[0] + "/attempt_0/1/stdout.log").find("rank 1 line 4 "), std::string::npos);
}

TEST(Launcher, ResolvesNprocAndRejectsNonsense) {
  EXPECT_GE(ctrun::resolveNprocPerNode("cpu"), 1);
  EXPECT_EQ(ctrun::resolveNprocPerNode("4"), 4);
  EXPECT_EQ(ctrun::resolveNprocPerNode("auto"),
            ctrun::countNvidiaGpus() > 0 ? ctrun::countNvidiaGpus() : ctrun::resolveNprocPerNode("cpu"));
  EXPECT_ANY_THROW(ctrun::resolveNprocPerNode("0"));
  EXPECT_ANY_THROW(ctrun::resolveNprocPerNode("two"));
  EXPECT_EQ(ctrun::resolveNprocPerNode(std::to_string(ctrun::kMaxWorkersPerNode)), ctrun::kMaxWorkersPerNode);
  EXPECT_THROW(ctrun::resolveNprocPerNode(std::to_string(ctrun::kMaxWorkersPerNode + 1)), ConfigError);
  EXPECT_THROW(ctrun::resolveNprocPerNode("99999999999"), ConfigError);
  EXPECT_EQ(ctrun::parseNodeRange("2"), std::make_pair(2, 2));
  EXPECT_EQ(ctrun::parseNodeRange("1:4"), std::make_pair(1, 4));
  EXPECT_THROW(ctrun::parseNodeRange("4:1"), ConfigError);
  EXPECT_THROW(ctrun::parseNodeRange("0"), ConfigError);
  EXPECT_THROW(ctrun::parseNodeRange("2x"), ConfigError);
  auto r = run(kCtrun + " --nproc_per_node banana " + kHelper + " env /tmp");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--nproc_per_node must be"), std::string::npos);
  // Durations: NaN, infinities and negatives are refused by name, in one line without "ctrun: ctrun:".
  for (const std::string bad : {"--grace_period nan", "--grace_period -1", "--grace_period inf",
                                "--rdzv_timeout nan", "--monitor_interval 0", "--heartbeat_timeout 1e300",
                                "--rdzv_timeout 2147484", "--heartbeat_timeout 2147483.648"}) {
    auto refused = run(kCtrun + " " + bad + " " + kHelper + " env /tmp");
    EXPECT_EQ(refused.code, 1) << bad << "\n" << refused.output;
    EXPECT_NE(refused.output.find(bad.substr(0, bad.find(' ')) + " must be a number of seconds"),
              std::string::npos)
        << bad << "\n"
        << refused.output;
    EXPECT_EQ(refused.output.find("ctrun: error: ctrun:"), std::string::npos) << refused.output;
  }
  // tiler's --timeout bound (2^31-1 ms) holds for ctrun's rendezvous and heartbeat timeouts too.
  auto longest = run(kCtrun + " --master_port 0 --rdzv_timeout 2147483 --heartbeat_timeout 2147483 " +
                     kHelper + " env " + tempDir("longest"));
  EXPECT_EQ(longest.code, 0) << longest.output;
  // torchrun's static world of several nodes without --node_rank: the flag to add is named (not a -1 the
  // user never wrote).
  auto rankless = run(kCtrun + " --nnodes 2 --master_port 29500 " + kHelper + " env /tmp");
  EXPECT_EQ(rankless.code, 1) << rankless.output;
  EXPECT_NE(
      rankless.output.find("--nnodes 2 with the static rendezvous needs --node_rank (0..1) on each node"),
      std::string::npos)
      << rankless.output;
  // Bounds a typo would cross: refused in one line before any worker starts, from the flag or PET_.
  for (const std::string& args : {std::string("--nproc_per_node 100000"), std::string("PET")}) {
    auto many = run((args == "PET" ? "PET_NPROC_PER_NODE=100000 " + kCtrun : kCtrun + " " + args) +
                    " --master_port 0 " + kHelper + " env /nonexistent");
    EXPECT_EQ(many.code, 1) << many.output;
    EXPECT_NE(many.output.find("100000 workers; ctrun starts at most"), std::string::npos) << many.output;
  }
  auto few_files = run("ulimit -n 256; " + kCtrun + " --nproc_per_node 200 --master_port 0 " + kHelper +
                       " env /nonexistent");
  EXPECT_EQ(few_files.code, 1) << few_files.output;
  EXPECT_NE(few_files.output.find("ulimit -n"), std::string::npos) << few_files.output;
  auto hidden = run(kCtrun + " --nproc_per_node 2 --local_ranks_filter 0,5 --master_port 0 " + kHelper +
                    " env /nonexistent");
  EXPECT_EQ(hidden.code, 1) << hidden.output;
  EXPECT_NE(hidden.output.find("names local rank 5"), std::string::npos) << hidden.output;
  auto missing = run(kCtrun + " --master_port 0 /no/such/program");
  EXPECT_EQ(missing.code, 127) << missing.output;
  EXPECT_NE(missing.output.find("cannot run '/no/such/program'"), std::string::npos);
}

TEST(Launcher, WorkerEnvironmentForMultiNode) {
  LaunchOptions o;
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.0.0.1";
  o.master_port = 1234;
  auto env = ctrun::workerEnvironment(o, 4, 2, 1, "/tmp/e.json");
  EXPECT_EQ(env["RANK"], "6");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
}

TEST(Launcher, ASigtermWhileAFailedGroupStopsEndsTheJobInsteadOfRestarting) {
  // Rank 1 fails; rank 0 notes the SIGTERM that starts the stop and ignores it, so ctrun waits out the grace
  // period. ctrun's own SIGTERM then (the user's, or a scheduler's) must end the job, not be taken as a
  // second signal of the stop and forgotten by the restart that --max_restarts would allow.
  const std::string dir = tempDir("term_in_stop");
  const pid_t ctrun = startAgent(
      "--nproc_per_node 2 --master_port 0 --max_restarts 3 --grace_period 20 bash -c 'if [ $LOCAL_RANK = 1 "
      "]; "
      "then sleep 0.2; exit 3; fi; trap \"touch " +
          dir + "/termed_$TORCHELASTIC_RESTART_COUNT\" TERM; while :; do sleep 30 & wait; done'",
      dir + "/ctrun.log", "exec ");
  for (int i = 0; i < 400 && !fs::exists(dir + "/termed_0"); ++i) usleep(25000);
  ASSERT_TRUE(fs::exists(dir + "/termed_0")) << slurp(dir + "/ctrun.log");
  const auto t0 = Clock::now();
  kill(ctrun, SIGTERM);
  int status = 0;
  waitpid(ctrun, &status, 0);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string log = slurp(dir + "/ctrun.log");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << status << "\n" << log;
  EXPECT_EQ(log.find("restarting worker group"), std::string::npos) << log;
  EXPECT_NE(log.find("received SIGTERM while stopping the failed workers; not restarting"), std::string::npos)
      << log;
  EXPECT_NE(log.find("Root cause (first failure):\n  rank:        1 (local_rank 1)"), std::string::npos)
      << log;
  EXPECT_LT(seconds, 10) << "SIGKILL at the signal, not after the 20 s grace period";
}

// The agent's table, cell by cell: the transitions ctrun's supervision promises (a failure anywhere stops
// every worker and restarts within bounds, a signal ends the job, success needs every node), and every
// other (state, event) refused as impossible.
TEST(Launcher, TheAgentsStateTableCoversEveryStateAndEvent) {
  using ctrun::GroupAction;
  using ctrun::GroupEvent;
  using ctrun::GroupState;
  using S = GroupState;
  using E = GroupEvent;
  using A = GroupAction;
  const std::map<std::pair<S, E>, std::pair<S, A>> expected = {
      {{S::kInit, E::kJoined}, {S::kHealthy, A::kStartWorkers}},
      {{S::kInit, E::kSignal}, {S::kDone, A::kReportInterrupted}},
      {{S::kHealthy, E::kWorkersSucceeded}, {S::kSucceeded, A::kMarkDone}},
      {{S::kHealthy, E::kWorkerFailed}, {S::kFailed, A::kPublishFailures}},
      {{S::kHealthy, E::kPeerFailed}, {S::kFailed, A::kNone}},
      {{S::kHealthy, E::kNodeLost}, {S::kFailed, A::kPublishLoss}},
      {{S::kHealthy, E::kStoreLost}, {S::kFailed, A::kNone}},
      {{S::kHealthy, E::kSignal}, {S::kDone, A::kStopOnSignal}},
      {{S::kSucceeded, E::kWorldSucceeded}, {S::kDone, A::kFinish}},
      {{S::kSucceeded, E::kPeerFailed}, {S::kFailed, A::kNone}},
      {{S::kSucceeded, E::kNodeLost}, {S::kFailed, A::kPublishLoss}},
      {{S::kSucceeded, E::kStoreLost}, {S::kFailed, A::kNone}},
      {{S::kSucceeded, E::kSignal}, {S::kDone, A::kStopOnSignal}},
      {{S::kFailed, E::kWorkersStopped}, {S::kStopped, A::kCollectFailures}},
      {{S::kStopped, E::kRestartAllowed}, {S::kInit, A::kRestart}},
      {{S::kStopped, E::kRestartsExhausted}, {S::kDone, A::kReportFailure}},
      {{S::kStopped, E::kSignal}, {S::kDone, A::kEndOnSignal}},
  };
  std::set<std::string> names;
  std::map<S, std::set<S>> edges;
  for (int si = 0; si < ctrun::kGroupStateCount; ++si) {
    const S s = S(si);
    names.insert(std::string("state ") + ctrun::groupStateName(s));
    for (int ei = 0; ei < ctrun::kGroupEventCount; ++ei) {
      const E e = E(ei);
      if (si == 0) names.insert(std::string("event ") + ctrun::groupEventName(e));
      const auto t = ctrun::groupTransition(s, e);
      const std::string cell = std::string(ctrun::groupStateName(s)) + " x " + ctrun::groupEventName(e);
      const auto it = expected.find({s, e});
      if (it == expected.end()) {
        EXPECT_EQ(t.action, A::kInvalid) << cell << " -> " << ctrun::groupActionName(t.action);
        EXPECT_EQ(t.next, s) << cell;
        continue;
      }
      EXPECT_EQ(t.next, it->second.first) << cell << " -> " << ctrun::groupStateName(t.next);
      EXPECT_EQ(t.action, it->second.second) << cell << " -> " << ctrun::groupActionName(t.action);
      edges[s].insert(t.next);
    }
  }
  EXPECT_EQ(names.size(), size_t(ctrun::kGroupStateCount + ctrun::kGroupEventCount)) << "every name distinct";
  // From every state the job can end, and every state can be reached from the start.
  for (int si = 0; si < ctrun::kGroupStateCount; ++si) {
    std::set<S> seen = {S(si)};
    for (bool grew = true; grew;) {
      grew = false;
      for (S from : std::set<S>(seen))
        for (S to : edges[from]) grew |= seen.insert(to).second;
    }
    EXPECT_TRUE(seen.count(S::kDone)) << ctrun::groupStateName(S(si)) << " never ends";
    if (si == int(S::kInit)) {
      EXPECT_EQ(seen.size(), size_t(ctrun::kGroupStateCount)) << "a state is unreachable";
    }
  }
  EXPECT_TRUE(edges[S::kDone].empty()) << "done is final";
}

// ctrun's command line is torchrun's: argv in, the options (and the one-line notes) out.
struct Parsed {
  int code = -1;
  LaunchOptions options;
  std::string notes;
};
Parsed parseCtrun(std::vector<std::string> args) {
  args.insert(args.begin(), "ctrun");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Parsed p;
  std::ostringstream notes;
  p.code = ctrun::parseCtrunCommandLine(int(argv.size()), argv.data(), p.options, notes);
  p.notes = notes.str();
  return p;
}

TEST(Launcher, ParsesEveryFormOfTorchrunsCommandLine) {
  // torchrun 1.13's and 2.x's flags, both spellings, the mapping forms, and the script after them.
  auto p = parseCtrun({"--nnodes=1:2",
                       "--nproc-per-node",
                       "2",
                       "--rdzv_backend",
                       "c10d",
                       "--rdzv-endpoint",
                       "h:1",
                       "--rdzv_id",
                       "job",
                       "--rdzv_conf",
                       "join_timeout=42,last_call_timeout=7,read_timeout=9",
                       "--standalone",
                       "--max_restarts",
                       "3",
                       "--monitor_interval",
                       "0.5",
                       "--start_method",
                       "fork",
                       "--role",
                       "trainer",
                       "--log_dir",
                       "/tmp/l",
                       "-r",
                       "0:1,1:2",
                       "--tee",
                       "0:3",
                       "--local_ranks_filter",
                       "0,1",
                       "--node_rank",
                       "1",
                       "--master_addr",
                       "m",
                       "--master_port",
                       "1234",
                       "--local_addr",
                       "10.0.0.2",
                       "--logs_specs",
                       "mine",
                       "--event_log_handler",
                       "x",
                       "--numa_binding",
                       "node",
                       "--signals_to_handle",
                       "SIGUSR1",
                       "train.py",
                       "--lr",
                       "1"});
  ASSERT_EQ(p.code, -1) << p.notes;
  const LaunchOptions& o = p.options;
  EXPECT_EQ(o.nnodes_range, "1:2");
  EXPECT_EQ(o.nproc_per_node, "2");
  EXPECT_EQ(o.rdzv_backend, "c10d");
  EXPECT_EQ(o.rdzv_endpoint, "h:1");
  EXPECT_EQ(o.run_id, "job");
  EXPECT_EQ(o.rdzv_timeout, 42);
  EXPECT_EQ(o.rdzv_last_call, 7);
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_EQ(o.monitor_interval, 0.5);
  EXPECT_EQ(o.role, "trainer");
  EXPECT_EQ(o.log_dir, "/tmp/l");
  EXPECT_EQ(o.redirects, "0:1,1:2");
  EXPECT_EQ(o.tee, "0:3");
  EXPECT_EQ(o.local_ranks_filter, "0,1");
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "m");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.local_addr, "10.0.0.2");
  EXPECT_EQ(o.command, (std::vector<std::string>{"train.py", "--lr", "1"}));
  // One line for each flag that means nothing for ctrun, and for the rendezvous key it has no use for.
  for (const char* flag : {"--start_method fork", "--logs_specs mine", "--event_log_handler x",
                           "--numa_binding node", "--rdzv_conf read_timeout"})
    EXPECT_NE(p.notes.find(std::string("ctrun: note: ") + flag + " means nothing for ctrun"),
              std::string::npos)
        << flag << "\n"
        << p.notes;
  EXPECT_EQ(std::count(p.notes.begin(), p.notes.end(), '\n'), 5) << p.notes;
  EXPECT_EQ(o.signals_to_handle, "SIGUSR1");

  auto flags = parseCtrun({"-m", "--no-python", "--run_path", "pkg.mod", "-x"});
  ASSERT_EQ(flags.code, -1);
  EXPECT_TRUE(flags.options.module && flags.options.no_python && flags.options.run_path);
  EXPECT_EQ(flags.options.command, (std::vector<std::string>{"pkg.mod", "-x"}));
  auto keep_alive = parseCtrun({"--rdzv_conf", "keep_alive_interval=2,keep_alive_max_attempt=4", "prog"});
  EXPECT_EQ(keep_alive.options.heartbeat_interval, 2);
  EXPECT_EQ(keep_alive.options.heartbeat_timeout, 8);
  // torchrun's argparse takes a long flag's unambiguous prefix (`torchrun --nproc 2` is common): so does
  // ctrun, up to the program's name; an ambiguous one is refused naming what it could be.
  auto brief = parseCtrun({"--nproc", "2", "-r", "3", "--max_rest=3", "--monitor", "0.5", "-t1", "--no-py",
                           "--stand", "prog", "--nproc", "4"});
  ASSERT_EQ(brief.code, -1) << brief.notes;
  EXPECT_EQ(brief.options.nproc_per_node, "2");
  EXPECT_EQ(brief.options.redirects, "3");
  EXPECT_EQ(brief.options.max_restarts, 3);
  EXPECT_EQ(brief.options.monitor_interval, 0.5);
  EXPECT_EQ(brief.options.tee, "1");
  EXPECT_TRUE(brief.options.no_python && brief.options.standalone);
  EXPECT_EQ(brief.options.command, (std::vector<std::string>{"prog", "--nproc", "4"})) << "the program's own";
  auto ambiguous = run(kCtrun + " --rdzv c10d prog");
  EXPECT_EQ(ambiguous.code, 1);
  EXPECT_NE(ambiguous.output.find("ambiguous option '--rdzv' could be --"), std::string::npos)
      << ambiguous.output;
  // -r/-t without --log_dir: no file to put the output in; said, not silently dropped.
  auto no_logs = parseCtrun({"-r", "3", "prog"});
  EXPECT_NE(no_logs.notes.find("-r/--redirects and -t/--tee without --log_dir mean nothing"),
            std::string::npos)
      << no_logs.notes;
  EXPECT_EQ(parseCtrun({"--log_dir", "/tmp/l", "-r", "3", "prog"}).notes, "");
  // torchrun's PET_* environment stands for a flag.
  setenv("PET_NPROC_PER_NODE", "3", 1);
  auto env = parseCtrun({"prog"});
  unsetenv("PET_NPROC_PER_NODE");
  EXPECT_EQ(env.options.nproc_per_node, "3");
  // What torchrun refuses, ctrun refuses.
  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"--start_method", "thread", "p"}, {"--rdzv_conf", "join_timeout", "p"}, {"--bogus", "p"}, {}})
    EXPECT_EQ(parseCtrun(bad).code, 1);
}

TEST(Launcher, RedirectsTeeAndRankFiltersTakeTorchrunsForms) {
  EXPECT_EQ(ctrun::StdStreams::parse("3", "-r").of(5), 3);
  const auto mapped = ctrun::StdStreams::parse("0:1,1:2", "-r");
  EXPECT_EQ(mapped.of(0), 1);
  EXPECT_EQ(mapped.of(1), 2);
  EXPECT_EQ(mapped.of(2), 0) << "a local rank not named: nothing redirected";
  for (const char* bad : {"4", "0:4", "a:1", "0:1,0:2", "1,", ""})
    EXPECT_THROW(ctrun::StdStreams::parse(bad, "-r"), ConfigError) << bad;
  EXPECT_EQ(ctrun::parseLocalRanksFilter("0,2"), (std::set<int>{0, 2}));
  EXPECT_THROW(ctrun::parseLocalRanksFilter("0,x"), ConfigError);

  // Rank 0's stdout and rank 1's stderr only in the logs; --local_ranks_filter 1 hides rank 0's console.
  const std::string dir = tempDir("streams");
  const std::string worker = " sh -c 'echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2'";
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 --run_id a --log_dir " + dir + " -r 0:1,1:2" +
               worker);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("out0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0]: err0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1]: out1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("err1"), std::string::npos) << r.output;
  const auto run_dirs = runDirectories(dir, "a");
  ASSERT_EQ(run_dirs.size(), 1u);
  EXPECT_EQ(slurp(run_dirs[0] + "/attempt_0/0/stdout.log"), "out0\n");
  EXPECT_EQ(slurp(run_dirs[0] + "/attempt_0/1/stderr.log"), "err1\n");
  auto filtered = run(kCtrun + " --nproc_per_node 2 --master_port 0 --local_ranks_filter 1" + worker);
  ASSERT_EQ(filtered.code, 0) << filtered.output;
  EXPECT_EQ(filtered.output.find("0"), std::string::npos) << filtered.output;
  EXPECT_NE(filtered.output.find("[rank 1]: out1"), std::string::npos) << filtered.output;
  auto refused = run(kCtrun + " --master_port 0 --tee 0:9 true");
  EXPECT_EQ(refused.code, 1);
  EXPECT_NE(refused.output.find("--tee must be 0..3"), std::string::npos) << refused.output;
}

TEST(Launcher, WorkersRunScriptsAndModulesUnderPythonAsTorchrunDoes) {
  const std::string dir = tempDir("command");
  std::ofstream(dir + "/plain_script") << "print('hi')\n";  // a file, not executable: Python's
  LaunchOptions o;
  unsetenv("PYTHON_EXEC");
  o.command = {"train.py", "--lr", "1"};
  EXPECT_EQ(ctrun::workerCommand(o), (std::vector<std::string>{"python3", "-u", "train.py", "--lr", "1"}));
  o.command = {dir + "/plain_script"};
  EXPECT_EQ(ctrun::workerCommand(o), (std::vector<std::string>{"python3", "-u", dir + "/plain_script"}));
  o.command = {kHelper, "env"};
  EXPECT_EQ(ctrun::workerCommand(o), o.command) << "a program runs as it is";
  o.module = true;
  o.command = {"pkg.mod", "x"};
  EXPECT_EQ(ctrun::workerCommand(o), (std::vector<std::string>{"python3", "-u", "-m", "pkg.mod", "x"}));
  o.module = false;
  o.no_python = true;
  o.command = {"train.py"};
  EXPECT_EQ(ctrun::workerCommand(o), o.command) << "--no_python";
  o.run_path = true;
  setenv("PYTHON_EXEC", "/opt/py", 1);
  EXPECT_EQ(ctrun::workerCommand(o), (std::vector<std::string>{"/opt/py", "-u", "train.py"}))
      << "--run_path goes before --no_python";
  unsetenv("PYTHON_EXEC");
  auto both = run(kCtrun + " --master_port 0 --no_python -m pkg.mod");
  EXPECT_EQ(both.code, 1);
  EXPECT_NE(both.output.find("--no_python and -m/--module together"), std::string::npos) << both.output;
  // --role is the workers' ROLE_NAME.
  o.role = "trainer";
  EXPECT_EQ(ctrun::workerEnvironment(o, 1, 0, 0, "/e.json")["ROLE_NAME"], "trainer");
}

// A Python DDP program (gloo, env://, 2 ranks, all_reduce) by file and by -m, with the python3 on PATH.
TEST(Launcher, RunsAPythonDdpScriptByFileAndByModule) {
  const char* env = std::getenv("TILER_PYTHON");
  const std::string python = env && *env ? env : "/usr/bin/python3";
  const auto can = run(python + " -c 'import torch.distributed'");
  if (can.code != 0)
    GTEST_SKIP() << python << " -c 'import torch' fails (Debian's python3-torch): " << can.output;
  const std::string bin = fs::path(python).parent_path().string();
  if (!fs::exists(bin + "/python3")) GTEST_SKIP() << "no python3 beside " << python;
  const std::string dir = tempDir("ddp");
  fs::create_directories(dir + "/ddp_pkg");
  std::ofstream(dir + "/ddp_pkg/__init__.py");
  std::ofstream(dir + "/ddp_pkg/sum.py")
      << "import torch, torch.distributed as dist\n"
         "dist.init_process_group('gloo', init_method='env://')\n"
         "t = torch.tensor([float(dist.get_rank() + 1)])\n"
         "dist.all_reduce(t)\n"
         "print(f'rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():g}', flush=True)\n"
         "dist.destroy_process_group()\n";
  const std::string ctrun = "cd " + dir + " && " + kNoLibuv + " PATH=" + bin + ":$PATH " + kCtrun +
                            " --nproc_per_node=2 --master_port 0 ";
  for (const std::string& target : {std::string("ddp_pkg/sum.py"), std::string("-m ddp_pkg.sum")}) {
    const auto r = run(ctrun + target);
    EXPECT_EQ(r.code, 0) << target << "\n" << r.output;
    EXPECT_NE(r.output.find("[rank 0]: rank 0 of 2 sum 3\n"), std::string::npos) << target << "\n"
                                                                                 << r.output;
    EXPECT_NE(r.output.find("[rank 1]: rank 1 of 2 sum 3\n"), std::string::npos) << target << "\n"
                                                                                 << r.output;
  }
}

// A worker that cannot be started (here: no file descriptor left for its pipes) is ctrun's launch error,
// named as such, and the workers already started do not outlive it.
TEST(Launcher, ALaunchErrorIsNamedAndLeavesNoWorkerBehind) {
  const std::string dir = tempDir("launch_error");
  auto r = run("sh -c 'ulimit -n 14 && exec " + kCtrun + " --nproc_per_node 6 --master_port 0 " + kHelper +
               " sleep " + dir + " 60'");
  EXPECT_EQ(r.code, 1) << r.output;
  // Which pipe runs out depends on what the runtime holds open (a sanitizer's files): a worker's, as a rule.
  EXPECT_TRUE(r.output.find("ctrun: error: cannot start worker ") != std::string::npos ||
              r.output.find("ctrun: error: cannot make the signal pipe") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("Too many open files"), std::string::npos) << r.output;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string pid = slurp(entry.path().string());
    if (pid.empty()) continue;  // killed before it wrote its pid
    const pid_t worker = pid_t(std::stol(pid));
    for (int i = 0; i < 50 && alive(worker); ++i) usleep(20000);
    EXPECT_FALSE(alive(worker)) << entry.path();
  }
}

}  // namespace
}  // namespace tiler

namespace tiler {
namespace {

int waitAgent(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The two-agent jobs' timings (seconds): heartbeats, the silence that loses a node, SIGTERM to SIGKILL.
constexpr double kBeat = 0.2, kLostAfter = 2, kGrace = 1;

std::string c10d(int port, const std::string& id) {
  std::ostringstream args;
  args << "--nnodes 2 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:" << port << " --rdzv_id " << id
       << " --rdzv_timeout 30 --heartbeat_interval " << kBeat << " --heartbeat_timeout " << kLostAfter
       << " --grace_period " << kGrace << " ";
  return args.str();
}

// Two agents started with `args` (their workers write their environments to `dir`) form one world: two nodes
// of two workers, node ranks 0 and 1, one MASTER_ADDR:MASTER_PORT.
void expectOneWorldOfTwoNodes(const std::string& args, const std::string& dir) {
  const pid_t a = startAgent(args + "--nproc_per_node 2 " + kHelper + " env " + dir, dir + "/a.log");
  const pid_t b = startAgent(args + "--nproc_per_node 2 " + kHelper + " env " + dir, dir + "/b.log");
  EXPECT_EQ(waitAgent(a), 0) << test::slurp(dir + "/a.log");
  EXPECT_EQ(waitAgent(b), 0) << test::slurp(dir + "/b.log");
  std::set<std::string> masters;
  for (int rank = 0; rank < 4; ++rank) {
    auto env = envFile(dir + "/env_" + std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(rank / 2));
    masters.insert(env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]);
  }
  EXPECT_EQ(masters.size(), 1u) << "one MASTER_ADDR:MASTER_PORT for the whole world";
}

TEST(Rendezvous, C10dAgentsFormOneWorldWithoutNodeRanks) {
  const std::string dir = tempDir("rdzv_world");
  expectOneWorldOfTwoNodes(c10d(test::freePort(), "world"), dir);
  EXPECT_EQ(envFile(dir + "/env_3")["TORCHELASTIC_RUN_ID"], "world");
}

// torch 2.x's --local_addr: the address node 0 hands out as MASTER_ADDR (the others reach it there), not
// the endpoint's.
TEST(Rendezvous, LocalAddrIsTheMasterAddressNodeZeroHandsOut) {
  const std::string dir = tempDir("rdzv_local_addr");
  const int port = test::freePort();
  const std::string args =
      c10d(port, "local") + "--local_addr 127.0.0.2 --nproc_per_node 1 " + kHelper + " env " + dir;
  const pid_t a = startAgent(args, dir + "/a.log");
  const pid_t b = startAgent(args, dir + "/b.log");
  EXPECT_EQ(waitAgent(a), 0) << test::slurp(dir + "/a.log");
  EXPECT_EQ(waitAgent(b), 0) << test::slurp(dir + "/b.log");
  EXPECT_EQ(envFile(dir + "/env_0")["MASTER_ADDR"], "127.0.0.2");
  EXPECT_EQ(envFile(dir + "/env_1")["MASTER_ADDR"], "127.0.0.2");
}

TEST(Rendezvous, AnEndpointPortHeldForAMomentIsHostedOnceFree) {
  // Another socket holds the endpoint's port (as the local end of a connection can), so neither agent can
  // listen on it at first; they keep trying and meet once it is free.
  const std::string dir = tempDir("rdzv_held");
  const int port = test::freePort();
  const int holder = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // not inherited by the agents
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string args = c10d(port, "held") + "--nproc_per_node 1 " + kHelper + " env " + dir;
  const pid_t a = startAgent(args, dir + "/a.log");
  const pid_t b = startAgent(args, dir + "/b.log");
  usleep(1500000);
  close(holder);
  EXPECT_EQ(waitAgent(a), 0) << test::slurp(dir + "/a.log");
  EXPECT_EQ(waitAgent(b), 0) << test::slurp(dir + "/b.log");
  EXPECT_EQ(envFile(dir + "/env_1")["WORLD_SIZE"], "2");
}

TEST(Rendezvous, AFailureOnOneNodeRestartsEveryNodeTogether) {
  // The case: static node ranks, one master port; rank 1 (node 1) fails on the first attempt.
  const std::string dir = tempDir("rdzv_restart");
  const int port = test::freePort(), rdzv = test::freePort();
  const std::string common =
      "--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port " + std::to_string(port) +
      " --max_restarts 1 --grace_period 1 --heartbeat_interval 0.2 --rdzv_timeout 60 " +
      "--rdzv_endpoint 127.0.0.1:" + std::to_string(rdzv) + " sh -c '" + kHelper + " env " + dir +
      " && exec " + kHelper + " fail-first-attempt'";
  const pid_t a = startAgent("--node_rank 0 " + common, dir + "/a.log");
  // Node 0 hosts the store (node 1, whose worker fails, must not: its agent may finish first). The wait
  // connects and never binds: a probe that listened on the port for a moment once took it from node 0,
  // which then joined the probe and lost it.
  { TcpStore store("127.0.0.1", rdzv, std::chrono::seconds(20)); }
  const pid_t b = startAgent("--node_rank 1 " + common, dir + "/b.log");
  EXPECT_EQ(waitAgent(a), 0) << test::slurp(dir + "/a.log");
  EXPECT_EQ(waitAgent(b), 0) << test::slurp(dir + "/b.log");
  // Node 0's worker did not fail, yet it ran again with the others: one restart count for the world.
  EXPECT_EQ(envFile(dir + "/env_0")["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(envFile(dir + "/env_1")["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_NE(test::slurp(dir + "/a.log").find("rank 1 failed (exit code 5); restarting worker group"),
            std::string::npos)
      << test::slurp(dir + "/a.log");
}

TEST(Rendezvous, TheEarliestFailureOnAnyNodeIsTheRootCauseEverywhere) {
  const std::string dir = tempDir("rdzv_root");
  const int port = test::freePort();
  const std::string args = c10d(port, "root") + "--nproc_per_node 1 " + kHelper + " exit-rank 1 3";
  const pid_t a = startAgent(args, dir + "/a.log");
  const pid_t b = startAgent(args, dir + "/b.log");
  const int ca = waitAgent(a), cb = waitAgent(b);
  for (const char* log : {"/a.log", "/b.log"}) {
    const std::string out = test::slurp(dir + log);
    EXPECT_NE(out.find("Root cause (first failure):\n  rank:        1 (local_rank 0, node 1)"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("exitcode:    3"), std::string::npos) << out;
  }
  EXPECT_EQ(ca, 3);
  EXPECT_EQ(cb, 3);
}

// The file rendezvous: the agents meet in a directory (as nodes would on a shared file system).
std::string fileRendezvous(const std::string& directory, const std::string& id, double timeout = 30) {
  std::ostringstream args;
  args << "--nnodes 2 --rdzv_backend file --rdzv_endpoint " << directory << " --rdzv_id " << id
       << " --rdzv_timeout " << timeout << " --heartbeat_interval " << kBeat << " --heartbeat_timeout "
       << kLostAfter << " --grace_period " << kGrace << " ";
  return args.str();
}

TEST(Rendezvous, FileAgentsFormOneWorldInASharedDirectoryAndLeaveItEmpty) {
  const std::string dir = tempDir("rdzv_file_world"), meeting = dir + "/meeting";
  expectOneWorldOfTwoNodes(fileRendezvous(meeting, "files"), dir);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(meeting)) left.push_back(entry.path().filename());
  EXPECT_TRUE(left.empty()) << "the last node to leave removes the run's files; left: " << left.front();
}

TEST(Rendezvous, FileAgentsShareTheirFailuresThroughTheDirectory) {
  const std::string dir = tempDir("rdzv_file_root");
  const std::string args =
      fileRendezvous(dir + "/meeting", "root") + "--nproc_per_node 1 " + kHelper + " exit-rank 1 3";
  const pid_t a = startAgent(args, dir + "/a.log");
  const pid_t b = startAgent(args, dir + "/b.log");
  EXPECT_EQ(waitAgent(a), 3) << test::slurp(dir + "/a.log");
  EXPECT_EQ(waitAgent(b), 3) << test::slurp(dir + "/b.log");
  for (const char* log : {"/a.log", "/b.log"})
    EXPECT_NE(test::slurp(dir + log).find("rank:        1 (local_rank 0, node 1)"), std::string::npos)
        << "the root cause on the other node, read from the directory: " << test::slurp(dir + log);
}

// Heartbeats through the directory: a node whose agent dies is declared lost by the other.
TEST(Rendezvous, AFileNodeWhoseAgentDiesIsDeclaredLost) {
  const std::string dir = tempDir("rdzv_file_lost");
  const std::string args =
      fileRendezvous(dir + "/meeting", "lost") + "--nproc_per_node 1 " + kHelper + " sleep " + dir + " 60";
  const pid_t a = startAgent(args, dir + "/a.log");
  const pid_t b = startAgent(args, dir + "/b.log");
  for (int i = 0; i < 400 && !(fs::exists(dir + "/pid_0") && fs::exists(dir + "/pid_1")); ++i) usleep(50000);
  ASSERT_TRUE(fs::exists(dir + "/pid_1"));
  // Node 1's agent is the parent of rank 1's worker.
  const std::string stat =
      test::slurp("/proc/" + std::to_string(std::stol(test::slurp(dir + "/pid_1"))) + "/stat");
  ASSERT_EQ(kill(pid_t(std::stol(stat.substr(stat.rfind(')') + 4))), SIGKILL), 0);
  const int ca = waitAgent(a), cb = waitAgent(b);
  const std::string out = test::slurp(dir + "/a.log") + test::slurp(dir + "/b.log");
  EXPECT_TRUE((ca == 1 && cb == 128 + SIGKILL) || (cb == 1 && ca == 128 + SIGKILL)) << ca << " " << cb << out;
  EXPECT_NE(out.find("node:        1 LOST (no heartbeat for 2 s)"), std::string::npos) << out;
}

TEST(Rendezvous, AFileNodeThatNeverComesTimesOutNamingTheDirectory) {
  const std::string dir = tempDir("rdzv_file_alone"), meeting = dir + "/meeting";
  const auto t0 = Clock::now();
  const auto r = run(kCtrun + " " + fileRendezvous(meeting, "alone", 1.5) + "--nproc_per_node 1 " + kHelper +
                     " env " + dir);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(meeting), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--rdzv_timeout"), std::string::npos) << r.output;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20)) << "bounded by --rdzv_timeout";
  EXPECT_FALSE(fs::exists(dir + "/env_0")) << "no worker starts without the others";
  EXPECT_TRUE(fs::is_empty(meeting)) << "the round given up is removed: the same run id can start afresh";
  for (const char* endpoint : {"", "--rdzv_endpoint relative/dir"}) {
    const auto refused = run(kCtrun + " --nnodes 2 --rdzv_backend file --rdzv_id x " + endpoint + " " +
                             kHelper + " env " + dir);
    EXPECT_EQ(refused.code, 1) << refused.output;
    EXPECT_NE(refused.output.find("--rdzv_endpoint"), std::string::npos) << refused.output;
  }
}

// torchrun's --monitor_interval (1.13's default is 5 s) may be longer than ctrun's --heartbeat_timeout:
// the agents still beat every --heartbeat_interval, so silent, healthy workers are no lost node.
TEST(Rendezvous, AMonitorIntervalLongerThanTheHeartbeatTimeoutLosesNoNode) {
  const std::string dir = tempDir("rdzv_monitor");
  // The workers outlast one monitor interval, so a loop that woke only then would beat too late.
  const double monitor = kLostAfter + 0.5;
  std::ostringstream args;
  args << c10d(test::freePort(), "monitor") << "--monitor_interval " << monitor << " --nproc_per_node 1 "
       << kHelper << " sleep " << dir << " " << monitor + 0.5;
  const pid_t a = startAgent(args.str(), dir + "/a.log");
  const pid_t b = startAgent(args.str(), dir + "/b.log");
  EXPECT_EQ(waitAgent(a), 0) << test::slurp(dir + "/a.log");
  EXPECT_EQ(waitAgent(b), 0) << test::slurp(dir + "/b.log");
}

TEST(Rendezvous, ALostNodeIsDeclaredWithinTheHeartbeatTimeout) {
  const std::string dir = tempDir("rdzv_lost");
  const int port = test::freePort();
  const std::string args = c10d(port, "lost") + "--nproc_per_node 1 " + kHelper + " sleep " + dir + " 60";
  const pid_t a = startAgent(args, dir + "/a.log");
  {
    // Node 1 must not be the store's host (losing that is another failure): b starts once a hosts the store
    // and has joined, which makes a node 0.
    TcpStore store("127.0.0.1", port, std::chrono::seconds(20));
    for (int i = 0; i < 400 && store.add("lost/0/joined", 0, std::chrono::seconds(20)) < 1; ++i)
      usleep(10000);
  }
  const pid_t b = startAgent(args, dir + "/b.log");
  // Both workers running (pid files), then node 1's agent is killed outright.
  for (int i = 0; i < 200 && !(fs::exists(dir + "/pid_0") && fs::exists(dir + "/pid_1")); ++i) usleep(50000);
  ASSERT_TRUE(fs::exists(dir + "/pid_1"));
  // Node 1's agent is the parent of rank 1's worker.
  const std::string stat = test::slurp(
      "/proc/" + test::slurp(dir + "/pid_1").substr(0, test::slurp(dir + "/pid_1").find('\n')) + "/stat");
  const pid_t agent1 = pid_t(std::stol(stat.substr(stat.rfind(')') + 4)));
  const pid_t worker0 = pid_t(std::stol(test::slurp(dir + "/pid_0")));
  const auto t0 = std::chrono::steady_clock::now();
  const auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  ASSERT_EQ(kill(agent1, SIGKILL), 0);
  // The survivor stops its worker (SIGTERM: it exits at once) when it declares node 1 lost; its 60 s sleep
  // and the 30 s --rdzv_timeout are the bounds without heartbeats.
  while (alive(worker0) && since() < 30) usleep(20000);
  const double declared = since();
  const int ca = waitAgent(a), cb = waitAgent(b);
  const double ended = since();
  const std::string out = test::slurp(dir + "/a.log") + test::slurp(dir + "/b.log");
  EXPECT_TRUE((ca == 1 && cb == 128 + SIGKILL) || (cb == 1 && ca == 128 + SIGKILL)) << ca << " " << cb << out;
  // Node 1's last beat was at most one interval before the kill: not lost before the timeout less that.
  EXPECT_GE(declared, kLostAfter - kBeat) << "a silence shorter than --heartbeat_timeout is no loss";
  // Declared one interval after the timeout at most (the survivor reads the beats every interval), the
  // worker gone within the grace period; the rest is margin for a loaded machine.
  const double margin = 3;
  EXPECT_LT(declared, kLostAfter + 2 * kBeat + kGrace + margin) << out;
  // The survivor hosts the store: it does not wait for the lost node to read the outcome (it never will).
  EXPECT_LT(ended - declared, margin) << out;
  EXPECT_NE(out.find("node:        1 LOST (no heartbeat for 2 s)"), std::string::npos) << out;
  // Rank 1's worker died with its agent (PDEATHSIG), rank 0's was stopped by the survivor.
  for (const char* f : {"/pid_0", "/pid_1"}) {
    const pid_t worker = pid_t(std::stol(test::slurp(dir + f)));
    for (int i = 0; i < 50 && alive(worker); ++i) usleep(20000);
    EXPECT_FALSE(alive(worker)) << f;
  }
}

}  // namespace
}  // namespace tiler

namespace tiler {
namespace {

// Two "hosts": network namespaces joined by a veth pair (needs root and iproute2; skipped otherwise).
class TwoHosts {
 public:
  TwoHosts() {
    const std::string id = std::to_string(getpid() % 100000);
    ns_ = {"tiler" + id + "a", "tiler" + id + "b"};
    subnet_ = "10.77." + std::to_string(getpid() % 250) + ".";
    const std::string veth = "tv" + id;
    ok_ = test::runCommand(
              "ip netns add " + ns_[0] + " && ip netns add " + ns_[1] + " && ip link add " + veth +
              "a type veth peer name " + veth + "b && ip link set " + veth + "a netns " + ns_[0] +
              " && ip link set " + veth + "b netns " + ns_[1] + " && ip -n " + ns_[0] + " addr add " +
              subnet_ + "1/24 dev " + veth + "a && ip -n " + ns_[1] + " addr add " + subnet_ + "2/24 dev " +
              veth + "b && ip -n " + ns_[0] + " link set " + veth + "a up && ip -n " + ns_[1] + " link set " +
              veth + "b up && ip -n " + ns_[0] + " link set lo up && ip -n " + ns_[1] + " link set lo up")
              .code == 0;
  }
  ~TwoHosts() { test::runCommand("ip netns del " + ns_[0] + "; ip netns del " + ns_[1]); }
  bool ok() const { return ok_; }
  std::string exec(int host) const { return "ip netns exec " + ns_[size_t(host)] + " "; }
  std::string address(int host) const { return subnet_ + std::to_string(host + 1); }

 private:
  std::vector<std::string> ns_;
  std::string subnet_;
  bool ok_ = false;
};

TEST(Rendezvous, StaticNodeZeroHostsTheStoreAndLosingItNamesThatNode) {
  // Node 1 starts first: it used to host the store (the first to bind did). Node 0 must host it, as
  // torchrun's static rendezvous does, and when node 0's agent dies the survivor names node 0 as the lost
  // store host.
  const std::string dir = tempDir("rdzv_static_host");
  const int port = test::freePort(), rdzv = test::freePort();
  const std::string common =
      "--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port " + std::to_string(port) +
      " --rdzv_endpoint 127.0.0.1:" + std::to_string(rdzv) +
      " --rdzv_timeout 30 --heartbeat_interval 0.2 --heartbeat_timeout 30 --grace_period 1 " + kHelper +
      " sleep " + dir + " 60";
  const pid_t b = startAgent("--node_rank 1 " + common, dir + "/b.log");
  usleep(700000);
  const pid_t a = startAgent("--node_rank 0 " + common, dir + "/a.log");
  for (int i = 0; i < 200 && !(fs::exists(dir + "/pid_0") && fs::exists(dir + "/pid_1")); ++i) usleep(50000);
  ASSERT_TRUE(fs::exists(dir + "/pid_0")) << test::slurp(dir + "/a.log");
  const std::string stat =
      test::slurp("/proc/" + std::to_string(std::stol(test::slurp(dir + "/pid_0"))) + "/stat");
  const pid_t agent0 = pid_t(std::stol(stat.substr(stat.rfind(')') + 4)));
  ASSERT_EQ(kill(agent0, SIGKILL), 0);
  const int cb = waitAgent(b);
  waitAgent(a);
  const std::string out = test::slurp(dir + "/b.log");
  EXPECT_EQ(cb, 1) << out;
  EXPECT_NE(
      out.find("node:        0 LOST (it hosted the rendezvous store at 127.0.0.1:" + std::to_string(rdzv)),
      std::string::npos)
      << out;
}

// An agent waiting at the rendezvous for nodes that never come (or for a store no one hosts yet) stops at
// once on SIGTERM or SIGINT with 128 + the signal, as it does while workers run.
TEST(Rendezvous, ASignalStopsAnAgentWaitingForTheOthers) {
  const std::string dir = tempDir("rdzv_signal");
  const int port = test::freePort(), rdzv = test::freePort();
  const std::string static_world =
      "--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port " + std::to_string(port) +
      " --rdzv_endpoint 127.0.0.1:" + std::to_string(rdzv) + " --rdzv_timeout 120 ";
  struct Case {
    std::string args;
    int signal;
  };
  const std::vector<Case> cases = {
      {static_world + "--node_rank 0", SIGTERM},  // hosts the store, waits for node 1
      {static_world + "--node_rank 1", SIGINT},   // waits for node 0 to host the store
      {c10d(port, "signal"), SIGTERM},            // hosts the store, waits for a second agent
  };
  int k = 0;
  for (const auto& c : cases) {
    const std::string log = dir + "/agent" + std::to_string(k++) + ".log";
    const pid_t agent = startAgent(c.args + " " + kHelper + " env " + dir, log, "exec ");
    usleep(1500000);
    ASSERT_TRUE(alive(agent)) << c.args << "\n" << test::slurp(log);
    const auto t0 = Clock::now();
    kill(agent, c.signal);
    const int code = waitAgent(agent);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_EQ(code, 128 + c.signal) << c.args << "\n" << test::slurp(log);
    EXPECT_LT(seconds, 5.0) << c.args;
    EXPECT_NE(test::slurp(log).find("while waiting at the rendezvous"), std::string::npos)
        << test::slurp(log);
  }
}

TEST(Rendezvous, AgentsInTwoNetworkNamespacesFormOneWorld) {
  TwoHosts hosts;
  if (!hosts.ok()) GTEST_SKIP() << "cannot make network namespaces here (needs root and iproute2)";
  const std::string dir = tempDir("rdzv_netns");
  const std::string args = "--nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint " +
                           hosts.address(0) + ":29400 --rdzv_id netns --rdzv_timeout 20 " + kHelper +
                           " env " + dir;
  // The agent on host b starts first, so it may well be node 0 without hosting the store.
  const pid_t b = startAgent(args, dir + "/b.log", hosts.exec(1));
  usleep(300000);
  const pid_t a = startAgent(args, dir + "/a.log", hosts.exec(0));
  EXPECT_EQ(waitAgent(a), 0) << test::slurp(dir + "/a.log");
  EXPECT_EQ(waitAgent(b), 0) << test::slurp(dir + "/b.log");
  const auto env0 = envFile(dir + "/env_0"), env1 = envFile(dir + "/env_1");
  EXPECT_EQ(env0.at("WORLD_SIZE"), "2");
  EXPECT_EQ(env0.at("MASTER_ADDR"), env1.at("MASTER_ADDR"));
  // Node 0 is whichever agent arrived first; its address is one the other host reaches.
  const std::string master = env0.at("MASTER_ADDR");
  EXPECT_TRUE(master == hosts.address(0) || master == hosts.address(1)) << master;
}

}  // namespace
}  // namespace tiler
