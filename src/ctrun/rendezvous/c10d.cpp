// The c10d rendezvous (torchrun's elastic one): node ranks in the order of arrival, --nnodes MIN:MAX closing
// at MAX nodes or at MIN once --rdzv_last_call has passed, the TCP store hosted by the first agent on the
// endpoint's host to bind it, and node 0 handing out a free MASTER_PORT on an address the others reach.
#include <memory>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/rendezvous/backend.hpp"
#include "tiler/ctrun/signals.hpp"
#include "tiler/net/tcp_store.hpp"

namespace tiler::ctrun {
namespace {

class C10dRendezvous : public RendezvousBackend {
 protected:
  void settleFlags(LaunchOptions& o, int, int max_nodes) override {
    if (max_nodes == 1) return;
    TILER_CHECK(!o.rdzv_endpoint.empty(), ConfigError,
                "--rdzv_backend c10d needs --rdzv_endpoint HOST:PORT (the same on every node)");
    TILER_CHECK(o.run_id != "none", ConfigError,
                "--rdzv_backend c10d needs --rdzv_id, the same on every node of the job");
  }
  std::unique_ptr<Store> meet() override {
    const auto [host, port] = parseEndpoint(options().rdzv_endpoint, "--rdzv_endpoint");
    auto store = TcpStore::meet(host, port, isLocalHost(host) ? StoreHosting::kMay : StoreHosting::kNever,
                                agentStoreLimits(options()), timeout(), throwIfInterrupted);
    tcp_ = store.get();
    endpoint_host_ = host;
    return store;
  }
  void settleNodes(RendezvousRound& r, int64_t arrival, int round, int min_nodes, int max_nodes) override {
    settleInArrivalOrder(r, arrival, round, min_nodes, max_nodes);
  }
  // Where the others reach this node: --local_addr, else the endpoint's name when the store is here, else
  // the address this node talks to the store from.
  std::pair<std::string, int> masterEndpoint() override {
    const std::string addr = !options().local_addr.empty() ? options().local_addr
                             : tcp_->hostedHere()          ? endpoint_host_
                                                           : tcp_->localAddress();
    return {addr, findFreePort()};
  }

 private:
  TcpStore* tcp_ = nullptr;  // the store meet() opened, which the base class owns
  std::string endpoint_host_;
};

}  // namespace

std::unique_ptr<RendezvousBackend> makeC10dRendezvous() {
  return std::make_unique<C10dRendezvous>();
}

}  // namespace tiler::ctrun
