#include "tiler/model/block_cache.hpp"

#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>

namespace tiler {
namespace {

// Maps a block of `size` bytes; blocks of 2 MiB and more start on a 2 MiB boundary and are advised to be
// backed by transparent huge pages, so that a forward's first run faults its activations in 512 times
// fewer page faults (docs/performance.md has the sample UNet job's count). A kernel without them ignores the
// advice; the bytes computed are the same either way.
void* mapBlock(size_t size) {
  constexpr size_t kHugePage = 2 << 20;
  if (size < kHugePage)
    return mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return raw;
  const uintptr_t start = (uintptr_t(raw) + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  const size_t head = start - uintptr_t(raw);  // < kHugePage: the tail below is never empty
  if (head > 0) munmap(raw, head);
  munmap(reinterpret_cast<char*>(start) + size, kHugePage - head);
  madvise(reinterpret_cast<void*>(start), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(start);
}

}  // namespace

LargeBlockCache::LargeBlockCache(size_t min_cached_bytes)
    : fallback_(c10::GetDefaultCPUAllocator()), min_cached_bytes_(min_cached_bytes) {}

LargeBlockCache::~LargeBlockCache() {
  for (const auto& [size, entry] : free_) munmap(entry.block, size);
}

size_t LargeBlockCache::blockSize(size_t n) {
  constexpr size_t kGranule = 64 << 10;
  return (n + kGranule - 1) / kGranule * kGranule;
}

c10::DataPtr LargeBlockCache::take(size_t n) const {
  if (n < kMinBlockBytes) return fallback_->allocate(n);
  const size_t size = blockSize(n);
  void* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The smallest free block that fits, at most twice the size (pages a tensor does not touch cost nothing);
    // of blocks that size, the last freed (its pages likeliest still in the CPU's caches).
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      it = std::prev(free_.upper_bound(it->first));
      block = it->second.block;
      cached_bytes_ -= it->first;
      markInUse(block, it->first);
      free_.erase(it);
    }
  }
  if (block == nullptr) {
    block = mapBlock(size);
    if (block == MAP_FAILED) {
      // As LibTorch's own CPU allocator says it, so that the forward's out-of-memory halving applies.
      TORCH_CHECK_WITH(OutOfMemoryError, false,
                       "DefaultCPUAllocator: not enough memory: you tried to allocate ", n, " bytes.");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    markInUse(block, size);
  }
  return {block, block, &LargeBlockCache::release, c10::Device(c10::DeviceType::CPU)};
}

void LargeBlockCache::markInUse(void* block, size_t size) const {
  live_[block] = size;
  in_use_bytes_ += size;
  peak_in_use_bytes_ = std::max(peak_in_use_bytes_, in_use_bytes_);
}

void LargeBlockCache::release(void* block) {
  instance().give(block);
}

void LargeBlockCache::give(void* block) const {
  std::vector<std::pair<size_t, void*>> unmap;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(block);
    if (it == live_.end()) {
      // A small block that raw_allocate() took from the default allocator.
      fallback_->raw_deleter()(block);
      return;
    }
    free_.emplace(it->second, FreeBlock{block, ++frees_});
    cached_bytes_ += it->second;
    in_use_bytes_ -= it->second;
    live_.erase(it);
    // Free blocks are kept up to the most ever in use at once: a forward reuses the last forward's blocks;
    // beyond that the least recently freed go back to the system.
    const size_t keep = std::max(min_cached_bytes_, 2 * peak_in_use_bytes_);
    while (cached_bytes_ > keep) {
      auto oldest = std::min_element(free_.begin(), free_.end(), [](const auto& a, const auto& b) {
        return a.second.freed < b.second.freed;
      });
      unmap.emplace_back(oldest->first, oldest->second.block);
      cached_bytes_ -= oldest->first;
      free_.erase(oldest);
    }
  }
  for (const auto& [size, b] : unmap) munmap(b, size);
}

void LargeBlockCache::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

size_t LargeBlockCache::cachedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

LargeBlockCache& LargeBlockCache::instance() {
  static LargeBlockCache* cache =
      new LargeBlockCache(256 << 20);  // never destroyed: tensors may outlive main
  return *cache;
}

// LibTorch's CPU allocator takes every tensor from malloc. Large activations (33 MB at batch 8) sit above
// glibc's mmap threshold: every forward would map and unmap them and fault their pages in again, which
// doubles the forward time of a small UNet (README, Performance). Raising glibc's thresholds kept them in the
// heap but made the heap's high-water mark (and its holes) resident for good: peak RSS 1.3-1.4 GB at 16384 px
// for 350 MB ever live (heaptrack). Tensors of 1 MiB and more now come from LargeBlockCache instead; glibc
// keeps its own thresholds for the rest, with one arena, so that every thread reuses what the others freed.
void installLargeBlockCache() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::SetCPUAllocator(&LargeBlockCache::instance(), /*priority=*/1);
    if (std::getenv("GLIBC_TUNABLES") == nullptr) mallopt(M_ARENA_MAX, 1);
  });
}

}  // namespace tiler
