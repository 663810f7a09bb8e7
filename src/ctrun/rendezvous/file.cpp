// The file rendezvous: the nodes meet in a directory they all see (--rdzv_endpoint /shared/dir, a network
// file system), through the FileStore, so no agent hosts anything and no port has to be reachable. Node
// ranks are settled as c10d's are (order of arrival, --nnodes MIN:MAX); node 0 hands out MASTER at
// --local_addr, else the address others reach it at (addressOthersReach), and a free port. The last node to
// leave removes the run's keys.
#include <memory>

#include "tiler/core/error.hpp"
#include "tiler/ctrun/rendezvous/backend.hpp"
#include "tiler/net/file_store.hpp"
#include "tiler/net/tcp_store.hpp"

namespace tiler::ctrun {
namespace {

class FileRendezvous : public RendezvousBackend {
 protected:
  void settleFlags(LaunchOptions& o, int, int max_nodes) override {
    if (max_nodes == 1) return;
    TILER_CHECK(!o.rdzv_endpoint.empty() && o.rdzv_endpoint.front() == '/', ConfigError,
                "--rdzv_backend file needs --rdzv_endpoint DIR, an absolute path to a directory every node "
                "sees (the same on every node); got '"
                    << o.rdzv_endpoint << "'");
    TILER_CHECK(o.run_id != "none", ConfigError,
                "--rdzv_backend file needs --rdzv_id, the same on every node of the job");
  }
  std::unique_ptr<Store> meet() override {
    auto store = std::make_unique<FileStore>(options().rdzv_endpoint);
    files_ = store.get();
    return store;
  }
  // The first node of a round that gives up waiting (the others did not come, a signal) removes the run's
  // files: an attempt started again with the same run id then begins afresh instead of joining a dead round.
  void settleNodes(RendezvousRound& r, int64_t arrival, int round, int min_nodes, int max_nodes) override {
    try {
      settleInArrivalOrder(r, arrival, round, min_nodes, max_nodes);
    } catch (...) {
      try {
        if (arrival == 1) files_->removeKeys(options().run_id + "/");
      } catch (const DistError&) {
        // What stopped the round is the error to report.
      }
      throw;
    }
  }
  std::pair<std::string, int> masterEndpoint() override {
    return {options().local_addr.empty() ? addressOthersReach() : options().local_addr, findFreePort()};
  }
  void afterLeaving(bool last) override {
    if (last) files_->removeKeys(options().run_id + "/");
  }

 private:
  FileStore* files_ = nullptr;  // the store meet() opened, which the base class owns
};

}  // namespace

std::unique_ptr<RendezvousBackend> makeFileRendezvous() {
  return std::make_unique<FileRendezvous>();
}

}  // namespace tiler::ctrun
