// agent: ctrun's elastic agent (torch elastic's agent/server/api.py): the rounds of one job on this node,
// driven by one explicit table of worker-group states x events -> next state and action. The agent observes
// (joins a round, monitors the workers and the other nodes, stops the workers, weighs a restart), looks the
// event up in the table and performs the action; an event a state cannot have is a logic error. No LibTorch.
#pragma once

#include <string>

#include "tiler/ctrun/launch_options.hpp"
#include "tiler/ctrun/options.hpp"

namespace tiler::ctrun {

enum class GroupState {
  kInit,       // no workers: joining a round (several nodes) or about to start
  kHealthy,    // workers running, none failed
  kSucceeded,  // this node's workers all exited 0; with several nodes, waiting for the others
  kFailed,     // a failure somewhere (a worker, another node, a lost node or store): workers to stop
  kStopped,    // workers stopped after a failure, its records collected: restart or not
  kDone,       // the exit code is known
};
constexpr int kGroupStateCount = 6;

enum class GroupEvent {
  kJoined,             // the round is settled (node rank, world, MASTER)
  kWorkersSucceeded,   // every worker of this node exited 0
  kWorldSucceeded,     // every node's workers succeeded (one node: this one's)
  kWorkerFailed,       // a worker of this node failed
  kPeerFailed,         // another node published a failure
  kNodeLost,           // a node was silent for --heartbeat_timeout
  kStoreLost,          // the rendezvous store cannot be reached
  kSignal,             // SIGINT, SIGTERM, SIGHUP or SIGQUIT reached ctrun (in stopped: while they stopped)
  kWorkersStopped,     // the workers were stopped (SIGTERM, grace, SIGKILL)
  kRestartAllowed,     // restarts remain and the store is there
  kRestartsExhausted,  // no restart remains, or none can be agreed on
};
constexpr int kGroupEventCount = 11;

enum class GroupAction {
  kInvalid,            // the event cannot happen in the state
  kNone,               // nothing beyond the new state
  kStartWorkers,       // this attempt's workers
  kMarkDone,           // tell the other nodes this node succeeded
  kFinish,             // success: close the output, exit 0
  kPublishFailures,    // this node's failed workers onto the failure board
  kPublishLoss,        // the lost node onto the failure board
  kStopOnSignal,       // tell the others, stop the workers, exit 128 + signal
  kReportInterrupted,  // no workers run: exit 128 + signal
  kEndOnSignal,        // the failed workers are stopped and ctrun was asked to stop: no restart, 128 + signal
  kCollectFailures,    // every node's failures, earliest first: the root cause
  kRestart,            // announce it; the next round
  kReportFailure,      // exit with the root cause's code
};

struct GroupTransition {
  GroupState next;
  GroupAction action;
};

// The table's cell: what `event` in `state` leads to; {state, kInvalid} where it cannot happen.
GroupTransition groupTransition(GroupState state, GroupEvent event);
const char* groupStateName(GroupState state);
const char* groupEventName(GroupEvent event);
const char* groupActionName(GroupAction action);

// Runs the job's rounds on this node with settled options (options.hpp); error files and logs go under
// `run_dir`. Returns ctrun's exit code. Signals arrive through signals.hpp's pipe (installed by the caller).
int runAgent(LaunchOptions& options, const LaunchPlan& plan, const std::string& run_dir);

}  // namespace tiler::ctrun
