// platform: the ground floor: file handling that every output and report goes through, so that no write of
// tiler's can be redirected and no reader ever sees half a file; and the facts of the machine a process
// runs on (its CPUs, its memory, where the bundled samples are).
// Promise: a file tiler creates is created anew (O_CREAT|O_EXCL|O_NOFOLLOW after unlinking what was there),
// so a symbolic link planted under a temporary name is replaced, never followed; a file written "atomically"
// appears under its final name whole or not at all; a character device or FIFO at a name written is
// written as such, never unlinked; no path a command writes is one it reads, another it writes or its lock
// (PathRoles); an output directory is held by one run at a time.
// Failures are returned as messages (no exceptions), so that the error unit can use it too. No LibTorch.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace tiler {

// Creates `path` for writing: whatever was at that name (a stale file, a symbolic link) is unlinked first and
// the open refuses links and existing files. Returns a read-write descriptor (close-on-exec), or -1 with
// errno set.
int createFileExclusively(const std::string& path, mode_t mode = 0644);

// How a name tiler is about to write gets written, by what stands there now. A character device or a FIFO
// (or a link to one: /dev/null, /dev/stdout) is opened as it is and written in order, never unlinked or
// replaced; nothing, a regular file or any other link is a file, created anew and renamed over the name; a
// directory, a block device or a socket is refused (`refused` says why, naming the path).
struct WriteTarget {
  bool stream = false;
  std::string refused;
};
WriteTarget writeTargetOf(const std::string& path);
// The same for a store (an output that is a directory): nothing there, or a directory (not a link), is fine;
// anything else is refused.
WriteTarget storeTargetOf(const std::string& path);
// Opens a stream target for writing without waiting: a FIFO no process reads is an error (ENXIO), never a
// hang. Returns a blocking, close-on-exec descriptor, or -1 with errno set.
int openStreamTarget(const std::string& path);
// What openStreamTarget's errno means, for messages: "a FIFO that no process reads" for ENXIO.
std::string streamOpenError(int err);
// While one lives, a write on this thread to a FIFO whose reader has gone fails with EPIPE instead of ending
// the process by SIGPIPE: the signal is blocked on the thread, and one raised meanwhile is taken at the end.
class SigpipeHeld {
 public:
  SigpipeHeld();
  ~SigpipeHeld();
  SigpipeHeld(const SigpipeHeld&) = delete;
  SigpipeHeld& operator=(const SigpipeHeld&) = delete;

 private:
  sigset_t previous_;
};

// Writes `path` through `path.partial`, created as above: `write` fills the stream, which is flushed and
// synced, then renamed over `path`; a stream target (writeTargetOf) is written directly. Returns "" on
// success, else what failed (the partial file is removed).
std::string writeFileAtomically(const std::string& path, const std::function<void(std::ostream&)>& write);

// The files one command reads and writes, so that no path it writes is anything else it uses: never an
// input, the model, another output or a lock. A name is compared with the links of its directories resolved
// ("v/x.png", "./v/../v/x.png" and "w/x.png" where w links to v are one name); an existing file also by its
// inode (a hard link to an input, or a symbolic link at the name to one, is that input). Character devices
// may be written by several outputs (`-o /dev/null --report /dev/null`), never read and written at once.
class PathRoles {
 public:
  // A file the command reads; `role` names it in messages ("the input", "the model").
  void reads(const std::string& path, const std::string& role);
  // A file the command writes or holds whose own checks were made elsewhere (an output of the catalog).
  void writes(const std::string& path, const std::string& role);
  // Claims `path` for writing as `role` ("--report"): "" when it is none of the files added before and
  // writeTargetOf does not refuse it (it is then added as written), else a message naming both files.
  std::string claim(const std::string& path, const std::string& role);
  // Claims the entries of directory `dir` whose names start with `prefix` (a run makes and removes them:
  // checkpoints): "" when no file added before lies in one, else a message naming it.
  std::string claimEntries(const std::string& dir, const std::string& prefix, const std::string& role);

 private:
  struct Known {
    std::string path, role, name;  // name: resolvedName(path)
    bool read = false, exists = false, character_device = false;
    bool entries = false;  // claimEntries: `name` is a prefix of the names it stands for
    dev_t device = 0;
    ino_t inode = 0;
  };
  Known describe(const std::string& path, const std::string& role, bool read) const;
  std::vector<Known> known_;
};

// Writes all `size` bytes to `fd`, retrying short writes and EINTR. False (errno set) if a write fails.
// Async-signal-safe: ctrun calls it in a child between fork and exec.
bool writeAll(int fd, const void* data, size_t size);
inline bool writeAll(int fd, const std::string& text) {
  return writeAll(fd, text.data(), text.size());
}

// The whole of `path` ("" when it cannot be read): small files (/proc entries, error files).
std::string readWholeFile(const std::string& path);

// What stands at `path` where a file to read should, as a phrase after the quoted path: "" for a regular
// file (or a link to one), else "is a FIFO (named pipe)", "is a directory", "is a character device", "not
// found", "is a symbolic link to nothing", ...: a FIFO would block a read for ever, a device never ends.
std::string notARegularFile(const std::string& path);
// The whole of a document tiler reads (an ROI, a card, a list of inputs, a CSV), or nullopt with `error` set
// (a phrase as above, or "is 3 GiB; at most 512 MiB is read"). What is not a regular file is refused from
// the descriptor itself (opened without waiting: a FIFO never blocks), and so is a file over `max_bytes`,
// both before a byte is read.
std::optional<std::string> readDocument(const std::string& path, int64_t max_bytes, std::string& error);
// The first `count` bytes of a regular file (fewer where it is shorter), "" for anything else or what cannot
// be read: a format's magic, looked at without ever waiting on a FIFO.
std::string leadingBytes(const std::string& path, size_t count);
// "512 MiB": a byte count for messages.
std::string byteSizeText(int64_t bytes);

// True when `path` is a regular file and not a symbolic link (to one): what --resume may count as done.
bool isPlainFile(const std::string& path);
// Whether `path` is a directory itself (not a link to one).
bool isPlainDirectory(const std::string& path);

// An exclusive lock on a directory for the life of this object: an flock on `<dir>/.tiler.lock` (created
// without following a link), which records the holder's pid. The kernel drops the lock when the holder dies,
// so a crashed run never blocks the next; the file is removed when the lock is released, and also when
// SIGINT, SIGTERM or SIGHUP ends the process (a handler unlinks the held lock files, then the signal goes
// on to what was there before: by default, the process ends by that signal).
class DirectoryLock {
 public:
  // Takes the lock or returns an unlocked object whose error() says why (naming the holder's pid when
  // another process holds it). Never waits.
  explicit DirectoryLock(const std::string& dir);
  // The lock file of `dir`: what a command checks its other paths against before it writes.
  static std::string pathFor(const std::string& dir) { return dir + "/.tiler.lock"; }
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  bool locked() const { return fd_ >= 0; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string error_;
  int fd_ = -1;           // owned; -1 when not locked
  int signal_slot_ = -1;  // where the signal handler finds path_ (platform.cpp); -1: not there
};

// Removes `path` and everything under it, not following symbolic links; a missing path counts as removed.
// Returns false if something could not be removed. Not std::filesystem::remove_all: LibTorch's pip and
// pytorch.org builds carry (and export) a static copy of std::filesystem, a program linking them binds its
// own remove_all calls to that copy, and it crashes there (a call through a null pointer; seen with 2.11).
bool removeTree(const std::string& path);
// The bytes of the file at `path`, or of every file under the directory at `path` (links not followed);
// 0 when nothing is there.
int64_t bytesOnDisk(const std::string& path);

// ---- the machine ----

// The CPUs this process may use, at least 1: its affinity mask (a Slurm or cgroup cpuset, taskset), capped
// by its cgroup's CPU quota (a container's --cpus, a Kubernetes CPU limit), not every CPU of the machine; all
// online CPUs only where neither can be read. ctrun sizes --nproc_per_node cpu and the workers'
// OMP_NUM_THREADS by it, tiler its default threads.
int usableCpus();
// The CPU quota of the cgroup whose /proc/<pid>/cgroup text is `proc_cgroup`, with the cgroup filesystems
// mounted under `root`, in whole CPUs (rounded up): the tightest of cgroup v2's cpu.max and v1's
// cpu.cfs_quota_us / cpu.cfs_period_us over the cgroup and its ancestors; 0 where none is set.
int cgroupCpuQuota(const std::string& proc_cgroup, const std::string& root);
// Peak resident memory of this process so far, in MiB.
double peakRssMegabytes();
// Seconds since the kernel started this process (its loading of shared libraries included: LibTorch's take
// a large part of a run's start), at the kernel's 10 ms resolution; -1 when /proc cannot say.
double secondsSinceProcessStart();

// The bundled samples (images, models, training pairs).
std::string bundledSamplesDir();
}  // namespace tiler
