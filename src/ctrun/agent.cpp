#include "tiler/ctrun/agent.hpp"

#include <signal.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "tiler/ctrun/failures.hpp"
#include "tiler/ctrun/rendezvous/backend.hpp"
#include "tiler/ctrun/signals.hpp"
#include "tiler/ctrun/worker_group.hpp"

namespace tiler::ctrun {
namespace {

using S = GroupState;
using E = GroupEvent;
using A = GroupAction;

struct Row {
  GroupState state;
  GroupEvent event;
  GroupState next;
  GroupAction action;
};

// Every transition there is; any other (state, event) cannot happen.
constexpr Row kTable[] = {
    {S::kInit, E::kJoined, S::kHealthy, A::kStartWorkers},
    {S::kInit, E::kSignal, S::kDone, A::kReportInterrupted},
    {S::kHealthy, E::kWorkersSucceeded, S::kSucceeded, A::kMarkDone},
    {S::kHealthy, E::kWorkerFailed, S::kFailed, A::kPublishFailures},
    {S::kHealthy, E::kPeerFailed, S::kFailed, A::kNone},
    {S::kHealthy, E::kNodeLost, S::kFailed, A::kPublishLoss},
    {S::kHealthy, E::kStoreLost, S::kFailed, A::kNone},
    {S::kHealthy, E::kSignal, S::kDone, A::kStopOnSignal},
    {S::kSucceeded, E::kWorldSucceeded, S::kDone, A::kFinish},
    {S::kSucceeded, E::kPeerFailed, S::kFailed, A::kNone},
    {S::kSucceeded, E::kNodeLost, S::kFailed, A::kPublishLoss},
    {S::kSucceeded, E::kStoreLost, S::kFailed, A::kNone},
    {S::kSucceeded, E::kSignal, S::kDone, A::kStopOnSignal},
    {S::kFailed, E::kWorkersStopped, S::kStopped, A::kCollectFailures},
    {S::kStopped, E::kRestartAllowed, S::kInit, A::kRestart},
    {S::kStopped, E::kRestartsExhausted, S::kDone, A::kReportFailure},
    {S::kStopped, E::kSignal, S::kDone, A::kEndOnSignal},
};

class Agent {
 public:
  Agent(LaunchOptions& o, const LaunchPlan& plan, std::string run_dir)
      : o_(o), plan_(plan), run_dir_(std::move(run_dir)), command_(workerCommand(o)) {}
  int run();

 private:
  GroupEvent observe();
  GroupEvent join();
  GroupEvent supervise();
  GroupEvent weighRestart() const;
  void perform(GroupAction action);
  void stopOnSignal();
  void collectFailures();
  void reportFailure();
  // Runs `call` on the store unless it is lost; a DistError there marks it lost.
  void withStore(const std::function<void()>& call);
  void noteStoreLoss(const std::string& why);

  LaunchOptions& o_;
  const LaunchPlan plan_;
  const std::string run_dir_;
  const std::vector<std::string> command_;
  std::shared_ptr<RendezvousBackend> link_;  // several nodes: the other agents
  bool joined_ = false;                      // the link has a round to leave
  bool link_lost_ = false;                   // the store is gone: no restart can be agreed on
  LaunchOptions round_;                      // this attempt's options: node rank, world, MASTER
  std::unique_ptr<WorkerGroup> group_;
  GroupState state_ = GroupState::kInit;
  int attempt_ = 0;
  int signal_ = 0;
  std::optional<WorkerFailure> lost_node_;
  std::vector<WorkerFailure> link_failures_;  // this round's lost node or store, noticed here
  std::vector<WorkerFailure> last_failures_;  // the last failed round's, root cause first
  int exit_code_ = 0;
};

int Agent::run() {
  while (state_ != GroupState::kDone) {
    const GroupEvent event = observe();
    const GroupTransition t = groupTransition(state_, event);
    TILER_CHECK(t.action != GroupAction::kInvalid, Error,
                "ctrun's agent: event " << groupEventName(event) << " in state " << groupStateName(state_));
    state_ = t.next;
    perform(t.action);
  }
  if (!last_failures_.empty()) printSummary(last_failures_, o_, attempt_ + 1);
  if (link_ && joined_ && !link_lost_) link_->leave();
  return exit_code_;
}

GroupEvent Agent::observe() {
  switch (state_) {
    case GroupState::kInit:
      return join();
    case GroupState::kHealthy:
    case GroupState::kSucceeded:
      return supervise();
    case GroupState::kFailed:
      // A signal to ctrun meanwhile is kept: it outranks a restart.
      signal_ = group_->stop(SIGTERM);
      return GroupEvent::kWorkersStopped;
    case GroupState::kStopped:
      return weighRestart();
    case GroupState::kDone:
      break;
  }
  TILER_THROW(Error, "ctrun's agent: nothing to observe once done");
}

// Several nodes: this attempt's round at the rendezvous (the first one hosts or reaches the store).
GroupEvent Agent::join() {
  round_ = o_;
  if (!plan_.multi()) return GroupEvent::kJoined;
  try {
    if (!link_) link_ = plan_.rendezvous;
    const RendezvousRound r = link_->join(attempt_, plan_.min_nodes, plan_.max_nodes);
    joined_ = true;
    round_.node_rank = r.node_rank;
    round_.nnodes = r.nodes;
    round_.master_addr = r.master_addr;
    round_.master_port = r.master_port;
    return GroupEvent::kJoined;
  } catch (const Interrupted& i) {
    signal_ = i.signal;
    return GroupEvent::kSignal;
  }
}

// Watches this node's workers and, with several nodes, the others, until something happens.
GroupEvent Agent::supervise() {
  // Several nodes: this loop sends the heartbeats, so it wakes at least every --heartbeat_interval (with a
  // --monitor_interval longer than --heartbeat_timeout the others would declare this healthy node lost).
  const double wake = link_ ? std::min(o_.monitor_interval, o_.heartbeat_interval) : o_.monitor_interval;
  const int interval_ms = std::max(1, int(wake * 1000));
  for (;;) {
    if (state_ == GroupState::kSucceeded && !link_) return GroupEvent::kWorldSucceeded;
    if (link_lost_) return GroupEvent::kStoreLost;
    signal_ = group_->monitor(interval_ms);
    if (signal_ != 0) return GroupEvent::kSignal;
    if (state_ == GroupState::kHealthy) {
      if (group_->anyFailed()) return GroupEvent::kWorkerFailed;
      if (group_->allSucceeded()) return GroupEvent::kWorkersSucceeded;
    }
    if (!link_) continue;
    try {
      if (link_->failureCount() > 0) return GroupEvent::kPeerFailed;  // a node failed: every node stops
      if ((lost_node_ = link_->heartbeat())) return GroupEvent::kNodeLost;
      if (state_ == GroupState::kSucceeded && link_->allDone()) return GroupEvent::kWorldSucceeded;
    } catch (const DistError& e) {
      noteStoreLoss(e.message());
      return GroupEvent::kStoreLost;
    }
  }
}

GroupEvent Agent::weighRestart() const {
  if (signal_ != 0) return GroupEvent::kSignal;
  const bool can = !last_failures_.empty() && attempt_ < o_.max_restarts && !link_lost_;
  return can ? GroupEvent::kRestartAllowed : GroupEvent::kRestartsExhausted;
}

void Agent::perform(GroupAction action) {
  switch (action) {
    case GroupAction::kInvalid:
    case GroupAction::kNone:
      return;
    case GroupAction::kStartWorkers:
      link_failures_.clear();
      group_.reset();
      group_ = std::make_unique<WorkerGroup>(round_, command_, plan_.nproc,
                                             run_dir_ + "/attempt_" + std::to_string(attempt_), attempt_);
      group_->start();
      return;
    case GroupAction::kMarkDone:
      return withStore([&] { link_->markDone(); });
    case GroupAction::kFinish:
      group_->closeStreams();
      exit_code_ = 0;
      last_failures_.clear();
      return;
    case GroupAction::kPublishFailures:
      return withStore([&] { link_->publish(group_->failures()); });
    case GroupAction::kPublishLoss:
      return withStore([&] { link_->publish({*lost_node_}); });
    case GroupAction::kStopOnSignal:
      return stopOnSignal();
    case GroupAction::kReportInterrupted:
      // Waiting at the rendezvous: no worker of this node runs yet, nothing to stop, no round to leave.
      std::cerr << "ctrun: received " << signalName(signal_) << " while waiting at the rendezvous; stopping"
                << std::endl;
      exit_code_ = 128 + signal_;
      last_failures_.clear();
      joined_ = false;
      return;
    case GroupAction::kEndOnSignal:
      std::cerr << "ctrun: received " << signalName(signal_) << " while stopping the failed workers; not "
                << "restarting" << std::endl;
      withStore([&] { link_->publish({interruptedAgent(round_.node_rank, signal_)}); });
      exit_code_ = 128 + signal_;
      return;
    case GroupAction::kCollectFailures:
      return collectFailures();
    case GroupAction::kRestart: {
      const WorkerFailure& f = last_failures_.front();
      std::cerr << "ctrun: "
                << (f.lost
                        ? "node " + std::to_string(f.node) + " lost"
                        : "rank " + std::to_string(f.rank) + " failed (" +
                              (f.signal ? signalName(f.signal) : "exit code " + std::to_string(f.exit_code)) +
                              ")")
                << "; restarting worker group (" << attempt_ + 1 << " of " << o_.max_restarts << ")"
                << std::endl;
      ++attempt_;
      return;
    }
    case GroupAction::kReportFailure:
      return reportFailure();
  }
}

// ctrun was interrupted: the other nodes hear of it (when the store is still there) and this node's workers
// stop.
void Agent::stopOnSignal() {
  std::cerr << "ctrun: received " << signalName(signal_) << ", stopping workers" << std::endl;
  if (link_ && !link_lost_) {
    try {
      link_->publish({interruptedAgent(round_.node_rank, signal_)});
    } catch (const DistError&) {
    }
  }
  group_->stop(forwardedSignal(signal_));
  exit_code_ = 128 + signal_;
}

// The round's failures on every node, earliest first; this node's own when the store is gone.
void Agent::collectFailures() {
  last_failures_ = link_failures_;
  if (link_ && !link_lost_) {
    try {
      last_failures_ = link_->failures();
    } catch (const DistError&) {
      link_lost_ = true;
    }
  }
  if (last_failures_.empty()) last_failures_ = group_->failures();
}

void Agent::reportFailure() {
  if (last_failures_.empty()) {  // the store went away before any failure was recorded
    std::cerr << "ctrun: the worker group stopped and no failure was recorded (rendezvous store lost)\n";
    exit_code_ = 1;
    return;
  }
  exit_code_ = last_failures_.front().exit_code;
}

void Agent::withStore(const std::function<void()>& call) {
  if (!link_ || link_lost_) return;
  try {
    call();
  } catch (const DistError& e) {
    noteStoreLoss(e.message());
  }
}

void Agent::noteStoreLoss(const std::string& why) {
  link_failures_.push_back(link_->storeLost(why));
  link_lost_ = true;
}

}  // namespace

GroupTransition groupTransition(GroupState state, GroupEvent event) {
  for (const Row& row : kTable)
    if (row.state == state && row.event == event) return {row.next, row.action};
  return {state, GroupAction::kInvalid};
}

const char* groupStateName(GroupState state) {
  static const char* const kNames[] = {"init", "healthy", "succeeded", "failed", "stopped", "done"};
  return kNames[int(state)];
}

const char* groupEventName(GroupEvent event) {
  static const char* const kNames[] = {
      "joined",          "workers_succeeded", "world_succeeded",   "worker_failed",
      "peer_failed",     "node_lost",         "store_lost",        "signal",
      "workers_stopped", "restart_allowed",   "restarts_exhausted"};
  return kNames[int(event)];
}

const char* groupActionName(GroupAction action) {
  static const char* const kNames[] = {
      "invalid",          "none",         "start_workers",  "mark_done",          "finish",
      "publish_failures", "publish_loss", "stop_on_signal", "report_interrupted", "end_on_signal",
      "collect_failures", "restart",      "report_failure"};
  return kNames[int(action)];
}

int runAgent(LaunchOptions& options, const LaunchPlan& plan, const std::string& run_dir) {
  return Agent(options, plan, run_dir).run();
}

}  // namespace tiler::ctrun
