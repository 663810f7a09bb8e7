// rendezvous/registry: the rendezvous backends ctrun knows, by --rdzv_backend name (torch elastic's
// rendezvous/registry.py). A backend is one file (its handler and its flag checks) and one row of the table
// in registry.cpp. No LibTorch.
#pragma once

#include <memory>
#include <string>

#include "tiler/ctrun/rendezvous/handler.hpp"

namespace tiler::ctrun {

struct RendezvousBackend {
  const char* name;
  // Checks the flags the backend needs and fills in its defaults, once the world's node range is known
  // (after --master_port 0 is resolved); ConfigError naming the flag.
  void (*settle)(LaunchOptions& options, int min_nodes, int max_nodes);
  // The handler that joins the other nodes (several nodes only).
  std::unique_ptr<RendezvousHandler> (*make)(const LaunchOptions& options);
};

// The backend named `name`; ConfigError listing the known names otherwise.
const RendezvousBackend& rendezvousBackend(const std::string& name);
// "static | c10d": the names, for help and messages.
std::string rendezvousBackendNames();

}  // namespace tiler::ctrun
