// The static rendezvous (torchrun's default): every node is told its --node_rank, the world has --nnodes
// nodes exactly, node 0 hosts the TCP store (as torchrun's agent does; default MASTER_ADDR:MASTER_PORT+1) and
// the workers' MASTER is --master_addr:--master_port.
#include <memory>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/rendezvous/backend.hpp"
#include "tiler/ctrun/signals.hpp"
#include "tiler/net/tcp_store.hpp"

namespace tiler::ctrun {
namespace {

class StaticRendezvous : public RendezvousBackend {
 protected:
  void settleFlags(LaunchOptions& o, int min_nodes, int max_nodes) override {
    if (max_nodes > 1) {
      TILER_CHECK(min_nodes == max_nodes, ConfigError,
                  "--nnodes MIN:MAX needs --rdzv_backend c10d (static worlds have a fixed size)");
      TILER_CHECK(o.node_rank >= 0, ConfigError,
                  "--nnodes " << max_nodes << " with the static rendezvous needs --node_rank (0.."
                              << max_nodes - 1
                              << ") on each node, or --rdzv_backend c10d, which assigns them");
      TILER_CHECK(o.node_rank < max_nodes, ConfigError,
                  "--node_rank " << o.node_rank << " outside --nnodes " << max_nodes
                                 << " (static rendezvous needs each node's rank; c10d assigns them)");
      TILER_CHECK(o.master_port > 0 && o.master_port < 65535, ConfigError,
                  "several nodes need one --master_port (1..65534), the same on every node");
      if (o.rdzv_endpoint.empty()) o.rdzv_endpoint = o.master_addr + ":" + std::to_string(o.master_port + 1);
    }
    if (o.node_rank == 0) {
      TILER_CHECK(portIsFree(o.master_port), ConfigError,
                  "--master_port " << o.master_port << " is already in use on this host (rank 0 hosts the "
                                   << "store there); pick another or use --master_port 0");
    }
  }
  std::unique_ptr<Store> meet() override {
    const auto [host, port] = parseEndpoint(options().rdzv_endpoint, "--rdzv_endpoint");
    return TcpStore::meet(host, port, options().node_rank == 0 ? StoreHosting::kMust : StoreHosting::kNever,
                          agentStoreLimits(options()), timeout(), throwIfInterrupted);
  }
  void settleNodes(RendezvousRound& r, int64_t, int round, int, int max_nodes) override {
    r.node_rank = options().node_rank;
    r.nodes = max_nodes;
    TILER_CHECK(store().add(prefix() + "rank/" + std::to_string(r.node_rank), 1, timeout()) == 1, ConfigError,
                "two nodes joined with --node_rank " << r.node_rank);
    pollJoined(round, std::to_string(max_nodes), [&](int64_t n) { return n >= max_nodes; });
  }
  std::pair<std::string, int> masterEndpoint() override {
    return {options().master_addr, options().master_port};
  }
};

}  // namespace

std::unique_ptr<RendezvousBackend> makeStaticRendezvous() {
  return std::make_unique<StaticRendezvous>();
}

}  // namespace tiler::ctrun
