// rendezvous/backend: how this node's agent meets the others (torch elastic's RendezvousHandler), one object
// from the flags' settling through each round's join to leaving. A backend (static.cpp, c10d.cpp, file.cpp;
// registry.hpp names them) says how the nodes meet (which Store it opens: a TCP store an agent hosts, a
// shared directory), checks its flags, and settles node ranks, the world's size and MASTER. What every
// backend shares is here, written against the Store interface (net/store.hpp): one key prefix per round
// (<run_id>/<round>/), heartbeats, the failure board every node publishes to, the done count, and leaving.
// Every store call is bounded by --rdzv_timeout and throws DistError when the store is lost. No LibTorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tiler/ctrun/failures.hpp"
#include "tiler/ctrun/launch_options.hpp"
#include "tiler/net/store.hpp"
#include "tiler/net/tcp_store.hpp"

namespace tiler::ctrun {

// What one round settles for this node.
struct RendezvousRound {
  int node_rank = 0, nodes = 1;
  std::string master_addr;
  int master_port = 0;
};

// The bounds of a TCP store an agent hosts: the default ones, but an agent talks at least every heartbeat, so
// a silent connection is dropped well after that.
StoreLimits agentStoreLimits(const LaunchOptions& options);

class RendezvousBackend {
 public:
  RendezvousBackend() = default;
  virtual ~RendezvousBackend();
  RendezvousBackend(const RendezvousBackend&) = delete;
  RendezvousBackend& operator=(const RendezvousBackend&) = delete;

  // Checks the flags the backend needs and fills in its defaults, once the world's node range is known
  // (after --master_port 0 is resolved); ConfigError naming the flag. The rounds use the options settled
  // here.
  void settle(LaunchOptions& options, int min_nodes, int max_nodes);
  // Joins round `round` (the first call opens the store, retried until --rdzv_timeout): this node's rank,
  // the round's node count and the world's MASTER. Throws Interrupted (signals.hpp) on a termination
  // signal, TimeoutError when the others do not come.
  RendezvousRound join(int round, int min_nodes, int max_nodes);
  // Sends this node's heartbeat and reads the others' (at most every --heartbeat_interval). Returns the
  // failure of a node silent for --heartbeat_timeout (lost), if any.
  std::optional<WorkerFailure> heartbeat();
  void publish(const std::vector<WorkerFailure>& failures);
  int64_t failureCount();
  // Every published failure of this round, earliest first.
  std::vector<WorkerFailure> failures();
  void markDone();
  bool allDone();
  // The failure to report when the store cannot be reached: the node that hosted it is lost (a store no
  // node hosts: this node, which could not reach it).
  WorkerFailure storeLost(const std::string& why) const;
  // After the last round: tells the others this node left. A node hosting the store waits (a little) for
  // the others to have read the outcome; a node known lost (declared here or read from the failure board) is
  // not waited for, it will never read it. Never throws: a store lost by now changes nothing.
  void leave();

 protected:
  // The backend's own flag checks and defaults (settle).
  virtual void settleFlags(LaunchOptions& options, int min_nodes, int max_nodes) = 0;
  // How the nodes meet: the store this node opens (or hosts), retried until timeout(); throwIfInterrupted
  // between tries.
  virtual std::unique_ptr<Store> meet() = 0;
  // This node's rank and the round's node count; `arrival`: this node's place in the order of arrival (1
  // is the first).
  virtual void settleNodes(RendezvousRound& r, int64_t arrival, int round, int min_nodes, int max_nodes) = 0;
  // Node 0's MASTER_ADDR and MASTER_PORT for the world's workers.
  virtual std::pair<std::string, int> masterEndpoint() = 0;
  // What the backend does once every node it waited for has left (leave()); `last`: this node left last.
  virtual void afterLeaving(bool last);

  Store& store() { return *store_; }
  const LaunchOptions& options() const { return o_; }
  const std::string& prefix() const { return prefix_; }
  std::chrono::milliseconds timeout() const;
  // Node ranks in the order of arrival (c10d's): the first to join closes the round at max_nodes, or at
  // min_nodes once --rdzv_last_call has passed; a node that comes after it closed is refused.
  void settleInArrivalOrder(RendezvousRound& r, int64_t arrival, int round, int min_nodes, int max_nodes);
  // Polls the round's count of joined nodes until `enough(count)`; after --rdzv_timeout, a TimeoutError
  // saying how many of `wanted` nodes joined at the store. Returns the count.
  int64_t pollJoined(int round, const std::string& wanted, const std::function<bool(int64_t)>& enough);
  // Seconds since this round's join began.
  double elapsed() const;

 private:
  void learnStoreHost();

  LaunchOptions o_;
  std::unique_ptr<Store> store_;
  int store_node_ = 0;           // the node whose agent hosts the store (a hosted one)
  std::string store_host_name_;  // its host name
  int nodes_ = 1, me_ = 0;
  std::string prefix_;
  std::chrono::steady_clock::time_point round_start_{};
  int64_t beat_ = 0;
  std::chrono::steady_clock::time_point last_beat_{};
  std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> beats_;  // last value, since
  std::set<int> lost_;  // this round's nodes known lost
};

}  // namespace tiler::ctrun
