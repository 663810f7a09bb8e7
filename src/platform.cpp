#include "tiler/platform.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ext/stdio_filebuf.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

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

}  // namespace tiler
