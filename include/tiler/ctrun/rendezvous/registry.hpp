// rendezvous/registry: the rendezvous backends ctrun knows, by --rdzv_backend name (torch elastic's
// rendezvous/registry.py). A backend is one file of src/ctrun/rendezvous/ (its RendezvousBackend) and one row
// of the table in registry.cpp. No LibTorch.
#pragma once

#include <memory>
#include <string>

#include "tiler/ctrun/rendezvous/backend.hpp"

namespace tiler::ctrun {

// A new backend named `name`, not yet settled; ConfigError listing the known names otherwise.
std::unique_ptr<RendezvousBackend> makeRendezvousBackend(const std::string& name);
// "static | c10d | file": the names, for help and messages.
std::string rendezvousBackendNames();

}  // namespace tiler::ctrun
