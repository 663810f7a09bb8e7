// signals: how ctrun hears SIGINT, SIGTERM, SIGHUP, SIGQUIT (the four torchrun handles) and SIGCHLD. The
// handlers only write the signal's number to a self-pipe; the agent reads it in order, outside handler
// context, between polls. No LibTorch.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

namespace tiler::ctrun {

// A termination signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that reached ctrun while it waited at the
// rendezvous.
struct Interrupted {
  int signal;
};

// "SIGTERM,SIGUSR1" (torchrun's --signals_to_handle form) as signal numbers; ConfigError naming `flag` for a
// name that is no signal or one ctrun cannot take (SIGKILL, SIGSTOP, SIGCHLD, SIGPIPE).
std::vector<int> parseSignalList(const std::string& names, const std::string& flag);
// The signal the workers get when `sig` stops them: SIGINT for SIGINT, SIGTERM for SIGTERM, SIGHUP and
// SIGQUIT (as before torchrun 2.x's list), any other handled signal itself (Slurm's SIGUSR1: checkpoint).
int forwardedSignal(int sig);
// Installs the handlers (SIGINT, SIGTERM, SIGHUP, SIGQUIT, `more`) and the pipe (once per process); SIGPIPE
// is ignored. Throws LaunchError when the
// pipe cannot be made.
void installSignalPipe(const std::vector<int>& more = {});
// The pipe's read end, to poll beside the workers' output.
int signalPipeFd();
// The last termination signal waiting on the pipe (SIGCHLD only wakes the poll), or 0; empties the pipe.
int takeSignal();
// Throws Interrupted when a termination signal waits on the pipe (no worker of this node runs then).
void throwIfInterrupted();

// Every signal blocked while it lives (restored after): a fork under it gives a child that cannot run
// ctrun's handlers, which would write a signal meant for the worker into ctrun's own pipe.
class SignalsBlocked {
 public:
  SignalsBlocked();
  ~SignalsBlocked();
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t saved_;
};
// In a child forked under SignalsBlocked: default dispositions, the pipe closed, then every signal unblocked
// (one sent to it meanwhile is delivered now, as to the program it is about to become). Async-signal-safe.
void resetSignalsInChild();

}  // namespace tiler::ctrun
