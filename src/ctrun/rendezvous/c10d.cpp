// The c10d rendezvous (torchrun's elastic one): node ranks in the order of arrival, --nnodes MIN:MAX closing
// at MAX nodes or at MIN once --rdzv_last_call has passed, the store hosted by the first agent on the
// endpoint's host to bind it, and node 0 handing out a free MASTER_PORT on an address the others reach.
#include <algorithm>
#include <memory>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/rendezvous/handler.hpp"
#include "tiler/ctrun/signals.hpp"

namespace tiler::ctrun {
namespace {

class C10dRendezvous : public RendezvousHandler {
 public:
  using RendezvousHandler::RendezvousHandler;

 protected:
  bool mustHostStore() const override { return false; }
  bool mayHostStore() const override {
    return isLocalHost(parseEndpoint(options().rdzv_endpoint, "--rdzv_endpoint").first);
  }
  void settleNodes(RendezvousRound& r, int64_t arrival, int round, int min_nodes, int max_nodes) override {
    r.node_rank = int(arrival - 1);
    if (r.node_rank == 0) {
      // The first to join closes the round: at MAX nodes, or MIN and the last call over.
      double min_reached_at = -1;
      const int64_t n = pollJoined(round, "at least " + std::to_string(min_nodes), [&](int64_t n) {
        if (n >= min_nodes && min_reached_at < 0) min_reached_at = elapsed();
        return n >= max_nodes ||
               (min_reached_at >= 0 && elapsed() - min_reached_at >= options().rdzv_last_call);
      });
      r.nodes = int(std::min<int64_t>(n, max_nodes));
      store().set(prefix() + "size", std::to_string(r.nodes));
      return;
    }
    r.nodes = int(parseStoreInteger(store().wait(prefix() + "size", timeout(), throwIfInterrupted),
                                    prefix() + "size", options().rdzv_endpoint));
    TILER_CHECK(r.node_rank < r.nodes, DistError,
                "rendezvous " << round << " closed with " << r.nodes
                              << " nodes before this one joined; start it again for the next run");
  }
  // Where the others reach this node: --local_addr, else the endpoint's name when the store is here, else
  // the address this node talks to the store from.
  std::pair<std::string, int> masterEndpoint() override {
    const std::string addr = !options().local_addr.empty() ? options().local_addr
                             : hostsStore()                ? endpointHost()
                                                           : store().localAddress();
    return {addr, findFreePort()};
  }
};

}  // namespace

void settleC10dRendezvous(LaunchOptions& o, int, int max_nodes) {
  if (max_nodes == 1) return;
  TILER_CHECK(!o.rdzv_endpoint.empty(), ConfigError,
              "--rdzv_backend c10d needs --rdzv_endpoint HOST:PORT (the same on every node)");
  TILER_CHECK(o.run_id != "none", ConfigError,
              "--rdzv_backend c10d needs --rdzv_id, the same on every node of the job");
}

std::unique_ptr<RendezvousHandler> makeC10dRendezvous(const LaunchOptions& o) {
  return std::make_unique<C10dRendezvous>(o);
}

}  // namespace tiler::ctrun
