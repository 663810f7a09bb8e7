// block_cache: LibTorch's CPU allocator for tensors of 1 MiB and more, mapped blocks reused by size (huge
// pages from 2 MiB), so a forward's activations are not mapped and faulted in again on every batch. Promise:
// the bytes computed are the same with or without it; free blocks are kept up to twice the most ever in use.
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace tiler {

// LibTorch's CPU allocator for tiler's processes: tensors of kMinBlockBytes and more come from mapped blocks
// that are kept for reuse (at most as many bytes as were ever live at once, or `min_cached_bytes`), smaller
// ones from LibTorch's default allocator. A forward then reuses the last forward's blocks without faulting
// their pages in again, and no heap high-water mark stays resident. Thread safe.
class LargeBlockCache final : public c10::Allocator {
 public:
  static constexpr size_t kMinBlockBytes = 1 << 20;
  explicit LargeBlockCache(size_t min_cached_bytes);
  ~LargeBlockCache() override;
  // The process's cache, the one installLargeBlockCache() installs.
  static LargeBlockCache& instance();

  // LibTorch 1.13 declares allocate() const, 2.x not: one of the two overrides, the other is never called.
  c10::DataPtr allocate(size_t n) const { return take(n); }
  c10::DataPtr allocate(size_t n) { return take(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &LargeBlockCache::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const;  // virtual in LibTorch 2.x
  // Bytes held in free blocks.
  size_t cachedBytes() const;
  // Block size for a request of `n` bytes (64 KiB granules).
  static size_t blockSize(size_t n);

 private:
  c10::DataPtr take(size_t n) const;
  void markInUse(void* block, size_t size) const;  // caller holds mutex_
  static void release(void* block);                // the blocks of instance() only
  void give(void* block) const;

  c10::Allocator* fallback_;  // LibTorch's default CPU allocator (not owned)
  size_t min_cached_bytes_;
  mutable std::mutex mutex_;
  struct FreeBlock {
    void* block;
    uint64_t freed;  // order of freeing, for eviction
  };
  mutable std::multimap<size_t, FreeBlock> free_;  // size -> block, guarded by mutex_
  mutable uint64_t frees_ = 0;                     // guarded by mutex_
  mutable std::map<void*, size_t> live_;           // block -> size, guarded by mutex_
  mutable size_t cached_bytes_ = 0, in_use_bytes_ = 0, peak_in_use_bytes_ = 0;  // guarded by mutex_
};

// Installs LargeBlockCache as LibTorch's CPU allocator and gives glibc one arena (unless GLIBC_TUNABLES is
// set), once per process. ModelRunner calls it; infer and finetune call it first, before threads make arenas.
void installLargeBlockCache();

}  // namespace tiler
