// rendezvous/handler: how this node's agent meets the others (torch elastic's RendezvousHandler). The part
// every backend shares is here: the store (rendezvous.hpp) hosted by this agent or reached at
// --rdzv_endpoint, one key prefix per round (<run_id>/<round>/), heartbeats, the failure board every node
// publishes to, the done count, and leaving. A backend (static.cpp, c10d.cpp; registry.hpp names them)
// says only who hosts the store, how node ranks and the world's size are settled, and where MASTER is.
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

#include "tiler/core/rendezvous.hpp"
#include "tiler/ctrun/launcher.hpp"

namespace tiler::ctrun {

// What one round settles for this node.
struct RendezvousRound {
  int node_rank = 0, nodes = 1;
  std::string master_addr;
  int master_port = 0;
};

class RendezvousHandler {
 public:
  explicit RendezvousHandler(const LaunchOptions& options);
  virtual ~RendezvousHandler();
  RendezvousHandler(const RendezvousHandler&) = delete;
  RendezvousHandler& operator=(const RendezvousHandler&) = delete;

  // Joins round `round` (the first call hosts or reaches the store, retried until --rdzv_timeout): this
  // node's rank, the round's node count and the world's MASTER. Throws Interrupted (signals.hpp) on a
  // termination signal, TimeoutError when the others do not come.
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
  // The failure to report when the store cannot be reached: the node that hosted it is lost.
  WorkerFailure storeLost(const std::string& why) const;
  // Before leaving: the store's host waits (a little) for the others to have read the outcome; a node known
  // lost (declared here or read from the failure board) is not waited for, it will never read it.
  void leave();

 protected:
  // Static: node 0 must host the store. c10d: any agent on the endpoint's host may (the first to bind it).
  virtual bool mustHostStore() const = 0;
  virtual bool mayHostStore() const = 0;
  // This node's rank and the round's node count; `arrival`: this node's place in the order of arrival (1
  // is the first).
  virtual void settleNodes(RendezvousRound& r, int64_t arrival, int round, int min_nodes, int max_nodes) = 0;
  // Node 0's MASTER_ADDR and MASTER_PORT for the world's workers.
  virtual std::pair<std::string, int> masterEndpoint() = 0;

  StoreClient& store() { return *client_; }
  const LaunchOptions& options() const { return o_; }
  const std::string& prefix() const { return prefix_; }
  bool hostsStore() const { return server_ != nullptr; }
  const std::string& endpointHost() const { return endpoint_host_; }
  std::chrono::milliseconds timeout() const;
  // Polls the round's count of joined nodes until `enough(count)`; after --rdzv_timeout, a TimeoutError
  // saying how many of `wanted` nodes joined. Returns the count.
  int64_t pollJoined(int round, const std::string& wanted, const std::function<bool(int64_t)>& enough);
  // Seconds since this round's join began.
  double elapsed() const;

 private:
  void connect();
  bool tryHosting(const std::string& host, int port, bool last);
  void learnStoreHost();

  const LaunchOptions& o_;
  std::string endpoint_host_;
  std::unique_ptr<StoreServer> server_;  // when this agent hosts the store
  std::unique_ptr<StoreClient> client_;
  int store_node_ = 0;           // the node whose agent hosts the store
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
