// handle_pool: the open handles of one file that reading threads share. A thread leases a handle of its own
// for a read (an idle one, or one opened for it), and the lease gives it back; the pool closes them all at
// the end. For libraries whose handles keep per-call state and serialise their calls (libtiff's codec
// state, OpenSlide's reads), so that N threads read one file side by side on at most N handles.
// Promise: a handle is used by one lease at a time; one a lease discards (left unusable by an error) is
// closed, never handed out again. Thread safe. No LibTorch.
#pragma once

#include <mutex>
#include <utility>
#include <vector>

namespace tiler {

template <typename Handle>
class HandlePool {
 public:
  using Close = void (*)(Handle*);
  explicit HandlePool(Close close) : close_(close) {}
  ~HandlePool() {
    for (Handle* h : idle_) close_(h);
  }
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;

  // Adds an open handle (the one a reader read the header with) to the idle ones; the pool owns it.
  void adopt(Handle* h) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(h);
  }

  class Lease {
   public:
    // An idle handle, or `open()`'s (which may throw: then nothing is leased).
    template <typename Open>
    Lease(HandlePool& pool, Open&& open) : pool_(pool), handle_(pool.takeIdle()) {
      if (handle_ == nullptr) handle_ = std::forward<Open>(open)();
    }
    ~Lease() {
      if (handle_ != nullptr) pool_.adopt(handle_);
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Handle* get() const { return handle_; }
    // Closes the handle instead of giving it back.
    void discard() {
      pool_.close_(handle_);
      handle_ = nullptr;
    }

   private:
    HandlePool& pool_;
    Handle* handle_;
  };

 private:
  Handle* takeIdle() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.empty()) return nullptr;
    Handle* h = idle_.back();
    idle_.pop_back();
    return h;
  }

  Close close_;
  std::mutex mutex_;
  std::vector<Handle*> idle_;  // owned, not leased; guarded by mutex_
};

}  // namespace tiler
