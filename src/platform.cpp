#include "tiler/platform.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ext/stdio_filebuf.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace tiler {

int createFileExclusively(const std::string& path, mode_t mode) {
  // unlink() removes a link itself, never its target; O_EXCL then fails if anything reappeared meanwhile.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return -1;
  return ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
}

std::string writeFileAtomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".partial";
  const int fd = createFileExclusively(tmp);
  if (fd < 0) return "'" + tmp + "': cannot create: " + std::strerror(errno);
  std::string error;
  {
    __gnu_cxx::stdio_filebuf<char> buf(fd, std::ios::out | std::ios::binary);  // closes fd
    std::ostream out(&buf);
    try {
      write(out);
    } catch (const std::exception& e) {
      const std::string what = e.what();  // its first line: LibTorch's add a backtrace
      error = "'" + tmp + "': " + what.substr(0, what.find('\n'));
    }
    out.flush();
    if (error.empty() && (!out.good() || ::fsync(fd) != 0))
      error = "'" + tmp + "': cannot write: " + std::strerror(errno ? errno : EIO);
  }
  if (error.empty() && std::rename(tmp.c_str(), path.c_str()) != 0)
    error = "'" + path + "': cannot rename into place: " + std::strerror(errno);
  if (!error.empty()) ::unlink(tmp.c_str());
  return error;
}

bool writeAll(int fd, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  size_t off = 0;
  while (off < size) {
    const ssize_t n = ::write(fd, bytes + off, size - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

bool isPlainFile(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

DirectoryLock::DirectoryLock(const std::string& dir) : path_(dir + "/.tiler.lock") {
  // A lock file removed by its last holder between our open and our flock is a stale inode: whoever
  // created the next one may hold that. So after locking, the name must still be the inode we locked.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      error_ = "cannot create the lock file '" + path_ + "': " + std::strerror(errno);
      return;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char text[32] = {0};
      const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
      ::close(fd);
      std::string holder = n > 0 ? std::string(text, size_t(n)) : std::string();
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      error_ = err == EWOULDBLOCK
                   ? "another tiler run (pid " + (holder.empty() ? std::string("unknown") : holder) +
                         ") is writing to this directory (lock file '" + path_ + "')"
                   : "cannot lock '" + path_ + "': " + std::strerror(err);
      return;
    }
    struct stat held {
    }, named{};
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      // Without the pid the lock still holds; a second run then says "pid unknown".
      const bool recorded = ::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid.data(), pid.size(), 0) > 0;
      (void)recorded;
      fd_ = fd;
      return;
    }
    ::close(fd);
  }
  error_ = "cannot lock '" + path_ + "': it keeps being replaced";
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  // Unlinked while still held, so that no run can lock this inode after it is gone from the directory.
  ::unlink(path_.c_str());
  ::close(fd_);
}

bool removeTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  // Depth first (contents before their directory), physical (a link is removed, not followed).
  auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) {
    return ::remove(p) == 0 ? 0 : -1;
  };
  return ::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

int cgroupCpuQuota(const std::string& proc_cgroup, const std::string& root) {
  // Quota and period in microseconds from one cgroup directory: v2 "QUOTA PERIOD" or "max PERIOD" in cpu.max,
  // v1 cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us.
  const auto quotaOf = [](const fs::path& dir, bool v2) -> std::pair<double, double> {
    double quota = -1, period = 0;
    if (v2) {
      std::ifstream in(dir / "cpu.max");
      std::string q;
      if (in >> q >> period && q != "max") quota = std::atof(q.c_str());
    } else {
      std::ifstream q(dir / "cpu.cfs_quota_us"), p(dir / "cpu.cfs_period_us");
      if (!(q >> quota && p >> period)) quota = -1;
    }
    return {quota, period};
  };
  double cpus = 0;  // the tightest quota seen, in CPUs; 0: none
  std::istringstream lines(proc_cgroup);
  for (std::string line; std::getline(lines, line);) {
    // "ID:CONTROLLERS:PATH": v2 is "0::PATH"; v1 names its controllers, "cpu" among them for the quota.
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    bool has_cpu = false;
    std::istringstream names(controllers);
    for (std::string n; std::getline(names, n, ',');) has_cpu = has_cpu || n == "cpu";
    if (!v2 && !has_cpu) continue;
    const fs::path mount = v2 ? fs::path(root) : fs::path(root) / controllers;
    // From the cgroup up to the mount's root: a parent's quota binds its children; inside a container the
    // path may not exist under the mount (its root is the container's own cgroup), which the walk reaches.
    for (fs::path rel = fs::path(line.substr(b + 1)).relative_path();; rel = rel.parent_path()) {
      const auto [quota, period] = quotaOf(mount / rel, v2);
      if (quota > 0 && period > 0) cpus = cpus > 0 ? std::min(cpus, quota / period) : quota / period;
      if (rel.empty()) break;
    }
  }
  return cpus > 0 ? std::max(1, int(std::ceil(cpus - 1e-9))) : 0;
}

std::string readWholeFile(const std::string& path) {
  // read(2) until the end: /proc files report size 0, and a directory fails its first read (EISDIR), where
  // an ifstream would throw.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) text.clear();
    if (n <= 0) break;
    text.append(buffer, size_t(n));
  }
  ::close(fd);
  return text;
}

int usableCpus() {
  int cpus = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  // Fails only on machines of more CPUs than a cpu_set_t holds (1024).
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
  const int quota = cgroupCpuQuota(readWholeFile("/proc/self/cgroup"), "/sys/fs/cgroup");
  return quota > 0 ? std::min(cpus, quota) : cpus;
}

double peakRssMegabytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // Linux reports kilobytes
}

double secondsSinceProcessStart() {
  // Field 22 of /proc/self/stat: the start time in clock ticks since boot; fields are counted after the
  // command name's closing parenthesis (the name itself may hold spaces and parentheses).
  const std::string text = readWholeFile("/proc/self/stat");
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int k = 3; k <= 22 && fields >> field; ++k) {
  }
  timespec now{};
  if (fields.fail() || clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  const double started = std::stod(field) / double(sysconf(_SC_CLK_TCK));
  return std::max(0.0, double(now.tv_sec) + double(now.tv_nsec) * 1e-9 - started);
}

std::string bundledSamplesDir() {
  // Installed: <prefix>/bin/tiler finds <prefix>/share/tiler/samples; in the build tree, the source tree's.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "tiler" / "samples";
    if (fs::is_directory(installed / "models", ec)) return installed.string();
  }
  return TILER_SOURCE_DIR "/samples";
}

}  // namespace tiler
