// cpu_layout: how a rank spreads its forwards over the CPUs it may use (replicas x intra-op threads, read
// threads), and which BLAS LibTorch's CPU kernels call. Promise: pure functions of the flags, the CPU count
// and the environment (OMP_NUM_THREADS, Slurm's and the launchers' variables); no LibTorch.
#pragma once

#include <functional>
#include <string>

namespace tiler {

// The tasks Slurm runs on the node at `node_index` (0 first) of a SLURM_TASKS_PER_NODE list such as
// "2(x3),1" (2 tasks on each of the first three nodes, 1 on the fourth); 0 when the list is malformed or
// names fewer nodes.
int slurmTasksOnNode(const std::string& tasks_per_node, int node_index);
// The tasks of this Slurm job step on this node: SLURM_NTASKS_PER_NODE, else SLURM_STEP_TASKS_PER_NODE or
// SLURM_TASKS_PER_NODE at SLURM_NODEID; 0 outside Slurm. `env` looks a variable up (nullptr: getenv).
int slurmLocalTasks(const std::function<const char*(const char*)>& env = nullptr);

// Intra-op threads when --threads is not given: OMP_NUM_THREADS if set; under Slurm SLURM_CPUS_PER_TASK, or
// all the CPUs this process may use (usableCpus()) where Slurm bound it to fewer than the job's CPUs on the
// node; else those CPUs divided by the ranks on this node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE,
// slurmLocalTasks()), which share them.
int defaultIntraOpThreads();
// The same for a process that may use `cpus` CPUs.
int defaultIntraOpThreads(int cpus);
// The BLAS that LibTorch's CPU kernels call (convolutions it lowers to matrix products), as the process
// loaded it: "OpenBLAS <its config>", "Intel MKL", "BLIS", or kReferenceBlas, the reference BLAS of
// Debian's libblas3, which makes the sample UNet's forward 1.5-1.8x slower than OpenBLAS does.
inline constexpr const char* kReferenceBlas = "reference BLAS (netlib)";
std::string cpuBlasName();

// How a rank runs its forwards: `replicas` copies of the model, each on a thread of its own with `threads`
// intra-op threads. On the CPU a batch per core scales better than one intra-op pool over small windows
// (the sample UNet's pure forward: 2 replicas x 1 thread 1.41x faster than 1 x 2 threads on 2 cores), so
// without --threads a rank's share of the CPUs becomes replicas (at most kMaxAutoReplicas, each holding a
// batch's activations). --threads alone pins one replica with that many threads: the outputs of that thread
// count, bit for bit. On CUDA kCudaStreams forward threads unless --replicas says how many: each queues its
// batches on a stream of its own, so one batch's copies in and out and its kernel launches overlap another's
// kernels (the sample UNet on an H200 waited 3.8 ms of a 9.5 ms batch for its results to reach the host).
struct ForwardLayout {
  int replicas = 1;
  int threads = 1;
};
constexpr int kMaxAutoReplicas = 4;
constexpr int kCudaStreams = 2;
// `threads_flag`, `replicas_flag`: --threads and --replicas (0: not given); `cpus`: defaultIntraOpThreads().
// `light`: the model's forward costs less than reading and stitching its windows (a threshold, a 1x1
// convolution): without flags one replica of one thread, the other cores left to the loader and the outputs.
ForwardLayout chooseForwardLayout(int threads_flag, int replicas_flag, bool cuda, int cpus,
                                  bool light = false);
// Threads that read a batch's windows: `read_threads_flag` (--read_threads) when given, else the CPUs of
// the rank (`cpus`) that the forward leaves free (all of them on CUDA), at least 1, at most
// kMaxAutoReadThreads. On a CPU rank whose replicas take every core, more read threads only take turns with
// the forward (null model, 2 cores: 2 read threads 1.12x slower than one).
constexpr int kMaxAutoReadThreads = 4;
int chooseReadThreads(int read_threads_flag, const ForwardLayout& layout, bool cuda, int cpus);

}  // namespace tiler
