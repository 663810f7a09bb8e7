#include "tiler/core/platform.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ext/stdio_filebuf.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace tiler {

int createFileExclusively(const std::string& path, mode_t mode) {
  // A device node is the system's, whatever its name (run as root, unlinking /dev/full.partial would be
  // as wrong as unlinking /dev/full): left alone, and the name is taken (EEXIST).
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))) {
    errno = EEXIST;
    return -1;
  }
  // unlink() removes a link itself, never its target; O_EXCL then fails if anything reappeared meanwhile.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return -1;
  return ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
}

WriteTarget writeTargetOf(const std::string& path) {
  WriteTarget target;
  struct stat st {};
  // Followed: /dev/stdout is a link to the process's descriptor, a terminal or a pipe.
  if (::stat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    target.stream = true;
    return target;
  }
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return target;
  const char* kind = S_ISDIR(st.st_mode)   ? "a directory"
                     : S_ISBLK(st.st_mode) ? "a block device"
                                           : "a socket";
  target.refused = "'" + path + "' is " + kind +
                   "; tiler writes files, character devices and FIFOs, never over anything else";
  return target;
}

WriteTarget storeTargetOf(const std::string& path) {
  WriteTarget target;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) return target;
  target.refused = "'" + path + "' is " + (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory") +
                   "; a store (a directory) only ever replaces a store of its own";
  return target;
}

int openStreamTarget(const std::string& path) {
  // Without O_NONBLOCK, opening a FIFO for writing waits for a reader, forever if none comes.
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return -1;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

std::string streamOpenError(int err) {
  return err == ENXIO ? "a FIFO that no process reads" : std::strerror(err);
}

SigpipeHeld::SigpipeHeld() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &previous_);
}

SigpipeHeld::~SigpipeHeld() {
  sigset_t pipe, pending;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  const timespec now{0, 0};
  if (!sigismember(&previous_, SIGPIPE) && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
    sigtimedwait(&pipe, nullptr, &now);
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

namespace {

// `write` into a character device or FIFO, as it is: no temporary name, no rename, no sync (/dev/null
// cannot be synced).
std::string writeStream(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const int fd = openStreamTarget(path);
  if (fd < 0) return "'" + path + "': cannot open: " + streamOpenError(errno);
  std::string error;
  const SigpipeHeld held;
  __gnu_cxx::stdio_filebuf<char> buf(fd, std::ios::out | std::ios::binary);  // closes fd
  std::ostream out(&buf);
  try {
    write(out);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    error = "'" + path + "': " + what.substr(0, what.find('\n'));
  }
  out.flush();
  if (error.empty() && !out.good())
    error = "'" + path + "': cannot write: " + std::strerror(errno ? errno : EIO);
  return error;
}

}  // namespace

std::string writeFileAtomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const WriteTarget target = writeTargetOf(path);
  if (!target.refused.empty()) return target.refused;
  if (target.stream) return writeStream(path, write);
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

namespace {

// `path` absolute, its existing directories' links resolved and its "." and ".." taken out; the last
// component kept as it is (a link there is the name written, which is replaced, not followed). A directory
// that does not exist yet is taken by its deepest existing ancestor.
std::string resolvedName(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (p.is_relative()) p = fs::current_path(ec) / p;
  const fs::path parent = p.parent_path();
  if (parent == p) return p.string();  // the root
  // The directory part: resolved where it exists, else its own parent resolved and its name appended.
  std::string dir;
  if (char* real = ::realpath(parent.c_str(), nullptr)) {
    dir = real;
    std::free(real);
  } else {
    dir = resolvedName(parent.string());
  }
  const std::string name = p.filename().string();
  if (name.empty() || name == ".") return dir;
  if (name == "..") return fs::path(dir).parent_path().string();
  return (fs::path(dir) / name).string();
}

}  // namespace

PathRoles::Known PathRoles::describe(const std::string& path, const std::string& role, bool read) const {
  Known k;
  k.path = path;
  k.role = role;
  k.name = resolvedName(path);
  k.read = read;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    k.exists = true;
    k.character_device = S_ISCHR(st.st_mode);
    k.device = st.st_dev;
    k.inode = st.st_ino;
  }
  return k;
}

void PathRoles::reads(const std::string& path, const std::string& role) {
  known_.push_back(describe(path, role, true));
}

void PathRoles::writes(const std::string& path, const std::string& role) {
  known_.push_back(describe(path, role, false));
}

std::string PathRoles::claim(const std::string& path, const std::string& role) {
  const WriteTarget target = writeTargetOf(path);
  if (!target.refused.empty()) return role + ": " + target.refused;
  const Known k = describe(path, role, false);
  for (const Known& other : known_) {
    const bool same_file = k.exists && other.exists && k.device == other.device && k.inode == other.inode;
    const bool in_entries = other.entries && k.name.rfind(other.name, 0) == 0;
    if (!same_file && !in_entries && k.name != other.name) continue;
    // Output after output into /dev/null or a terminal is no loss; a device read is not written.
    if (k.character_device && !other.read) continue;
    if (in_entries)
      return role + " '" + path + "' lies in " + other.role + " '" + other.path +
             "*', which this run makes and removes; choose another path";
    return role + " '" + path + "' is " + other.role + " '" + other.path + "'" +
           (other.read ? ", which this run reads: it never writes over it" : ", which this run also writes") +
           "; choose another path";
  }
  known_.push_back(k);
  return "";
}

std::string PathRoles::claimEntries(const std::string& dir, const std::string& prefix,
                                    const std::string& role) {
  Known k = describe((fs::path(dir) / prefix).string(), role, false);
  k.entries = true;
  k.exists = false;  // a name pattern, not the file of that name
  for (const Known& other : known_) {
    if (other.entries || other.name.rfind(k.name, 0) != 0) continue;
    return other.role + " '" + other.path + "' lies in " + role + " '" + k.path +
           "*', which this run makes and removes; choose another path";
  }
  known_.push_back(k);
  return "";
}

bool isPlainFile(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool isPlainDirectory(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

namespace {

// The lock files this process holds, for a handler that may run on any thread at any moment: fixed storage,
// no allocation, no mutex. A slot is free (0), being filled or emptied (1), or names a held lock (2).
constexpr int kLockSlots = 8;
char g_held_locks[kLockSlots][PATH_MAX];
std::atomic<int> g_held_lock_state[kLockSlots];
constexpr int kEndingSignals[] = {SIGINT, SIGTERM, SIGHUP};

// What the default action of an ending signal would leave behind, removed first; then that action.
void removeHeldLocksAndEnd(int sig) {
  const int saved = errno;
  for (int i = 0; i < kLockSlots; ++i)
    if (g_held_lock_state[i].load() == 2) ::unlink(g_held_locks[i]);
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // blocked while this handler runs: delivered, with the default action, when it returns
  errno = saved;
}

// Only where the default action stands: a signal ignored (nohup) stays ignored, and a handler someone else
// installed is theirs to run.
void installLockRemoval() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const int sig : kEndingSignals) {
      struct sigaction now {};
      if (::sigaction(sig, nullptr, &now) != 0 || (now.sa_flags & SA_SIGINFO) || now.sa_handler != SIG_DFL)
        continue;
      struct sigaction ours {};
      ours.sa_handler = removeHeldLocksAndEnd;
      sigemptyset(&ours.sa_mask);
      ::sigaction(sig, &ours, nullptr);
    }
  });
}

// The slot now naming `path`, or -1 (all taken, or a path too long: the lock holds, only its file stays
// behind a signal).
int rememberHeldLock(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  installLockRemoval();
  for (int i = 0; i < kLockSlots; ++i) {
    int expected = 0;
    if (!g_held_lock_state[i].compare_exchange_strong(expected, 1)) continue;
    std::memcpy(g_held_locks[i], path.c_str(), path.size() + 1);
    g_held_lock_state[i].store(2);
    return i;
  }
  return -1;
}

void forgetHeldLock(int slot) {
  if (slot >= 0) g_held_lock_state[slot].store(0);
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir) : path_(pathFor(dir)) {
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
      // Known to the signal handler before the pid is recorded: a file that names its holder is removed.
      signal_slot_ = rememberHeldLock(path_);
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
  forgetHeldLock(signal_slot_);
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

int64_t bytesOnDisk(const std::string& path) {
  // nftw's callback takes no context: the sum is per thread (output stages of ranks run as threads in tests).
  thread_local int64_t bytes;
  bytes = 0;
  auto add_one = [](const char*, const struct stat* st, int type, struct FTW*) {
    if (type == FTW_F) bytes += int64_t(st->st_size);
    return 0;
  };
  ::nftw(path.c_str(), add_one, 16, FTW_PHYS);
  return bytes;
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

namespace {

std::string fileTypePhrase(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  if (S_ISSOCK(mode)) return "is a socket";
  return "is not a regular file";
}

std::string missingFilePhrase(const std::string& path, int err) {
  struct stat link {};
  if (err == ELOOP) return "is a loop of symbolic links";
  if (err == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
    return "is a symbolic link to nothing";
  if (err == ENOENT) return "not found";
  return std::string("cannot be read: ") + std::strerror(err);
}

}  // namespace

std::string notARegularFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return missingFilePhrase(path, errno);
  return fileTypePhrase(st.st_mode);
}

std::string byteSizeText(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  std::ostringstream text;
  text << (unit == 0 ? std::llround(value) : std::round(value * 10) / 10) << " " << units[unit];
  return text.str();
}

namespace {

// A descriptor of the regular file at `path`, or -1 with `error` saying why. Not even opened unless stat says
// a regular file stands there (opening a device can do things); opened without waiting (a FIFO swapped in
// never blocks) and the descriptor checked again, for what was swapped in between.
int openRegularFile(const std::string& path, struct stat& st, std::string& error) {
  error = notARegularFile(path);
  if (!error.empty()) return -1;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    error = missingFilePhrase(path, errno);
    return -1;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    error =
        st.st_mode == 0 ? std::string("cannot be read: ") + std::strerror(errno) : fileTypePhrase(st.st_mode);
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string leadingBytes(const std::string& path, size_t count) {
  struct stat st {};
  std::string error;
  const int fd = openRegularFile(path, st, error);
  if (fd < 0) return "";
  std::string bytes(count, '\0');
  ssize_t n;
  do n = ::pread(fd, bytes.data(), count, 0);
  while (n < 0 && errno == EINTR);
  ::close(fd);
  bytes.resize(n > 0 ? size_t(n) : 0);
  return bytes;
}

std::optional<std::string> readDocument(const std::string& path, int64_t max_bytes, std::string& error) {
  struct stat st {};
  const int fd = openRegularFile(path, st, error);
  if (fd < 0) return std::nullopt;
  if (st.st_size > max_bytes) {
    error = "is " + byteSizeText(st.st_size) + "; at most " + byteSizeText(max_bytes) + " is read";
    ::close(fd);
    return std::nullopt;
  }
  std::string text;
  text.reserve(size_t(st.st_size));
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = std::string("cannot be read: ") + std::strerror(errno);
    if (n <= 0) break;
    text.append(buffer, size_t(n));
    if (int64_t(text.size()) > max_bytes) {  // grew while read
      error = "grew past " + byteSizeText(max_bytes) + " while it was read";
      break;
    }
  }
  ::close(fd);
  if (!error.empty()) return std::nullopt;
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
