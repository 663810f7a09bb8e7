// signals: how ctrun hears SIGINT, SIGTERM, SIGHUP, SIGQUIT (the four torchrun handles) and SIGCHLD. The
// handlers only write the signal's number to a self-pipe; the agent reads it in order, outside handler
// context, between polls. No LibTorch.
#pragma once

namespace tiler::ctrun {

// A termination signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that reached ctrun while it waited at the
// rendezvous.
struct Interrupted {
  int signal;
};

// Installs the handlers and the pipe (once per process); SIGPIPE is ignored. Throws LaunchError when the
// pipe cannot be made.
void installSignalPipe();
// The pipe's read end, to poll beside the workers' output.
int signalPipeFd();
// The last termination signal waiting on the pipe (SIGCHLD only wakes the poll), or 0; empties the pipe.
int takeSignal();
// Throws Interrupted when a termination signal waits on the pipe (no worker of this node runs then).
void throwIfInterrupted();

}  // namespace tiler::ctrun
