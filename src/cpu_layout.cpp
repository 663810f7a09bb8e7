#include "tiler/cpu_layout.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

#include "tiler/platform.hpp"

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
  int local = 1;
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(name)) {
      local = std::max(1, std::atoi(v));
      break;
    }
  }
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
