#include "tiler/core/cpu_layout.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "tiler/core/platform.hpp"

namespace tiler {

std::string cpuBlasName() {
  // Debian's alternatives put any of these behind libblas.so.3; only the reference BLAS names nothing. Asked
  // of the library that LibTorch's sgemm_ resolves to: another BLAS may be loaded beside it (OpenBLAS's
  // liblapack.so.3 next to a reference libblas.so.3 first on LD_LIBRARY_PATH).
  Dl_info where{};
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  if (!sgemm || !dladdr(sgemm, &where) || !where.dli_fname) return "none (no sgemm_ loaded)";
  // pip's and pytorch.org's LibTorch carry their BLAS (MKL) inside libtorch_cpu: no libblas.so.3 to choose.
  const std::string file = where.dli_fname;
  const std::string base = file.substr(file.rfind('/') + 1);
  if (base.rfind("libtorch", 0) == 0) return "built into LibTorch (" + base + ")";
  void* blas = dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!blas) return kReferenceBlas;
  std::string name = kReferenceBlas;
  if (auto config = reinterpret_cast<char* (*)()>(dlsym(blas, "openblas_get_config"))) {
    const std::string c = config();  // "OpenBLAS 0.3.21 ... USE_OPENMP Haswell MAX_THREADS=64"
    name = c.rfind("OpenBLAS", 0) == 0 ? c : "OpenBLAS " + c;
  } else if (dlsym(blas, "mkl_get_version_string")) {
    name = "Intel MKL";
  } else if (dlsym(blas, "bli_info_get_version_str")) {
    name = "BLIS";
  }
  dlclose(blas);
  return name;
}

int slurmTasksOnNode(const std::string& tasks_per_node, int node_index) {
  // Comma-separated entries "N" or "N(xM)": N tasks on each of the next M nodes. The whole list is read, so
  // that a malformed one is refused whichever node asks.
  std::istringstream in(tasks_per_node);
  std::string entry;
  int first_node = 0, found = 0;
  while (std::getline(in, entry, ',')) {
    int tasks = 0, nodes = 1;
    char close = 0;
    std::istringstream e(entry);
    if (!(e >> tasks) || tasks < 1) return 0;
    if (e.peek() == '(') {
      e.get();
      if (e.get() != 'x' || !(e >> nodes) || nodes < 1 || !(e >> close) || close != ')') return 0;
    }
    if (e.peek() != std::char_traits<char>::eof()) return 0;
    if (node_index >= first_node && node_index < first_node + nodes) found = tasks;
    first_node += nodes;
  }
  return found;
}

int slurmLocalTasks(const std::function<const char*(const char*)>& lookup) {
  const auto env = [&](const char* name) { return lookup ? lookup(name) : std::getenv(name); };
  if (const char* n = env("SLURM_NTASKS_PER_NODE"); n && std::atoi(n) > 0) return std::atoi(n);
  const char* node = env("SLURM_NODEID");
  const int node_index = node ? std::atoi(node) : 0;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
    if (const char* list = env(name)) return slurmTasksOnNode(list, node_index);
  return 0;
}

int defaultIntraOpThreads() {
  return defaultIntraOpThreads(usableCpus());
}

int defaultIntraOpThreads(int cpus) {
  // OMP_NUM_THREADS (ctrun sets cores / local workers) is the user's or the launcher's word.
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(omp);
    if (n > 0) return n;
  }
  // LibTorch's own default guesses physical cores as half the logical ones (1 on a 2-vCPU machine); tiler
  // gives each rank on this node its share of the CPUs it may run on.
  // Slurm says a task's CPUs itself, and a task it bound to CPUs of its own (a mask smaller than the job's
  // CPUs on this node) has them alone: dividing them again by the tasks would leave most of them idle.
  const auto slurm = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : 0;
  };
  if (const int per_task = slurm("SLURM_CPUS_PER_TASK"); per_task > 0) return std::min(cpus, per_task);
  if (cpus < slurm("SLURM_CPUS_ON_NODE")) return cpus;
  int local = 0;
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    if (const char* v = std::getenv(name)) {
      local = std::max(1, std::atoi(v));
      break;
    }
  }
  if (local == 0) local = std::max(1, slurmLocalTasks());
  return std::max(1, cpus / local);
}

ForwardLayout chooseForwardLayout(int threads_flag, int replicas_flag, bool cuda, int cpus, bool light) {
  ForwardLayout layout;
  if (threads_flag <= 0 && replicas_flag <= 0 && !cuda && light) return layout;
  if (replicas_flag > 0)
    layout.replicas = replicas_flag;
  else if (cuda)
    layout.replicas = kCudaStreams;
  else if (threads_flag <= 0)
    layout.replicas = std::clamp(cpus, 1, kMaxAutoReplicas);
  layout.threads = threads_flag > 0 ? threads_flag : std::max(1, cpus / layout.replicas);
  return layout;
}

int chooseReadThreads(int read_threads_flag, const ForwardLayout& layout, bool cuda, int cpus) {
  if (read_threads_flag > 0) return read_threads_flag;
  const int free_cpus = cuda ? cpus : cpus - layout.replicas * layout.threads;
  return std::clamp(free_cpus, 1, kMaxAutoReadThreads);
}

}  // namespace tiler
