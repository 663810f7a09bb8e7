// sampler: how a global list of items is shared between ranks. Identical on every rank; no LibTorch.
// Promise (training, DistributedSampler): torch.utils.data.DistributedSampler's semantics: rank r of N takes
// positions r, r+N, r+2N, ... of the (optionally shuffled) order, padded by repeating its head so that every
// rank gets the same count (or truncated with drop_last).
// Promise (inference, dealRows): every rank takes contiguous parts of each grid row of windows, so that
// neighbouring windows, which share input tiles, stay on one rank, while an image's owner, which stitches in
// global order, holds a bounded number of windows that arrive before their turn.
// Padded slots are flagged so that nothing downstream uses a duplicate twice.
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
};

struct SampleSlot {
  int64_t index = -1;   // global item index
  bool padded = false;  // a repeat added to even out ranks: never stitched
};

// Inference's deal. `rows`: the lengths of the consecutive stretches of the global window list that lie in
// one grid row of one image, in order (they sum to the total). Each row is cut into near-equal pieces of at
// most `max_piece` windows (short rows, L * L < max_piece, are stacked into pieces of several rows instead),
// and each piece is split between the ranks in contiguous parts, rank 0's first,
// so that every rank's count so far stays within one of every other's: the ranks reach the same piece at
// the same step, decode twice only the input tiles where their parts meet, and an image's owner holds at most
// the other ranks' parts of the piece it is in (plus one window each) before their turn.
struct RowDeal {
  std::vector<SampleSlot> slots;  // this rank's, in global order; ceil(total / world_size), padded at the end
  int64_t longest_part = 0;       // the most windows one rank takes in a row (consecutively), over every rank
};
RowDeal dealRows(const std::vector<int64_t>& rows, int world_size, int rank, int64_t max_piece);
// The longest piece for which an owner holds at most `early_windows` windows before their turn, but never
// under one batch a rank (the memory of a step's gather); one rank: no limit (nothing arrives early).
int64_t maxPiece(int world_size, int64_t batch, int64_t early_windows);

// Output owners (inference): image i is stitched and written by rank owners[i]. Longest first: images by
// weight (their windows; ties by index), each to the rank with the least weight so far (ties: the lowest),
// so that the ranks write near-equal shares. Identical on every rank.
std::vector<int> assignOwners(const std::vector<int64_t>& weights, int world_size);

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
