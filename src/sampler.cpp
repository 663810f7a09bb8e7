#include "tiler/sampler.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "tiler/error.hpp"

namespace tiler {

DistributedSampler::DistributedSampler(int64_t total, SamplerOptions options)
    : total_(total), options_(options) {
  TILER_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size, ConfigError,
              "sampler: rank " << options.rank << " outside world of " << options.world_size);
  TILER_CHECK(total >= 0, ConfigError, "sampler: negative item count");
  TILER_CHECK(options.block >= 1, ConfigError, "sampler: block must be >= 1");
  const int64_t run = options.block * options.world_size;  // items per step across the world
  per_rank_ = (options.drop_last ? total / run : (total + run - 1) / run) * options.block;
}

int64_t shardRun(int64_t total, int world_size, int64_t batch, int64_t max_run) {
  TILER_CHECK(batch >= 1 && world_size >= 1, ConfigError, "shardRun: batch and world size must be >= 1");
  if (world_size == 1 || total <= 0) return batch;
  auto ceilDiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t longest = std::max(batch, max_run / batch * batch);
  const int64_t rounds = ceilDiv(total, int64_t(world_size) * longest);
  return ceilDiv(ceilDiv(total, int64_t(world_size) * rounds), batch) * batch;
}

std::vector<int64_t> DistributedSampler::order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(total_));
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {
    // Our own Fisher-Yates over mt19937_64: std::shuffle's algorithm is not specified by the standard,
    // and every rank (and every build) must agree on the permutation.
    std::mt19937_64 rng(options_.seed + uint64_t(epoch));
    for (int64_t i = total_ - 1; i > 0; --i) {
      auto j = int64_t(rng() % uint64_t(i + 1));
      std::swap(order[size_t(i)], order[size_t(j)]);
    }
  }
  return order;
}

std::vector<SampleSlot> DistributedSampler::slots(int64_t epoch) const {
  std::vector<int64_t> base = order(epoch);
  std::vector<SampleSlot> out;
  out.reserve(size_t(per_rank_));
  const int64_t B = options_.block, N = options_.world_size;
  for (int64_t k = 0; k < per_rank_; ++k) {
    // The k-th item of this rank: step k / B, offset k % B in its run (B = 1: positions r, r+N, ...).
    const int64_t pos = (k / B) * B * N + options_.rank * B + k % B;
    if (pos < total_) {
      out.push_back({base[size_t(pos)], false});
    } else {
      out.push_back({base[size_t((pos - total_) % std::max<int64_t>(total_, 1))], true});
    }
  }
  return out;
}

}  // namespace tiler
