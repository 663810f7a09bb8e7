#include "tiler/core/sampler.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "tiler/core/error.hpp"

namespace tiler {

DistributedSampler::DistributedSampler(int64_t total, SamplerOptions options)
    : total_(total), options_(options) {
  TILER_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size, ConfigError,
              "sampler: rank " << options.rank << " outside world of " << options.world_size);
  TILER_CHECK(total >= 0, ConfigError, "sampler: negative item count");
  const int64_t N = options.world_size;
  per_rank_ = options.drop_last ? total / N : (total + N - 1) / N;
}

namespace {
int64_t ceilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
}  // namespace

RowDeal dealRows(const std::vector<int64_t>& rows, int world_size, int rank, int64_t max_piece) {
  TILER_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ConfigError,
              "sampler: rank " << rank << " outside world of " << world_size);
  TILER_CHECK(max_piece >= 1, ConfigError, "sampler: pieces must hold at least one window");
  const int64_t N = world_size;
  // Rank q's share of the first x items: rank 0 takes the first extra one, so counts never differ by more
  // than one.
  auto share = [N](int64_t q, int64_t x) { return (x + N - 1 - q) / N; };
  // Split between the ranks, a row of L windows has N-1 seams one window high, where the ranks decode the
  // tiles they share; consecutive rows stacked into a piece of up to max_piece windows have N-1 seams L
  // windows wide per max_piece / L rows. Rows with L * L < max_piece (narrow images, masked tissue) are
  // stacked: fewer shared tiles.
  std::vector<int64_t> stretches;
  bool stacking = false;  // the last stretch is of stacked short rows
  for (const int64_t row : rows) {
    TILER_CHECK(row >= 0, ConfigError, "sampler: negative row length");
    if (row == 0) continue;
    const bool short_row = row <= (max_piece - 1) / row;  // L * L < max_piece, without overflow
    if (short_row && stacking && stretches.back() <= max_piece - row)
      stretches.back() += row;
    else
      stretches.push_back(row);
    stacking = short_row;
  }
  RowDeal deal;
  int64_t at = 0;  // global position of the piece
  for (const int64_t stretch : stretches) {
    const int64_t pieces = 1 + (stretch - 1) / max_piece;  // max_piece may be the largest int64
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t length = stretch * (p + 1) / pieces - stretch * p / pieces;
      int64_t start = at;
      for (int64_t q = 0; q < N; ++q) {
        const int64_t part = share(q, at + length) - share(q, at);
        deal.longest_part = std::max(deal.longest_part, part);
        if (q == rank)
          for (int64_t i = 0; i < part; ++i) deal.slots.push_back({start + i, false});
        start += part;
      }
      at += length;
    }
  }
  // Equal counts on every rank: the ranks with one window fewer take a padded slot.
  while (int64_t(deal.slots.size()) < ceilDiv(at, N)) deal.slots.push_back({0, true});
  return deal;
}

int64_t maxPiece(int world_size, int64_t batch, int64_t early_windows) {
  if (world_size == 1) return std::numeric_limits<int64_t>::max();
  const int64_t N = world_size;
  // Rank 0's part of a piece comes first, so the others' parts of it (N-1 of N) arrive before their turn.
  return std::max(N * batch, early_windows / (N - 1) * N);
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
  const int64_t N = options_.world_size;
  for (int64_t k = 0; k < per_rank_; ++k) {
    const int64_t pos = k * N + options_.rank;
    if (pos < total_) {
      out.push_back({base[size_t(pos)], false});
    } else {
      out.push_back({base[size_t((pos - total_) % std::max<int64_t>(total_, 1))], true});
    }
  }
  return out;
}

std::vector<int> assignOwners(const std::vector<int64_t>& weights, int world_size) {
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weights[a] > weights[b]; });
  std::vector<int64_t> load(size_t(std::max(world_size, 1)), 0);
  std::vector<int> owners(weights.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // the first of equals: the lowest rank
    owners[i] = int(least - load.begin());
    *least += weights[i];
  }
  return owners;
}

}  // namespace tiler
