#include "tiler/net/file_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

namespace tiler {
namespace {

using Clock = std::chrono::steady_clock;

bool keptAsIs(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.';
}

// The key as a file name: a leading '.' is escaped too, so no key's file is taken for a temporary one.
std::string escapeKey(const std::string& key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string name;
  for (size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (keptAsIs(char(c)) && !(i == 0 && c == '.')) {
      name += char(c);
    } else {
      name += '%';
      name += kHex[c >> 4];
      name += kHex[c & 15];
    }
  }
  return name;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The key a file name holds (its suffix, '=' or '+N', already cut off); nullopt for a name no key makes.
std::optional<std::string> unescapeKey(const std::string& name) {
  std::string key;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      key += name[i];
      continue;
    }
    if (i + 2 >= name.size()) return std::nullopt;
    const int hi = hexDigit(name[i + 1]), lo = hexDigit(name[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    key += char(hi * 16 + lo);
    i += 2;
  }
  return key;
}

// The contents of `path`, or nullopt when there is no such file; DistError for anything else.
std::optional<std::string> readValue(const std::string& path, const std::string& directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  TILER_CHECK(
      fd >= 0, DistError,
      "rendezvous directory " << directory << ": cannot read " << path << ": " << std::strerror(errno));
  std::string value;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && value.size() <= FileStore::kMaxValueBytes)
    value.append(buf, size_t(n));
  const int err = errno;
  ::close(fd);
  TILER_CHECK(n >= 0, DistError,
              "rendezvous directory " << directory << ": cannot read " << path << ": " << std::strerror(err));
  TILER_CHECK(value.size() <= FileStore::kMaxValueBytes, DistError,
              "rendezvous directory " << directory << ": " << path << " holds more than "
                                      << FileStore::kMaxValueBytes << " bytes");
  return value;
}

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  TILER_CHECK(isPlainDirectory(directory_), DistError,
              "rendezvous directory " << directory_ << ": cannot make it"
                                      << (ec ? ": " + ec.message() : std::string(" (not a directory)")));
}

std::string FileStore::fileOf(const std::string& key, const std::string& suffix) const {
  const std::string name = escapeKey(key) + suffix;
  // The longest counter entry's suffix ("+" and 19 digits) must fit as well.
  TILER_CHECK(name.size() + 20 <= NAME_MAX, DistError,
              "rendezvous directory " << directory_ << ": key '" << key << "' is too long for a file name");
  return directory_ + "/" + name;
}

std::string FileStore::writeTemporary(const std::string& value) {
  TILER_CHECK(value.size() <= kMaxValueBytes, DistError,
              "rendezvous directory " << directory_ << ": a value of " << value.size() << " bytes (at most "
                                      << kMaxValueBytes << ")");
  static const std::string host = [] {
    char name[256] = {0};
    gethostname(name, sizeof name - 1);
    return escapeKey(name);
  }();
  const std::string path = directory_ + "/.tmp-" + host + "-" + std::to_string(getpid()) + "-" +
                           std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
                           std::to_string(++temporaries_);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TILER_CHECK(
      fd >= 0, DistError,
      "rendezvous directory " << directory_ << ": cannot write " << path << ": " << std::strerror(errno));
  const bool written = writeAll(fd, value);
  const int err = errno;
  if (::close(fd) != 0 || !written) {
    ::unlink(path.c_str());
    TILER_THROW(DistError, "rendezvous directory " << directory_ << ": cannot write " << path << ": "
                                                   << std::strerror(written ? errno : err));
  }
  return path;
}

void FileStore::set(const std::string& key, const std::string& value, std::chrono::milliseconds) {
  const std::string target = fileOf(key, "=");
  const std::string temporary = writeTemporary(value);
  if (::rename(temporary.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    TILER_THROW(DistError, "rendezvous directory " << directory_ << ": cannot set '" << key
                                                   << "': " << std::strerror(err));
  }
}

std::optional<std::string> FileStore::get(const std::string& key, std::chrono::milliseconds) {
  if (auto value = readValue(fileOf(key, "="), directory_)) return value;
  const auto [entry, count] = lastCount(key);
  if (entry == 0) return std::nullopt;
  return std::to_string(count);
}

std::pair<int64_t, int64_t> FileStore::lastCount(const std::string& key) {
  int64_t& seen = last_entry_[key];
  struct stat st {};
  while (::stat(fileOf(key, "+" + std::to_string(seen + 1)).c_str(), &st) == 0) ++seen;
  if (seen == 0) return {0, 0};
  const std::string path = fileOf(key, "+" + std::to_string(seen));
  const auto text = readValue(path, directory_);
  TILER_CHECK(
      text.has_value(), DistError,
      "rendezvous directory " << directory_ << ": " << path << " went away (removed by another run?)");
  return {seen, parseStoreInteger(*text, key, directory_)};
}

int64_t FileStore::add(const std::string& key, int64_t delta, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto [entry, count] = lastCount(key);
    struct stat st {};
    TILER_CHECK(entry > 0 || ::stat(fileOf(key, "=").c_str(), &st) != 0, DistError,
                "rendezvous directory " << directory_ << ": '" << key << "' holds a value set, not a count");
    if (delta == 0) return count;
    const int64_t sum = count + delta;
    const std::string next = fileOf(key, "+" + std::to_string(entry + 1));
    const std::string temporary = writeTemporary(std::to_string(sum));
    const bool linked = ::link(temporary.c_str(), next.c_str()) == 0;
    const int err = errno;
    // Over NFS a link whose reply was lost is sent again and fails with EEXIST though it was made: then the
    // temporary file has two names.
    const bool made = linked || (err == EEXIST && ::stat(temporary.c_str(), &st) == 0 && st.st_nlink == 2);
    ::unlink(temporary.c_str());
    if (made) {
      last_entry_[key] = entry + 1;
      return sum;
    }
    TILER_CHECK(
        err == EEXIST, DistError,
        "rendezvous directory " << directory_ << ": cannot add to '" << key << "': " << std::strerror(err));
    TILER_CHECK(Clock::now() < deadline, TimeoutError,
                "rendezvous directory " << directory_ << ": adding to '" << key
                                        << "' lost to other clients for " << timeout.count() / 1000.0
                                        << " s");
  }
}

void FileStore::removeKeys(const std::string& prefix) {
  DIR* dir = ::opendir(directory_.c_str());
  TILER_CHECK(dir != nullptr, DistError,
              "rendezvous directory " << directory_ << ": cannot list it: " << std::strerror(errno));
  std::vector<std::string> doomed;
  while (const dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    const size_t end = name.find_last_of("=+");
    if (name.empty() || name[0] == '.' || end == std::string::npos) continue;
    const auto key = unescapeKey(name.substr(0, end));
    if (key && key->rfind(prefix, 0) == 0) doomed.push_back(name);
  }
  ::closedir(dir);
  for (const auto& name : doomed) {
    const std::string path = directory_ + "/" + name;
    TILER_CHECK(
        ::unlink(path.c_str()) == 0 || errno == ENOENT, DistError,
        "rendezvous directory " << directory_ << ": cannot remove " << path << ": " << std::strerror(errno));
  }
  for (auto it = last_entry_.begin(); it != last_entry_.end();)
    it = it->first.rfind(prefix, 0) == 0 ? last_entry_.erase(it) : std::next(it);
}

}  // namespace tiler
