#include "tiler/ctrun/signals.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/failures.hpp"

namespace tiler::ctrun {
namespace {

int g_signal_pipe[2] = {-1, -1};

void onSignal(int signo) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(signo);
  if (write(g_signal_pipe[1], &b, 1) < 0) {
  }
  errno = saved;
}

}  // namespace

std::vector<int> parseSignalList(const std::string& names, const std::string& flag) {
  std::vector<int> signals;
  std::stringstream in(names);
  for (std::string name; std::getline(in, name, ',');) {
    int sig = 0;
    for (int s = 1; s < NSIG && sig == 0; ++s)
      if (const char* abbrev = sigabbrev_np(s); abbrev && name == std::string("SIG") + abbrev) sig = s;
    TILER_CHECK(sig != 0 && sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD && sig != SIGPIPE, ConfigError,
                flag << " must list signals by name, e.g. SIGTERM,SIGUSR1 (not SIGKILL, SIGSTOP, SIGCHLD or "
                     << "SIGPIPE); got '" << name << "' in '" << names << "'");
    signals.push_back(sig);
  }
  return signals;
}

int forwardedSignal(int sig) {
  if (sig == SIGINT) return SIGINT;
  return sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT ? SIGTERM : sig;
}

void installSignalPipe(const std::vector<int>& more) {
  if (g_signal_pipe[0] >= 0) return;
  TILER_CHECK(pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, LaunchError,
              "cannot make the signal pipe: " << std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaction(s, &sa, nullptr);
  for (int s : more) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int signalPipeFd() {
  return g_signal_pipe[0];
}

int takeSignal() {
  int got = 0;
  unsigned char b;
  while (read(g_signal_pipe[0], &b, 1) == 1) {
    if (b != SIGCHLD) got = b;
  }
  return got;
}

void throwIfInterrupted() {
  unsigned char b;
  while (read(g_signal_pipe[0], &b, 1) == 1)
    if (b != SIGCHLD) throw Interrupted{b};
}

SignalsBlocked::SignalsBlocked() {
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &saved_);
}

SignalsBlocked::~SignalsBlocked() {
  sigprocmask(SIG_SETMASK, &saved_, nullptr);
}

void resetSignalsInChild() {
  // Only what ctrun changed: a signal ignored by whoever started ctrun (nohup's SIGHUP) stays ignored.
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction current {};
    if (sigaction(s, nullptr, &current) == 0 && current.sa_handler == onSignal) signal(s, SIG_DFL);
  }
  signal(SIGPIPE, SIG_DFL);
  for (int& fd : g_signal_pipe) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace tiler::ctrun
