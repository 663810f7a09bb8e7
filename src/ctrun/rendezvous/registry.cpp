#include "tiler/ctrun/rendezvous/registry.hpp"

#include "tiler/core/error.hpp"

namespace tiler::ctrun {

// Each backend's file defines these two.
void settleStaticRendezvous(LaunchOptions& o, int min_nodes, int max_nodes);
std::unique_ptr<RendezvousHandler> makeStaticRendezvous(const LaunchOptions& o);
void settleC10dRendezvous(LaunchOptions& o, int min_nodes, int max_nodes);
std::unique_ptr<RendezvousHandler> makeC10dRendezvous(const LaunchOptions& o);

namespace {

const RendezvousBackend kBackends[] = {
    {"static", settleStaticRendezvous, makeStaticRendezvous},
    {"c10d", settleC10dRendezvous, makeC10dRendezvous},
};

}  // namespace

std::string rendezvousBackendNames() {
  std::string names;
  for (const auto& b : kBackends) names += (names.empty() ? "" : " | ") + std::string(b.name);
  return names;
}

const RendezvousBackend& rendezvousBackend(const std::string& name) {
  for (const auto& b : kBackends)
    if (name == b.name) return b;
  TILER_THROW(ConfigError,
              "--rdzv_backend must be one of " << rendezvousBackendNames() << "; got '" << name << "'");
}

}  // namespace tiler::ctrun
