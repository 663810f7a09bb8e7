// A worker program for the launcher tests: does one thing per mode, driven by argv and torchrun's env.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace {
int envInt(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}
void sleepSeconds(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}
// Written whole under a temporary name and renamed: a test that sees pid_<rank> reads the whole pid (a test
// that read the file between its creation and its write parsed an empty pid).
void writePid(const std::string& dir) {
  const std::string path = dir + "/pid_" + std::to_string(envInt("RANK"));
  std::ofstream(path + ".tmp") << getpid() << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int rank = envInt("RANK");
  if (mode == "env") {  // env OUTDIR
    std::ofstream out(std::string(argv[2]) + "/env_" + std::to_string(rank));
    for (const char* name :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
          "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS"}) {
      const char* v = std::getenv(name);
      out << name << "=" << (v ? v : "<unset>") << "\n";
    }
    return 0;
  }
  if (mode == "environ") {  // environ OUTDIR: the whole environment, NAME=VALUE a line
    std::ofstream out(std::string(argv[2]) + "/environ_" + std::to_string(rank));
    for (char** e = environ; *e != nullptr; ++e) out << *e << "\n";
    return 0;
  }
  if (mode == "exit-rank") {  // exit-rank R CODE: rank R exits CODE at once, the others sleep a minute
    if (rank == std::atoi(argv[2])) {
      sleepSeconds(0.3);
      return std::atoi(argv[3]);
    }
    sleepSeconds(60);
    return 0;
  }
  if (mode == "segv-rank") {
    if (rank == std::atoi(argv[2])) {
      sleepSeconds(0.3);
      raise(SIGSEGV);
    }
    sleepSeconds(60);
    return 0;
  }
  if (mode == "error-file") {  // writes a torchelastic error file, then fails
    std::ofstream(std::getenv("TORCHELASTIC_ERROR_FILE"))
        << R"({"message": "disk on fire", "rank": )" << rank << "}";
    return 7;
  }
  if (mode == "fail-first-attempt") {
    if (envInt("TORCHELASTIC_RESTART_COUNT") == 0 && rank == 1) return 5;
    return 0;
  }
  if (mode == "sleep") {  // sleep OUTDIR SECONDS [ignore-term]
    if (argc > 4) signal(SIGTERM, SIG_IGN);
    writePid(argv[2]);
    sleepSeconds(std::atof(argv[3]));
    return 0;
  }
  if (mode == "lines") {  // lines N: long lines written in pieces, to catch mid-line interleaving
    const int n = std::atoi(argv[2]);
    std::string tail(200, 'x');
    for (int i = 0; i < n; ++i) {
      std::string head = "rank " + std::to_string(rank) + " line " + std::to_string(i) + " ";
      fputs(head.c_str(), stdout);
      fflush(stdout);
      fputs((tail + "\n").c_str(), stdout);
      if (i % 100 == 0) fflush(stdout);
    }
    fputs("no newline at the end", stdout);
    return 0;
  }
  std::fprintf(stderr, "ctrun_helper: unknown mode '%s'\n", mode.c_str());
  return 2;
}
