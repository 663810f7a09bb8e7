#include "tiler/ctrun/rendezvous/handler.hpp"

#include <algorithm>
#include <thread>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/failures.hpp"
#include "tiler/ctrun/signals.hpp"

namespace tiler::ctrun {

RendezvousHandler::RendezvousHandler(const LaunchOptions& options) : o_(options) {}

RendezvousHandler::~RendezvousHandler() = default;

std::chrono::milliseconds RendezvousHandler::timeout() const {
  return std::chrono::milliseconds(int64_t(o_.rdzv_timeout * 1000));
}

double RendezvousHandler::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - round_start_).count();
}

// Binds the store when this agent may host it; false when it could not (yet).
bool RendezvousHandler::tryHosting(const std::string& host, int port, bool last) {
  try {
    StoreLimits limits;
    // An agent talks at least every heartbeat; a silent connection is dropped well after that.
    limits.idle_timeout =
        std::max(limits.idle_timeout, std::chrono::milliseconds(int64_t(4000 * o_.heartbeat_interval)));
    server_ = std::make_unique<StoreServer>(host, port, limits);
    return true;
  } catch (const DistError&) {
    // c10d: another agent on this host holds it (several agents on one machine, as in tests).
    if (mustHostStore() && last) throw;
    return false;
  }
}

// Hosts the store when this agent is to (retried: the port can be held a while by the local end of another
// connection) and connects to it; both until --rdzv_timeout (the host may start later).
void RendezvousHandler::connect() {
  auto [host, port] = parseEndpoint(o_.rdzv_endpoint, "--rdzv_endpoint");
  endpoint_host_ = host;
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  const bool may_host = mustHostStore() || mayHostStore();
  for (;;) {
    throwIfInterrupted();
    const bool last = std::chrono::steady_clock::now() >= deadline;
    if (may_host && !server_ && !tryHosting(host, port, last) && mustHostStore()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    try {
      client_ = std::make_unique<StoreClient>(host, port, std::chrono::milliseconds(last ? 0 : 500));
      break;
    } catch (const TimeoutError&) {
      if (last)
        TILER_THROW(TimeoutError, "cannot reach the rendezvous store at "
                                      << o_.rdzv_endpoint << " within " << o_.rdzv_timeout
                                      << " s (--rdzv_timeout): no agent hosts it");
    }
  }
  client_->setTimeout(timeout());
}

RendezvousRound RendezvousHandler::join(int round, int min_nodes, int max_nodes) {
  if (!client_) connect();
  prefix_ = o_.run_id + "/" + std::to_string(round) + "/";
  round_start_ = std::chrono::steady_clock::now();
  RendezvousRound r;
  const int64_t arrival = client_->add(prefix_ + "joined", 1);
  settleNodes(r, arrival, round, min_nodes, max_nodes);
  if (r.node_rank == 0) {
    const auto [addr, port] = masterEndpoint();
    client_->set(prefix_ + "master", addr + ":" + std::to_string(port));
  }
  if (server_) client_->set(prefix_ + "store_host", std::to_string(r.node_rank) + " " + hostName());
  auto [addr, port] = parseEndpoint(client_->wait(prefix_ + "master", timeout(), throwIfInterrupted),
                                    "the master address at the rendezvous store " + o_.rdzv_endpoint);
  r.master_addr = addr;
  r.master_port = port;
  learnStoreHost();
  nodes_ = r.nodes;
  me_ = r.node_rank;
  beats_.assign(size_t(nodes_), {std::string(), std::chrono::steady_clock::now()});
  beat_ = 0;
  last_beat_ = {};
  lost_.clear();
  return r;
}

// Which node hosts the store, so that losing it names that node (every round has the host among its nodes).
void RendezvousHandler::learnStoreHost() {
  const std::string store_host = client_->wait(prefix_ + "store_host", timeout(), throwIfInterrupted);
  const size_t space = store_host.find(' ');
  store_node_ = int(parseStoreInteger(store_host.substr(0, space), prefix_ + "store_host", o_.rdzv_endpoint));
  store_host_name_ = space == std::string::npos ? std::string() : store_host.substr(space + 1);
}

int64_t RendezvousHandler::pollJoined(int round, const std::string& wanted,
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

std::optional<WorkerFailure> RendezvousHandler::heartbeat() {
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
      lost_.insert(n);
      return f;
    }
  }
  return std::nullopt;
}

void RendezvousHandler::publish(const std::vector<WorkerFailure>& failures) {
  for (const auto& f : failures) {
    const int64_t k = client_->add(prefix_ + "failures", 1);
    client_->set(prefix_ + "failure/" + std::to_string(k), failureToJson(f).dump());
  }
}

int64_t RendezvousHandler::failureCount() {
  return client_->add(prefix_ + "failures", 0);
}

std::vector<WorkerFailure> RendezvousHandler::failures() {
  std::vector<WorkerFailure> all;
  const int64_t n = failureCount();
  for (int64_t k = 1; k <= n; ++k) {
    const std::string key = prefix_ + "failure/" + std::to_string(k);
    if (auto text = client_->get(key)) {
      try {
        all.push_back(failureFromJson(nlohmann::json::parse(*text)));
      } catch (const nlohmann::json::exception& e) {
        TILER_THROW(DistError, "malformed rendezvous data at " << o_.rdzv_endpoint << ": '" << key
                                                               << "' is not a failure record: " << e.what());
      }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.time < b.time; });
  for (const auto& f : all)
    if (f.lost) lost_.insert(f.node);
  return all;
}

void RendezvousHandler::markDone() {
  client_->set(prefix_ + "done/" + std::to_string(me_), "1");
  client_->add(prefix_ + "done", 1);
}

bool RendezvousHandler::allDone() {
  return client_->add(prefix_ + "done", 0) >= nodes_;
}

WorkerFailure RendezvousHandler::storeLost(const std::string& why) const {
  WorkerFailure f;
  f.lost = true;
  f.node = store_node_;
  f.host = store_host_name_.empty() ? o_.rdzv_endpoint : store_host_name_;
  f.time = nowSeconds();
  f.exit_code = kExitFatal;
  f.error_message = "it hosted the rendezvous store at " + o_.rdzv_endpoint + ", which is lost: " + why;
  return f;
}

void RendezvousHandler::leave() {
  const auto everyLiveNodeLeft = [&] {
    for (int n = 0; n < nodes_; ++n)
      if (!lost_.count(n) && !client_->get(prefix_ + "left/" + std::to_string(n))) return false;
    return true;
  };
  try {
    client_->set(prefix_ + "left/" + std::to_string(me_), "1");
    for (int i = 0; server_ && i < 100 && !everyLiveNodeLeft(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } catch (const DistError&) {
  }
}

}  // namespace tiler::ctrun
