#include "tiler/ctrun/rendezvous/backend.hpp"

#include <algorithm>
#include <thread>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/signals.hpp"

namespace tiler::ctrun {

StoreLimits agentStoreLimits(const LaunchOptions& options) {
  StoreLimits limits;
  limits.idle_timeout =
      std::max(limits.idle_timeout, std::chrono::milliseconds(int64_t(4000 * options.heartbeat_interval)));
  return limits;
}

RendezvousBackend::~RendezvousBackend() = default;

void RendezvousBackend::settle(LaunchOptions& options, int min_nodes, int max_nodes) {
  settleFlags(options, min_nodes, max_nodes);
  o_ = options;
}

std::chrono::milliseconds RendezvousBackend::timeout() const {
  return std::chrono::milliseconds(int64_t(o_.rdzv_timeout * 1000));
}

double RendezvousBackend::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - round_start_).count();
}

RendezvousRound RendezvousBackend::join(int round, int min_nodes, int max_nodes) {
  if (!store_) {
    try {
      store_ = meet();
    } catch (const TimeoutError& e) {
      TILER_THROW(TimeoutError, e.message() << " (--rdzv_timeout)");
    }
  }
  prefix_ = o_.run_id + "/" + std::to_string(round) + "/";
  round_start_ = std::chrono::steady_clock::now();
  RendezvousRound r;
  const int64_t arrival = store_->add(prefix_ + "joined", 1, timeout());
  settleNodes(r, arrival, round, min_nodes, max_nodes);
  if (r.node_rank == 0) {
    const auto [addr, port] = masterEndpoint();
    store_->set(prefix_ + "master", addr + ":" + std::to_string(port), timeout());
  }
  if (store_->hostedHere())
    store_->set(prefix_ + "store_host", std::to_string(r.node_rank) + " " + hostName(), timeout());
  auto [addr, port] = parseEndpoint(store_->wait(prefix_ + "master", timeout(), throwIfInterrupted),
                                    "the master address at the rendezvous store " + store_->endpoint());
  r.master_addr = addr;
  r.master_port = port;
  if (store_->hosted()) learnStoreHost();
  nodes_ = r.nodes;
  me_ = r.node_rank;
  beats_.assign(size_t(nodes_), {std::string(), std::chrono::steady_clock::now()});
  beat_ = 0;
  last_beat_ = {};
  lost_.clear();
  return r;
}

// Which node hosts the store, so that losing it names that node (every round has the host among its nodes).
void RendezvousBackend::learnStoreHost() {
  const std::string store_host = store_->wait(prefix_ + "store_host", timeout(), throwIfInterrupted);
  const size_t space = store_host.find(' ');
  store_node_ =
      int(parseStoreInteger(store_host.substr(0, space), prefix_ + "store_host", store_->endpoint()));
  store_host_name_ = space == std::string::npos ? std::string() : store_host.substr(space + 1);
}

int64_t RendezvousBackend::pollJoined(int round, const std::string& wanted,
                                      const std::function<bool(int64_t)>& enough) {
  for (;;) {
    throwIfInterrupted();
    const int64_t n = store_->add(prefix_ + "joined", 0, timeout());
    if (enough(n)) return n;
    TILER_CHECK(elapsed() < o_.rdzv_timeout, TimeoutError,
                "rendezvous " << round << ": " << n << " of " << wanted << " nodes joined at "
                              << store_->endpoint() << " within " << o_.rdzv_timeout
                              << " s (--rdzv_timeout)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void RendezvousBackend::settleInArrivalOrder(RendezvousRound& r, int64_t arrival, int round, int min_nodes,
                                             int max_nodes) {
  r.node_rank = int(arrival - 1);
  if (r.node_rank == 0) {
    // The first to join closes the round: at MAX nodes, or MIN and the last call over.
    double min_reached_at = -1;
    const int64_t n = pollJoined(round, "at least " + std::to_string(min_nodes), [&](int64_t n) {
      if (n >= min_nodes && min_reached_at < 0) min_reached_at = elapsed();
      return n >= max_nodes || (min_reached_at >= 0 && elapsed() - min_reached_at >= o_.rdzv_last_call);
    });
    r.nodes = int(std::min<int64_t>(n, max_nodes));
    store_->set(prefix_ + "size", std::to_string(r.nodes), timeout());
    return;
  }
  r.nodes = int(parseStoreInteger(store_->wait(prefix_ + "size", timeout(), throwIfInterrupted),
                                  prefix_ + "size", store_->endpoint()));
  TILER_CHECK(r.node_rank < r.nodes, DistError,
              "rendezvous " << round << " at " << store_->endpoint() << " closed with " << r.nodes
                            << " nodes before this one joined; start it again for the next run");
}

std::optional<WorkerFailure> RendezvousBackend::heartbeat() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_beat_ < std::chrono::milliseconds(int64_t(o_.heartbeat_interval * 1000)))
    return std::nullopt;
  last_beat_ = now;
  store_->set(prefix_ + "hb/" + std::to_string(me_), std::to_string(++beat_), timeout());
  for (int n = 0; n < nodes_; ++n) {
    if (n == me_ || store_->get(prefix_ + "done/" + std::to_string(n), timeout())) continue;
    const std::string value = store_->get(prefix_ + "hb/" + std::to_string(n), timeout()).value_or("");
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

void RendezvousBackend::publish(const std::vector<WorkerFailure>& failures) {
  for (const auto& f : failures) {
    const int64_t k = store_->add(prefix_ + "failures", 1, timeout());
    store_->set(prefix_ + "failure/" + std::to_string(k), failureToJson(f).dump(), timeout());
  }
}

int64_t RendezvousBackend::failureCount() {
  return store_->add(prefix_ + "failures", 0, timeout());
}

std::vector<WorkerFailure> RendezvousBackend::failures() {
  std::vector<WorkerFailure> all;
  const int64_t n = failureCount();
  for (int64_t k = 1; k <= n; ++k) {
    const std::string key = prefix_ + "failure/" + std::to_string(k);
    if (auto text = store_->get(key, timeout())) {
      try {
        all.push_back(failureFromJson(nlohmann::json::parse(*text)));
      } catch (const nlohmann::json::exception& e) {
        TILER_THROW(DistError, "malformed rendezvous data at " << store_->endpoint() << ": '" << key
                                                               << "' is not a failure record: " << e.what());
      }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.time < b.time; });
  for (const auto& f : all)
    if (f.lost) lost_.insert(f.node);
  return all;
}

void RendezvousBackend::markDone() {
  store_->set(prefix_ + "done/" + std::to_string(me_), "1", timeout());
  store_->add(prefix_ + "done", 1, timeout());
}

bool RendezvousBackend::allDone() {
  return store_->add(prefix_ + "done", 0, timeout()) >= nodes_;
}

WorkerFailure RendezvousBackend::storeLost(const std::string& why) const {
  WorkerFailure f;
  f.lost = true;
  f.time = nowSeconds();
  f.exit_code = kExitFatal;
  const std::string where = store_ ? store_->endpoint() : o_.rdzv_endpoint;
  if (store_ && !store_->hosted()) {
    f.node = me_;
    f.host = hostName();
    f.error_message = "it cannot use the rendezvous store at " + where + ": " + why;
    return f;
  }
  f.node = store_node_;
  f.host = store_host_name_.empty() ? where : store_host_name_;
  f.error_message = "it hosted the rendezvous store at " + where + ", which is lost: " + why;
  return f;
}

void RendezvousBackend::leave() {
  if (!store_ || prefix_.empty()) return;
  const auto everyLiveNodeLeft = [&] {
    for (int n = 0; n < nodes_; ++n)
      if (!lost_.count(n) && !store_->get(prefix_ + "left/" + std::to_string(n), timeout())) return false;
    return true;
  };
  try {
    store_->set(prefix_ + "left/" + std::to_string(me_), "1", timeout());
    const int64_t left = store_->add(prefix_ + "leavers", 1, timeout());
    for (int i = 0; store_->hostedHere() && i < 100 && !everyLiveNodeLeft(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    afterLeaving(left == nodes_);
  } catch (const DistError&) {
  }
}

void RendezvousBackend::afterLeaving(bool) {}

}  // namespace tiler::ctrun
