#include "tiler/dist.hpp"

#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <cstdlib>

#include "tiler/error.hpp"
#include "tiler/torch_compat.hpp"

namespace tiler {
namespace {

int envInt(const EnvLookup& env, const char* name, int fallback) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return fallback;
  try {
    return std::stoi(v);
  } catch (const std::exception&) {
    TILER_THROW(ConfigError, "environment variable " << name << "='" << v << "' is not an integer");
  }
}

bool isTimeout(const std::exception& e) {
  std::string what = e.what();
  return what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos;
}

}  // namespace

WorldInfo discoverWorld(const EnvLookup& lookup) {
  EnvLookup env = lookup ? lookup : EnvLookup([](const char* n) { return std::getenv(n); });
  WorldInfo w;
  if (env("RANK") && env("WORLD_SIZE")) {
    w.source = "torchrun";
    w.rank = envInt(env, "RANK", 0);
    w.world_size = envInt(env, "WORLD_SIZE", 1);
    w.local_rank = envInt(env, "LOCAL_RANK", 0);
    w.local_world_size = envInt(env, "LOCAL_WORLD_SIZE", w.world_size);
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    w.source = "slurm";
    w.rank = envInt(env, "SLURM_PROCID", 0);
    w.world_size = envInt(env, "SLURM_NTASKS", 1);
    w.local_rank = envInt(env, "SLURM_LOCALID", 0);
    w.local_world_size = envInt(env, "SLURM_NTASKS_PER_NODE", envInt(env, "SLURM_TASKS_PER_NODE", 1));
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    w.source = "mpi";
    w.rank = envInt(env, "OMPI_COMM_WORLD_RANK", 0);
    w.world_size = envInt(env, "OMPI_COMM_WORLD_SIZE", 1);
    w.local_rank = envInt(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    w.local_world_size = envInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  }
  if (const char* addr = env("MASTER_ADDR")) w.master_addr = addr;
  w.master_port = envInt(env, "MASTER_PORT", 29500);
  TILER_CHECK(
      w.world_size >= 1 && w.rank >= 0 && w.rank < w.world_size, ConfigError,
      "rank " << w.rank << " is outside the world of " << w.world_size << " (from " << w.source << ")");
  TILER_CHECK(w.world_size == 1 || (env("MASTER_ADDR") && env("MASTER_PORT")) || w.source == "torchrun",
              ConfigError,
              "a world of " << w.world_size << " from " << w.source << " needs MASTER_ADDR and MASTER_PORT");
  return w;
}

WorldInfo joinWorld() {
  WorldInfo w = discoverWorld();
  if (w.world_size > 1) setErrorRankPrefix("[rank " + std::to_string(w.rank) + "] ");
  if (w.rank != 0) spdlog::set_level(spdlog::level::warn);
  return w;
}

std::string chooseBackend(const std::string& requested, bool cuda_device, bool nccl_compiled,
                          int local_world_size, int gpus) {
  TILER_CHECK(requested == "auto" || requested == "gloo" || requested == "nccl", ConfigError,
              "--backend must be auto, gloo or nccl; got '" << requested << "'");
  const bool gpu_each = local_world_size <= gpus;
  if (requested == "auto") return cuda_device && nccl_compiled && gpu_each ? "nccl" : "gloo";
  if (requested == "nccl") {
    TILER_CHECK(cuda_device && nccl_compiled, ConfigError,
                "--backend nccl needs a CUDA device and a LibTorch built with NCCL");
    TILER_CHECK(gpu_each, ConfigError,
                "--backend nccl: " << local_world_size << " ranks on this node share " << gpus
                                   << " GPU(s), and NCCL refuses two ranks on one device; use --backend gloo "
                                   << "or at most one rank per GPU");
  }
  return requested;
}

struct DistContext::Impl {
  c10::intrusive_ptr<c10d::Store> store;          // owned (shared with the process group)
  c10::intrusive_ptr<compat::Collectives> group;  // null in a world of one
};

DistContext::DistContext(const WorldInfo& world, const DistOptions& options, const torch::Device& device)
    : world_(world), options_(options), impl_(std::make_unique<Impl>()) {
  if (world_.world_size == 1) {
    init(c10::intrusive_ptr<c10d::Store>(), device);
    return;
  }
  c10d::TCPStoreOptions so = compat::storeOptions();
  so.port = uint16_t(world_.master_port);
  so.isServer = world_.rank == 0;
  so.numWorkers = world_.world_size;
  so.waitWorkers = false;
  so.timeout = options_.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(world_.master_addr, so);
  } catch (const std::exception& e) {
    TILER_THROW(DistError, "rank " << world_.rank << ": cannot " << (so.isServer ? "host" : "reach")
                                   << " the c10d store at " << world_.master_addr << ":" << world_.master_port
                                   << ": " << e.what());
  }
  init(store, device);
}

DistContext::DistContext(const WorldInfo& world, const DistOptions& options, const torch::Device& device,
                         c10::intrusive_ptr<c10d::Store> store)
    : world_(world), options_(options), impl_(std::make_unique<Impl>()) {
  init(std::move(store), device);
}

DistContext::~DistContext() {
  if (!impl_ || !impl_->group) return;
  try {
    compat::shutdownGroup(impl_->group.get());
  } catch (const std::exception& e) {
    spdlog::warn("rank {}: shutting the {} process group down: {}", world_.rank, backend_, e.what());
  }
}

void DistContext::init(c10::intrusive_ptr<c10d::Store> store, const torch::Device& device) {
  impl_->store = std::move(store);
  const std::string backend =
      chooseBackend(options_.backend, device.is_cuda(), compat::kNcclCompiled, world_.local_world_size,
                    device.is_cuda() ? int(torch::cuda::device_count()) : 0);
  backend_ = backend;
  if (backend == "nccl") comm_device_ = device;
  if (world_.world_size == 1) return;
  impl_->store->setTimeout(options_.timeout);
  try {
    if (backend == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(options_.timeout);
      if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      } else if (world_.master_addr == "127.0.0.1" || world_.master_addr == "localhost") {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      impl_->group =
          c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, world_.rank, world_.world_size, opts);
    } else {
#if TILER_WITH_NCCL
      compat::enableNcclTimeouts();
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = options_.timeout;
      impl_->group =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, world_.rank, world_.world_size, opts);
#endif
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("the " + backend + " process group rendezvous", e);
  }
  spdlog::debug("rank {}: {} process group of {} ready", world_.rank, backend, world_.world_size);
}

void DistContext::fail(const std::string& what, const std::exception& e) const {
  std::ostringstream os;
  os << "rank " << world_.rank << " of " << world_.world_size << ": " << what << " via " << world_.master_addr
     << ":" << world_.master_port << " failed after waiting up to " << options_.timeout.count() / 1000.0
     << " s (--timeout): " << e.what();
  if (isTimeout(e)) throw TimeoutError(os.str(), __FILE__, __LINE__);
  throw DistError(os.str(), __FILE__, __LINE__);
}

std::vector<torch::Tensor> DistContext::gather(const torch::Tensor& t, const std::string& what) {
  if (world_.world_size == 1) return {t};
  std::vector<std::vector<torch::Tensor>> outputs;
  if (world_.rank == 0) {
    outputs.emplace_back();
    for (int r = 0; r < world_.world_size; ++r) outputs[0].push_back(torch::empty_like(t));
  }
  std::vector<torch::Tensor> inputs{t.contiguous()};
  try {
    c10d::GatherOptions opts;
    opts.rootRank = 0;
    opts.timeout = options_.timeout;
    auto work = impl_->group->gather(outputs, inputs, opts);
    work->wait(options_.timeout);
  } catch (const std::exception& e) {
    fail(what, e);
  }
  return world_.rank == 0 ? outputs[0] : std::vector<torch::Tensor>{};
}

std::vector<torch::Tensor> DistContext::allgather(const torch::Tensor& t, const std::string& what) {
  if (world_.world_size == 1) return {t};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int r = 0; r < world_.world_size; ++r) outputs[0].push_back(torch::empty_like(t));
  std::vector<torch::Tensor> inputs{t.contiguous()};
  try {
    c10d::AllgatherOptions opts;
    opts.timeout = options_.timeout;
    impl_->group->allgather(outputs, inputs, opts)->wait(options_.timeout);
  } catch (const std::exception& e) {
    fail(what, e);
  }
  return outputs[0];
}

void DistContext::allreduceSum(torch::Tensor& t, const std::string& what) {
  if (world_.world_size == 1) return;
  std::vector<torch::Tensor> tensors{t};
  try {
    c10d::AllreduceOptions opts;
    opts.timeout = options_.timeout;
    impl_->group->allreduce(tensors, opts)->wait(options_.timeout);
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void DistContext::broadcast(torch::Tensor& t, int root, const std::string& what) {
  if (world_.world_size == 1) return;
  std::vector<torch::Tensor> tensors{t};
  try {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = options_.timeout;
    impl_->group->broadcast(tensors, opts)->wait(options_.timeout);
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void DistContext::barrier(const std::string& what) {
  if (world_.world_size == 1) return;
  try {
    c10d::BarrierOptions opts;
    opts.timeout = options_.timeout;
    impl_->group->barrier(opts)->wait(options_.timeout);
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void DistContext::setString(const std::string& key, const std::string& value) {
  if (!impl_->store) return;
  try {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    fail("store set '" + key + "'", e);
  }
}

std::string DistContext::getString(const std::string& key, const std::string& fallback) {
  if (!impl_->store) return fallback;
  try {
    impl_->store->wait({key}, std::chrono::milliseconds(2000));
    auto v = impl_->store->get(key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception&) {
    return fallback;
  }
}

}  // namespace tiler
