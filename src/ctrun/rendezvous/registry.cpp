#include "tiler/ctrun/rendezvous/registry.hpp"

#include "tiler/core/error.hpp"

namespace tiler::ctrun {

// Each backend's file defines its maker.
std::unique_ptr<RendezvousBackend> makeStaticRendezvous();
std::unique_ptr<RendezvousBackend> makeC10dRendezvous();
std::unique_ptr<RendezvousBackend> makeFileRendezvous();

namespace {

struct BackendRow {
  const char* name;
  std::unique_ptr<RendezvousBackend> (*make)();
};

const BackendRow kBackends[] = {
    {"static", makeStaticRendezvous},
    {"c10d", makeC10dRendezvous},
    {"file", makeFileRendezvous},
};

}  // namespace

std::string rendezvousBackendNames() {
  std::string names;
  for (const auto& b : kBackends) names += (names.empty() ? "" : " | ") + std::string(b.name);
  return names;
}

std::unique_ptr<RendezvousBackend> makeRendezvousBackend(const std::string& name) {
  for (const auto& b : kBackends)
    if (name == b.name) return b.make();
  TILER_THROW(ConfigError,
              "--rdzv_backend must be one of " << rendezvousBackendNames() << "; got '" << name << "'");
}

}  // namespace tiler::ctrun
