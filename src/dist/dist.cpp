#include "tiler/dist/dist.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/cuda.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <system_error>
#include <thread>

#include "tiler/core/cpu_layout.hpp"
#include "tiler/core/error.hpp"
#include "tiler/model/torch_compat.hpp"
#include "tiler/net/tcp_store.hpp"

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

// gloo's and the TCPStore's words for a peer whose socket closed under them: the peer exited or was killed.
bool isPeerLost(const std::exception& e) {
  const std::string what = e.what();
  for (const char* sign :
       {"Connection closed by peer", "Connection reset by peer", "Broken pipe", "got 0 bytes"})
    if (what.find(sign) != std::string::npos) return true;
  return false;
}

// False when process `pid` of this host has exited (gone, or a zombie its parent has not reaped yet).
bool processAlive(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');  // "pid (comm) S ...": the command may hold spaces and parentheses
  return paren == std::string::npos || paren + 2 >= line.size() ||
         (line[paren + 2] != 'Z' && line[paren + 2] != 'X');
}

std::string thisHost() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

// Layout of the gather segment: a page holding rank 0's nonce (proof that a rank mapped this job's
// segment, not a namesake), then two buffers of one slot per rank; gathers alternate buffers.
constexpr size_t kSegmentHeader = 4096;

// Where each rank's process runs: "<host> <pid>" (worlds of more than two).
const std::string kProcessKey = "tiler/process/";

std::string segmentName(uint64_t nonce) {
  char name[40];
  std::snprintf(name, sizeof name, "/tiler-gather-%016llx", static_cast<unsigned long long>(nonce));
  return name;
}

}  // namespace

// Outside the anonymous namespace: DistContext::SharedGather holds one (GCC warns of a member of internal
// linkage where this file is part of a unity unit).
// A POSIX shared memory segment, mapped read-write. The creator unlinks the name as soon as every rank has
// opened it (or when it is destroyed first): from then on a killed job leaves nothing in /dev/shm.
class SharedSegment {
 public:
  SharedSegment(std::string name, size_t bytes, bool create) : name_(std::move(name)), bytes_(bytes) {
    const int fd = shm_open(name_.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "shm_open " + name_);
    linked_ = create;
    try {
      struct stat st {};
      if (create) {
        if (ftruncate(fd, off_t(bytes)) != 0)
          throw std::system_error(errno, std::generic_category(), "ftruncate");
        // Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS at the first write.
        if (const int err = posix_fallocate(fd, 0, off_t(bytes)); err != 0)
          throw std::system_error(err, std::generic_category(), "posix_fallocate");
      } else if (fstat(fd, &st) != 0 || size_t(st.st_size) != bytes) {
        throw std::runtime_error(name_ + " is not " + std::to_string(bytes) + " bytes");
      }
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap");
      base_ = static_cast<char*>(p);
    } catch (...) {
      close(fd);
      unlink();
      throw;
    }
    close(fd);
  }
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment() {
    unlink();
    if (base_) munmap(base_, bytes_);
  }
  void unlink() {
    if (linked_) shm_unlink(name_.c_str());
    linked_ = false;
  }
  char* data() const { return base_; }

 private:
  std::string name_;
  size_t bytes_;
  char* base_ = nullptr;
  bool linked_ = false;  // this process created the name and has not unlinked it yet
};

struct DistContext::SharedGather {
  std::unique_ptr<SharedSegment> segment;  // owned; mapped by every rank
  size_t slot_bytes = 0;                   // a rank's slot, whole pages
  int64_t gathers = 0;                     // made through the segment: the parity picks the buffer
};

WorldInfo discoverWorld(const EnvLookup& lookup) {
  EnvLookup env = lookup ? lookup : EnvLookup([](const char* n) { return std::getenv(n); });
  WorldInfo w;
  // Open MPI before Slurm: mpirun inside a Slurm job hands its ranks the job's (or its daemons') SLURM_*.
  if (env("RANK") && env("WORLD_SIZE")) {
    w.source = "torchrun";
    w.rank = envInt(env, "RANK", 0);
    w.world_size = envInt(env, "WORLD_SIZE", 1);
    w.local_rank = envInt(env, "LOCAL_RANK", 0);
    w.local_world_size = envInt(env, "LOCAL_WORLD_SIZE", w.world_size);
    const char* agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
    if (agent_store && std::string(agent_store) == "True") {
      const char* attempt = env("TORCHELASTIC_RESTART_COUNT");
      w.store_prefix = std::string("/worker/attempt_") + (attempt && *attempt ? attempt : "0");
    }
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    w.source = "mpi";
    w.rank = envInt(env, "OMPI_COMM_WORLD_RANK", 0);
    w.world_size = envInt(env, "OMPI_COMM_WORLD_SIZE", 1);
    w.local_rank = envInt(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    w.local_world_size = envInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    w.source = "slurm";
    w.rank = envInt(env, "SLURM_PROCID", 0);
    w.world_size = envInt(env, "SLURM_NTASKS", 1);
    w.local_rank = envInt(env, "SLURM_LOCALID", 0);
    w.local_world_size = std::max(1, slurmLocalTasks(env));
    // sbatch runs its script once, as task 0 of the job's SLURM_NTASKS, outside any step: the other ranks
    // would never come.
    TILER_CHECK(w.world_size == 1 || env("SLURM_STEP_ID") || env("SLURM_STEPID"), ConfigError,
                "SLURM_NTASKS=" << w.world_size << " but this process is no task of an srun step (no "
                                << "SLURM_STEP_ID): an sbatch script runs once, so the other "
                                << w.world_size - 1
                                << " ranks would never join; run it with srun (srun tiler ..., as "
                                << "scripts/slurm_example.sbatch does)");
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
  std::vector<long> local_pids;                   // by rank: the process of a rank on this host, else 0
};

DistContext::DistContext(const WorldInfo& world, const DistOptions& options, const torch::Device& device)
    : world_(world), options_(options), impl_(std::make_unique<Impl>()) {
  if (world_.world_size == 1) {
    init(c10::intrusive_ptr<c10d::Store>(), device);
    return;
  }
  // Under torchrun's agent store the agent serves MASTER_PORT already: every rank is a client.
  const bool agent_store = !world_.store_prefix.empty();
  c10d::TCPStoreOptions so = compat::storeOptions();
  so.port = uint16_t(world_.master_port);
  so.isServer = world_.rank == 0 && !agent_store;
  so.numWorkers = world_.world_size;
  so.waitWorkers = false;
  so.timeout = options_.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    // c10d's client sleeps a whole second after a refused connection, and rank 0 (loading LibTorch too)
    // often starts listening a moment after the others arrive: wait for its listener here, in 20 ms steps.
    if (!so.isServer)
      ::close(connectTcp(world_.master_addr, world_.master_port, options_.timeout, "nothing listened"));
    store = c10::make_intrusive<c10d::TCPStore>(world_.master_addr, so);
    if (agent_store) store = c10::make_intrusive<c10d::PrefixStore>(world_.store_prefix, store);
  } catch (const std::exception& e) {
    TILER_THROW(DistError, "rank " << world_.rank << ": cannot " << (so.isServer ? "host" : "reach")
                                   << " the " << (agent_store ? "torchrun agent's " : "") << "c10d store at "
                                   << world_.master_addr << ":" << world_.master_port << ": "
                                   << withoutBacktrace(e.what()));
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
  gather_transport_ = backend;
  impl_->store->setTimeout(options_.timeout);
  publishProcess();
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
  readPeerProcesses();
  spdlog::debug("rank {}: {} process group of {} ready", world_.rank, backend, world_.world_size);
}

void DistContext::fail(const std::string& what, const std::exception& e) const {
  std::ostringstream os;
  os << "rank " << world_.rank << " of " << world_.world_size << ": " << what << " via " << world_.master_addr
     << ":" << world_.master_port;
  if (isPeerLost(e)) {
    os << ": " << lostPeers() << ": " << withoutBacktrace(e.what());
    throw PeerLostError(os.str(), __FILE__, __LINE__);
  }
  os << " failed after waiting up to " << options_.timeout.count() / 1000.0
     << " s (--timeout): " << withoutBacktrace(e.what());
  if (isTimeout(e)) throw TimeoutError(os.str(), __FILE__, __LINE__);
  throw DistError(os.str(), __FILE__, __LINE__);
}

// In a world of more than two, which peer vanished is not in gloo's words (an address and a port): every rank
// says where its process runs, and a failing rank looks for the processes of its host that are gone.
void DistContext::publishProcess() {
  if (world_.world_size <= 2) return;
  const std::string me = thisHost() + " " + std::to_string(getpid());
  try {
    impl_->store->set(kProcessKey + std::to_string(world_.rank), std::vector<uint8_t>(me.begin(), me.end()));
  } catch (const std::exception& e) {
    fail("store set '" + kProcessKey + std::to_string(world_.rank) + "'", e);
  }
}

void DistContext::readPeerProcesses() {
  if (world_.world_size <= 2) return;
  const std::string host = thisHost();
  impl_->local_pids.assign(size_t(world_.world_size), 0);
  for (int r = 0; r < world_.world_size; ++r) {
    std::string where;
    try {
      const auto v = impl_->store->get(kProcessKey + std::to_string(r));  // set before the group formed
      where.assign(v.begin(), v.end());
    } catch (const std::exception& e) {
      fail("store get '" + kProcessKey + std::to_string(r) + "'", e);
    }
    const auto space = where.rfind(' ');
    if (space != std::string::npos && where.substr(0, space) == host)
      impl_->local_pids[size_t(r)] = std::atol(where.c_str() + space + 1);
  }
}

std::string DistContext::lostPeers() const {
  if (world_.world_size == 2)
    return "rank " + std::to_string(1 - world_.rank) + "'s connection closed (it exited or was killed)";
  std::vector<int> gone;
  // A killed peer's sockets close a moment before its process is a zombie.
  for (int attempt = 0; attempt < 10 && gone.empty(); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (size_t r = 0; r < impl_->local_pids.size(); ++r)
      if (impl_->local_pids[r] > 0 && int(r) != world_.rank && !processAlive(impl_->local_pids[r]))
        gone.push_back(int(r));
  }
  if (gone.empty()) return "a peer's connection closed (it exited or was killed)";
  std::string ranks;
  for (int r : gone) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return gone.size() == 1 ? "rank " + ranks + "'s connection closed (it exited or was killed)"
                          : "the connections of ranks " + ranks + " closed (they exited or were killed)";
}

torch::Tensor DistContext::gather(const torch::Tensor& t, int root, const std::string& what) {
  TILER_CHECK(t.dim() >= 1, ConfigError, what << ": gather() concatenates tensors of one dimension or more");
  TILER_CHECK(root >= 0 && root < world_.world_size, ConfigError,
              what << ": gather() to rank " << root << " in a world of " << world_.world_size);
  if (world_.world_size == 1) return t;
  if (backend_ == "gloo" && t.device().is_cpu()) {
    if (!shared_memory_decided_) offerSharedMemory(std::max(t.nbytes(), gather_bytes_), what);
    if (shared_ && t.nbytes() <= shared_->slot_bytes) return gatherThroughSharedMemory(t, root, what);
  }
  // The root receives into consecutive parts of one tensor: the concatenation without a copy of its own.
  torch::Tensor all;
  std::vector<std::vector<torch::Tensor>> outputs;
  if (world_.rank == root) {
    all = torch::empty(worldRows(t), t.options());
    outputs.emplace_back();
    for (int r = 0; r < world_.world_size; ++r) outputs[0].push_back(all.narrow(0, r * t.size(0), t.size(0)));
  }
  std::vector<torch::Tensor> inputs{t.contiguous()};
  try {
    c10d::GatherOptions opts;
    opts.rootRank = root;
    opts.timeout = options_.timeout;
    auto work = impl_->group->gather(outputs, inputs, opts);
    work->wait(options_.timeout);
  } catch (const std::exception& e) {
    fail(what, e);
  }
  return all;
}

std::vector<int64_t> DistContext::worldRows(const torch::Tensor& t) const {
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes[0] *= world_.world_size;
  return sizes;
}

void DistContext::offerSharedMemory(size_t bytes, const std::string& what) {
  shared_memory_decided_ = true;
  const size_t ranks = size_t(world_.world_size);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t slot = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  const size_t total = kSegmentHeader + 2 * ranks * slot;
  auto shared = std::make_unique<SharedGather>();
  shared->slot_bytes = slot;
  int64_t nonce = 0;
  // At most an eighth of the memory: the segment is held for the whole job.
  const size_t memory = size_t(sysconf(_SC_PHYS_PAGES)) * page;
  if (world_.rank == 0 && options_.shared_memory && total <= memory / 8) {
    std::random_device entropy;
    nonce = int64_t(((uint64_t(entropy()) << 32) | entropy()) >> 1) | 1;  // positive, never 0
    try {
      shared->segment = std::make_unique<SharedSegment>(segmentName(uint64_t(nonce)), total, true);
      std::memcpy(shared->segment->data(), &nonce, sizeof nonce);
    } catch (const std::exception& e) {
      spdlog::info("the ranks gather through {}: no shared memory segment of {} MiB ({})", backend_,
                   total >> 20, e.what());
      nonce = 0;
    }
  }
  const int64_t offered =
      allgather(torch::tensor({nonce}, torch::kInt64), "the shared memory offer before " + what)[0]
          .item<int64_t>();
  bool mapped = offered != 0 && options_.shared_memory;
  if (mapped && world_.rank != 0) {
    try {
      shared->segment = std::make_unique<SharedSegment>(segmentName(uint64_t(offered)), total, false);
      int64_t seen = 0;
      std::memcpy(&seen, shared->segment->data(), sizeof seen);
      mapped = seen == offered;
    } catch (const std::exception& e) {
      spdlog::debug("rank {}: cannot map rank 0's shared memory: {}", world_.rank, e.what());
      mapped = false;
    }
  }
  auto answers =
      allgather(torch::tensor({int64_t(mapped)}, torch::kInt64), "the shared memory answers before " + what);
  if (shared->segment) shared->segment->unlink();  // every rank that could open it has
  bool everyone = true;
  for (const auto& a : answers) everyone = everyone && a.item<int64_t>() == 1;
  if (!everyone) return;
  shared_ = std::move(shared);
  gather_transport_ = "shared_memory";
}

torch::Tensor DistContext::gatherThroughSharedMemory(const torch::Tensor& t, int root,
                                                     const std::string& what) {
  const torch::Tensor src = t.contiguous();
  const size_t bytes = src.nbytes();
  const size_t slot = shared_->slot_bytes;
  char* buffer = shared_->segment->data() + kSegmentHeader +
                 size_t(shared_->gathers++ % 2) * size_t(world_.world_size) * slot;
  if (world_.rank != root) std::memcpy(buffer + size_t(world_.rank) * slot, src.data_ptr(), bytes);
  // Past this allgather every slot is written. A rank writes its slot of this buffer again only after the
  // next gather's allgather, which needs every rank, this gather's root too, which copies this one out first.
  auto sizes = allgather(torch::tensor({int64_t(bytes)}, torch::kInt64), what);
  for (size_t r = 0; r < sizes.size(); ++r)
    TILER_CHECK(size_t(sizes[r].item<int64_t>()) == bytes, DistError,
                what << ": rank " << r << " gathered " << sizes[r].item<int64_t>() << " bytes, rank "
                     << world_.rank << " " << bytes);
  if (world_.rank != root) return {};
  torch::Tensor all = torch::empty(worldRows(src), src.options());
  auto* out = static_cast<char*>(all.data_ptr());
  for (int r = 0; r < world_.world_size; ++r)
    std::memcpy(out + size_t(r) * bytes, r == root ? src.data_ptr() : buffer + size_t(r) * slot, bytes);
  return all;
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
