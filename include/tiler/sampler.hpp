// sampler: torch.utils.data.DistributedSampler semantics over a global list of `total` items.
// Promise: rank r of N takes positions r, r+N, r+2N, ... of the (optionally shuffled) order; with block B > 1
// it takes contiguous runs instead: step s (B items) is positions [sBN + rB, sBN + (r+1)B), so neighbouring
// items stay on one rank (inference: windows that share input tiles). The order is padded by repeating its
// head so every rank gets the same count (or truncated with drop_last). Padded slots are flagged so that
// nothing downstream uses a duplicate twice. Identical on every rank; no LibTorch.
#pragma once

#include <cstdint>
#include <vector>

namespace tiler {

struct SamplerOptions {
  int world_size = 1;
  int rank = 0;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  int64_t block = 1;  // items a rank takes in a row (inference: shardRun)
};

// Inference's run: the windows each rank takes in a row, a whole number of batches. One rank: one batch.
// More ranks: the fewest rounds of runs of at most `max_run` windows that cover `total`, split evenly (few
// padded slots, the ranks' shares within a batch of each other per round). Ranks decode the input tiles
// their runs share at the runs' ends only, and rank 0 holds the windows that arrive before their turn: up
// to (world_size - 1) runs of them.
int64_t shardRun(int64_t total, int world_size, int64_t batch, int64_t max_run);

struct SampleSlot {
  int64_t index = -1;   // global item index
  bool padded = false;  // a repeat added to even out ranks: never stitched
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t total, SamplerOptions options);
  // Items per rank.
  int64_t perRank() const { return per_rank_; }
  // This rank's slots for an epoch (the epoch seeds the shuffle as seed + epoch).
  std::vector<SampleSlot> slots(int64_t epoch = 0) const;
  // The global order for an epoch before sharding (shuffled when asked), for tests and planning.
  std::vector<int64_t> order(int64_t epoch = 0) const;

 private:
  int64_t total_;
  SamplerOptions options_;
  int64_t per_rank_;
};

}  // namespace tiler
