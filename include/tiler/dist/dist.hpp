// dist: who am I in the world, and the collectives the pipeline needs.
// Promise: discoverWorld() reads ctrun/torchrun (RANK, WORLD_SIZE, ...), else Open MPI (OMPI_COMM_WORLD_*:
// mpirun inside a Slurm job), else Slurm (SLURM_PROCID, ...; an sbatch script's own process, no srun step, in
// a job of several tasks is a ConfigError that says to run it with srun), else a single process. DistContext
// rendezvouses through a c10d TCPStore that rank 0 hosts on MASTER_PORT (all interfaces), or, under
// torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True: its static rendezvous), that the agent hosts
// there and every rank reaches under the prefix /worker/attempt_<TORCHELASTIC_RESTART_COUNT>, as PyTorch's
// env:// does; it builds a gloo (CPU tensors) or NCCL (CUDA tensors) process group; ranks that all share one
// host (they can all map rank 0's shared memory segment) gather through it instead of gloo's sockets (same
// bytes, a copy in and a copy out). Every call is bounded by DistOptions::timeout; a timeout is a
// TimeoutError (a DistError) naming MASTER_ADDR:MASTER_PORT, the rank, and what it waited for; a peer whose
// connection closed (it exited or was killed) is a PeerLostError naming that rank when it can be told (a
// world of two; a rank of this host whose process is gone). A world of one makes no process group at all. Not
// thread safe: one thread makes the collectives, in the same order on every rank.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace tiler {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // torchrun | slurm | mpi | single
  // Non-empty under torchrun's agent store: no rank hosts, every rank's keys go under this prefix.
  std::string store_prefix;
};

using EnvLookup = std::function<const char*(const char*)>;
WorldInfo discoverWorld(const EnvLookup& env = nullptr);
// discoverWorld() for a tool's process: errors get a "[rank N] " prefix in a world of several, and ranks
// other than 0 log only warnings and errors.
WorldInfo joinWorld();

// The collective backend for `requested` (auto | gloo | nccl): auto is NCCL on a CUDA device of a build
// with NCCL when each local rank has a GPU of its own (NCCL refuses two ranks on one device), gloo
// otherwise; an explicit nccl that cannot work is a ConfigError saying why.
std::string chooseBackend(const std::string& requested, bool cuda_device, bool nccl_compiled,
                          int local_world_size, int gpus);

struct DistOptions {
  std::string backend = "auto";  // auto | gloo | nccl
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // gather() through shared memory when every rank can map rank 0's segment (gloo, CPU tensors); a rank
  // with false keeps the whole world on the process group.
  bool shared_memory = true;
};

class DistContext {
 public:
  // Rendezvous through a TCPStore at world.master_addr:master_port.
  DistContext(const WorldInfo& world, const DistOptions& options, const torch::Device& device);
  // Over a given store (ranks as threads in tests: c10d::HashStore).
  DistContext(const WorldInfo& world, const DistOptions& options, const torch::Device& device,
              c10::intrusive_ptr<c10d::Store> store);
  ~DistContext();

  int rank() const { return world_.rank; }
  int worldSize() const { return world_.world_size; }
  const std::string& backendName() const { return backend_; }
  // Where collective tensors live: the model's CUDA device for NCCL, the CPU for gloo.
  const torch::Device& commDevice() const { return comm_device_; }
  // How gather() moves tensors: "none" (a world of one), "nccl", "gloo", or "shared_memory" (decided by
  // the first gather).
  const std::string& gatherTransport() const { return gather_transport_; }

  // Every rank's `t` (same shape everywhere, at least one dimension): on rank `root` the world's tensors
  // concatenated along dimension 0 in rank order, elsewhere an undefined tensor. The first gather of a gloo
  // world offers rank 0's shared memory to the others (two more allgathers), sized for the larger of that
  // gather and reserveGather()'s; a later gather that does not fit goes through the process group.
  torch::Tensor gather(const torch::Tensor& t, int root, const std::string& what);
  // The largest tensor one rank will gather, when the first gather may be smaller.
  void reserveGather(size_t bytes) { gather_bytes_ = bytes; }
  // Every rank's `t` on every rank, in rank order.
  std::vector<torch::Tensor> allgather(const torch::Tensor& t, const std::string& what);
  // In place sum over ranks.
  void allreduceSum(torch::Tensor& t, const std::string& what);
  void broadcast(torch::Tensor& t, int root, const std::string& what);
  void barrier(const std::string& what);

  // Small strings through the store (error messages for the report).
  void setString(const std::string& key, const std::string& value);
  // Returns `fallback` when the key does not appear within a short wait.
  std::string getString(const std::string& key, const std::string& fallback);

 private:
  struct Impl;
  struct SharedGather;
  void init(c10::intrusive_ptr<c10d::Store> store, const torch::Device& device);
  [[noreturn]] void fail(const std::string& what, const std::exception& e) const;
  // The "rank R's connection closed" of a PeerLostError: which peers' processes are gone.
  std::string lostPeers() const;
  void publishProcess();
  void readPeerProcesses();
  void offerSharedMemory(size_t bytes, const std::string& what);
  torch::Tensor gatherThroughSharedMemory(const torch::Tensor& t, int root, const std::string& what);
  std::vector<int64_t> worldRows(const torch::Tensor& t) const;  // t's sizes, dimension 0 times the world

  WorldInfo world_;
  DistOptions options_;
  std::string backend_;
  std::string gather_transport_ = "none";
  torch::Device comm_device_{torch::kCPU};
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<SharedGather> shared_;  // gather()'s shared memory, when every rank mapped it
  bool shared_memory_decided_ = false;    // by the first gather
  size_t gather_bytes_ = 0;               // reserveGather()
};

}  // namespace tiler
