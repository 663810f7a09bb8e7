#include "tiler/core/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

std::vector<int64_t> indices(const std::vector<SampleSlot>& slots) {
  std::vector<int64_t> out;
  for (auto& s : slots) out.push_back(s.index);
  return out;
}

TEST(Sampler, StridedShardsPaddedWithTheHead) {
  // torch DistributedSampler(10 items, 3 replicas, shuffle=False)
  SamplerOptions o;
  o.world_size = 3;
  o.rank = 0;
  EXPECT_EQ(indices(DistributedSampler(10, o).slots()), (std::vector<int64_t>{0, 3, 6, 9}));
  o.rank = 1;
  auto r1 = DistributedSampler(10, o).slots();
  EXPECT_EQ(indices(r1), (std::vector<int64_t>{1, 4, 7, 0}));
  EXPECT_TRUE(r1[3].padded);
  EXPECT_FALSE(r1[2].padded);
  o.rank = 2;
  EXPECT_EQ(indices(DistributedSampler(10, o).slots()), (std::vector<int64_t>{2, 5, 8, 1}));
}

TEST(Sampler, DropLastTruncates) {
  SamplerOptions o;
  o.world_size = 3;
  o.drop_last = true;
  o.rank = 2;
  DistributedSampler s(10, o);
  EXPECT_EQ(s.perRank(), 3);
  EXPECT_EQ(indices(s.slots()), (std::vector<int64_t>{2, 5, 8}));
}

class SamplerWorlds : public ::testing::TestWithParam<int> {};

TEST_P(SamplerWorlds, EveryItemExactlyOnceAmongUnpaddedSlots) {
  const int world = GetParam();
  for (int64_t total : {0, 1, 7, 64, 101})
    for (bool shuffle : {false, true}) {
      std::multiset<int64_t> seen;
      size_t per_rank = 0;
      for (int r = 0; r < world; ++r) {
        SamplerOptions o{world, r, shuffle, 42, false};
        auto slots = DistributedSampler(total, o).slots(3);
        if (r == 0) per_rank = slots.size();
        EXPECT_EQ(slots.size(), per_rank) << "same step count on every rank";
        for (auto& s : slots)
          if (!s.padded) seen.insert(s.index);
      }
      EXPECT_EQ(seen.size(), size_t(total));
      for (int64_t i = 0; i < total; ++i) EXPECT_EQ(seen.count(i), 1u);
    }
}

// Row lengths of the deal tests: empty and one-window rows, a 43 x 43 grid, masked rows of any length.
std::vector<std::vector<int64_t>> dealCases() {
  std::vector<std::vector<int64_t>> cases = {
      {}, {0}, {1}, {1, 0, 1, 1}, {5, 3}, {7}, std::vector<int64_t>(43, 43)};
  std::vector<int64_t> masked;
  for (int64_t i = 0; i < 60; ++i) masked.push_back((i * 37) % 23);
  cases.push_back(masked);
  return cases;
}

int64_t sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t(0));
}

TEST_P(SamplerWorlds, DealsEveryWindowOnceAndEveryRankTheSameCount) {
  const int world = GetParam();
  for (const auto& rows : dealCases())
    for (int64_t piece : {int64_t(1), int64_t(2), int64_t(5), int64_t(16), int64_t(1) << 40}) {
      std::multiset<int64_t> seen;
      for (int r = 0; r < world; ++r) {
        auto deal = dealRows(rows, world, r, piece);
        EXPECT_EQ(int64_t(deal.slots.size()), (sum(rows) + world - 1) / world)
            << "same step count on every rank";
        int64_t last = -1;
        for (auto& s : deal.slots) {
          if (s.padded) continue;
          EXPECT_GT(s.index, last) << "each rank's windows in global order";
          last = s.index;
          seen.insert(s.index);
        }
      }
      ASSERT_EQ(int64_t(seen.size()), sum(rows)) << "piece " << piece;
      for (int64_t i = 0; i < sum(rows); ++i) EXPECT_EQ(seen.count(i), 1u);
    }
}

// Rank 0 stitches in global order: the windows other ranks hand in before their turn stay within
// --shard_buffer's windows (at least a batch a rank, the step's own), whatever the rows look like.
TEST_P(SamplerWorlds, EarlyWindowsAtRankZeroStayWithinTheBudget) {
  const int world = GetParam();
  for (const auto& rows : dealCases())
    for (int64_t batch : {int64_t(1), int64_t(4), int64_t(8)})
      for (int64_t early : {int64_t(0), int64_t(5), int64_t(64), int64_t(500)}) {
        std::vector<std::vector<SampleSlot>> slots;
        for (int r = 0; r < world; ++r)
          slots.push_back(dealRows(rows, world, r, maxPiece(world, batch, early)).slots);
        std::vector<bool> arrived(size_t(sum(rows)), false);
        int64_t next = 0, held = 0, most = 0;
        for (size_t first = 0; first < slots[0].size(); first += size_t(batch)) {
          for (const auto& rank : slots)
            for (size_t k = first; k < std::min(rank.size(), first + size_t(batch)); ++k)
              if (!rank[k].padded) arrived[size_t(rank[k].index)] = true, ++held;
          while (next < int64_t(arrived.size()) && arrived[size_t(next)]) ++next, --held;
          most = std::max(most, held);
        }
        EXPECT_EQ(held, 0);
        EXPECT_LE(most, std::max(early, (world - 1) * batch) + world - 1)
            << world << " ranks, batch " << batch << ", " << early << " early windows, " << rows.size()
            << " rows";
      }
}

// Two ranks and rows that fit: each rank takes one contiguous part of every row, rank 0 the first, the
// extra window going to whichever rank has fewer so far.
TEST(Sampler, RowsAreDealtInContiguousPartsRankZeroFirst) {
  const int64_t whole = 9;  // rows of 5 and 3 fit, and are not short (3 x 3 and 5 x 5 are not under 9)
  auto r0 = dealRows({5, 3}, 2, 0, whole), r1 = dealRows({5, 3}, 2, 1, whole);
  EXPECT_EQ(indices(r0.slots), (std::vector<int64_t>{0, 1, 2, 5}));
  EXPECT_EQ(indices(r1.slots), (std::vector<int64_t>{3, 4, 6, 7}));
  EXPECT_EQ(r0.longest_part, 3);
  EXPECT_EQ(r1.longest_part, 3) << "the same on every rank";
  // A row of 10 in pieces of at most 4: 3, 3, 4.
  EXPECT_EQ(indices(dealRows({10}, 2, 0, 4).slots), (std::vector<int64_t>{0, 1, 3, 6, 7}));
  EXPECT_EQ(indices(dealRows({10}, 2, 1, 4).slots), (std::vector<int64_t>{2, 4, 5, 8, 9}));
  auto padded = dealRows({3}, 2, 1, whole);
  ASSERT_EQ(padded.slots.size(), 2u);
  EXPECT_TRUE(padded.slots[1].padded);
  EXPECT_EQ(dealRows({43}, 1, 0, maxPiece(1, 8, 0)).longest_part, 43) << "one rank: rows whole";
}

// Rows of a few windows (a narrow image, tissue under a mask) split between the ranks would hand the ranks
// alternate rows or columns, which share input tiles; they are stacked into pieces of whole rows instead.
TEST(Sampler, ShortRowsAreStackedIntoPieces) {
  const std::vector<int64_t> narrow(20, 1);
  EXPECT_EQ(indices(dealRows(narrow, 2, 0, 16).slots),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 16, 17}));
  EXPECT_EQ(indices(dealRows(narrow, 2, 1, 16).slots),
            (std::vector<int64_t>{8, 9, 10, 11, 12, 13, 14, 15, 18, 19}));
  // 4 x 4 = 16 is not under 16: rows of 4 are split; rows of 3 (9 < 16) are stacked, 5 to a piece of 15.
  EXPECT_EQ(indices(dealRows({4, 4}, 2, 0, 16).slots), (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(indices(dealRows(std::vector<int64_t>(6, 3), 2, 0, 16).slots),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 15}));
  // A long row between short ones is split alone; the short rows after it start a new stack.
  EXPECT_EQ(indices(dealRows({1, 1, 20, 1, 1}, 2, 1, 16).slots),
            (std::vector<int64_t>{1, 7, 8, 9, 10, 11, 17, 18, 19, 20, 21, 23}));
  EXPECT_EQ(dealRows(narrow, 1, 0, maxPiece(1, 8, 0)).longest_part, 20) << "one rank: everything in a row";
}

// The 8192 px job of the ceiling bench: 43 rows of 43 windows; with the default 64 MiB (128 windows of
// 2 x 256 x 256 floats) every rank's part of every row is one run, so ranks share input tiles only where
// their parts meet.
TEST(Sampler, DefaultBufferKeepsEachRanksPartOfARowInOneRun) {
  const std::vector<int64_t> rows(43, 43);
  for (int world : {2, 3, 4}) {
    const int64_t piece = maxPiece(world, 8, 128);
    EXPECT_GE(piece, 43) << world << " ranks";
    for (int r = 0; r < world; ++r) {
      auto deal = dealRows(rows, world, r, piece);
      int64_t runs = 0, last = -2;
      for (auto& s : deal.slots) {
        if (s.padded) continue;
        runs += s.index != last + 1;
        last = s.index;
      }
      EXPECT_EQ(runs, 43) << world << " ranks, rank " << r << ": one run a row";
    }
  }
  EXPECT_EQ(maxPiece(2, 8, 0), 16) << "no buffer: a batch a rank";
  EXPECT_EQ(maxPiece(4, 8, 300), 400);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SamplerWorlds, ::testing::Values(1, 2, 3, 4, 8));

// Output owners: longest first to the least loaded rank, so that 8 equal images on 2 ranks are 4 and 4,
// and one huge image keeps a rank to itself while the others share the rest.
TEST(Sampler, OwnersBalanceTheWindowsEachRankWrites) {
  EXPECT_EQ(assignOwners({5, 5, 5, 5, 5, 5, 5, 5}, 2), (std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(assignOwners({1, 100, 2, 3}, 2), (std::vector<int>{1, 0, 1, 1}));
  EXPECT_EQ(assignOwners({4, 3, 3}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(assignOwners({7, 1, 1}, 3), (std::vector<int>{0, 1, 2})) << "light images spread too";
  EXPECT_TRUE(assignOwners({}, 4).empty());
  // Random weights on 3 ranks: no rank carries more than the least plus the largest image.
  std::mt19937_64 rng(5);
  std::vector<int64_t> weights(40);
  for (auto& w : weights) w = int64_t(rng() % 1000);
  const auto owners = assignOwners(weights, 3);
  std::vector<int64_t> load(3, 0);
  for (size_t i = 0; i < weights.size(); ++i) load[size_t(owners[i])] += weights[i];
  EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()),
            *std::max_element(weights.begin(), weights.end()));
}

TEST(Sampler, ShuffleIsSeededBySeedPlusEpoch) {
  SamplerOptions o{1, 0, true, 7, false};
  DistributedSampler s(50, o);
  EXPECT_EQ(s.order(0), s.order(0));
  EXPECT_NE(s.order(0), s.order(1));
  SamplerOptions o2{1, 0, true, 8, false};
  EXPECT_EQ(DistributedSampler(50, o2).order(0), s.order(1)) << "seed 8 epoch 0 == seed 7 epoch 1";
  auto sorted = s.order(2);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[size_t(i)], i);
}

TEST(Sampler, RejectsRankOutsideWorld) {
  EXPECT_THROW(DistributedSampler(10, SamplerOptions{2, 2, false, 0, false}), ConfigError);
}

}  // namespace
}  // namespace tiler
