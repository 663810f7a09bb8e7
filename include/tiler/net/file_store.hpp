// file_store: the Store (store.hpp) as files in a directory every node sees (a shared or network file
// system), so that nodes meet with no agent hosting anything: ctrun's `file` rendezvous. Each key is a file
// named after it (bytes other than [A-Za-z0-9_.-] escaped as %XX): a set value in
// `<key>=`, written to a temporary file and renamed over it, so a reader sees the old value or the new one,
// whole; a counter is a log `<key>+1`, `<key>+2`, ..., each file the sum after one add, created with link(),
// which fails when another client made that entry first (the add is then retried on the new sum). It relies
// on rename and link being atomic and on close-to-open consistency, as NFS gives them, and on no lock: NFS
// clients may cache a directory's listing for their attribute-cache time (acdirmin, 30 s by default), so a
// key may take that long to appear on another node (mount with actimeo=1, or allow for it in the timeouts).
// Temporary files start with '.' and never collide between clients (host, process, store, a counter).
// Removing a run's keys (`removeKeys`) is the last leaver's job; a killed run leaves its files (use a new run
// id or directory). Promise (store.hpp's): add's retries and wait's polls are bounded by their timeouts; a
// file system call that blocks (a hard-mounted server gone) is not. Values are bounded (kMaxValueBytes);
// DistError names the directory. No LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "tiler/net/store.hpp"

namespace tiler {

class FileStore : public Store {
 public:
  static constexpr size_t kMaxValueBytes = size_t(1) << 20;
  // Opens the store in `directory`, made (with its parents) when missing; DistError when it cannot be.
  explicit FileStore(std::string directory);

  void set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) override;
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta, std::chrono::milliseconds timeout) override;
  const std::string& endpoint() const override { return directory_; }
  // Removes every key that starts with `prefix`; DistError when one cannot be.
  void removeKeys(const std::string& prefix);

 private:
  // The file name of `key` with `suffix`; DistError when the key is too long for one.
  std::string fileOf(const std::string& key, const std::string& suffix) const;
  // The counter's last entry (0 when none) and its value, from the last one this client saw on.
  std::pair<int64_t, int64_t> lastCount(const std::string& key);
  // A new temporary file holding `value`; its path.
  std::string writeTemporary(const std::string& value);

  std::string directory_;
  std::map<std::string, int64_t> last_entry_;  // per counter: its entries seen (only removeKeys removes any)
  uint64_t temporaries_ = 0;
};

}  // namespace tiler
