#include "tiler/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tiler/error.hpp"

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
    for (bool shuffle : {false, true})
      for (int64_t block : {1, 3, 8}) {
        std::multiset<int64_t> seen;
        size_t per_rank = 0;
        for (int r = 0; r < world; ++r) {
          SamplerOptions o{world, r, shuffle, 42, false, block};
          auto slots = DistributedSampler(total, o).slots(3);
          if (r == 0) per_rank = slots.size();
          EXPECT_EQ(slots.size(), per_rank) << "same step count on every rank";
          for (auto& s : slots)
            if (!s.padded) seen.insert(s.index);
        }
        EXPECT_EQ(seen.size(), size_t(total)) << "block " << block;
        for (int64_t i = 0; i < total; ++i) EXPECT_EQ(seen.count(i), 1u);
        EXPECT_EQ(per_rank % size_t(block), 0u) << "whole steps of `block` on every rank";
      }
}

// Inference's steps: step s hands rank r the run [sBN + rB, sBN + (r+1)B) of the global window list.
TEST(Sampler, BlocksAreContiguousRunsPerStep) {
  SamplerOptions o;
  o.world_size = 2;
  o.block = 3;
  o.rank = 0;
  EXPECT_EQ(indices(DistributedSampler(10, o).slots()), (std::vector<int64_t>{0, 1, 2, 6, 7, 8}));
  o.rank = 1;
  auto r1 = DistributedSampler(10, o).slots();
  EXPECT_EQ(indices(r1), (std::vector<int64_t>{3, 4, 5, 9, 0, 1}));
  EXPECT_FALSE(r1[3].padded);
  EXPECT_TRUE(r1[4].padded);
  EXPECT_TRUE(r1[5].padded);
}

// Runs as long as rank 0's buffer allows, in whole batches, split evenly: few padded slots, no rank idle.
TEST(Sampler, ShardRunsAreWholeBatchesSplitEvenlyWithinTheLongestRun) {
  EXPECT_EQ(shardRun(1849, 1, 8, 1 << 20), 8) << "one rank: one batch, the bytes of every earlier version";
  EXPECT_EQ(shardRun(1849, 2, 8, 512), 464) << "two rounds of 464: 7 padded slots, not 175 of 2 x 512";
  EXPECT_EQ(shardRun(1849, 2, 8, 0), 8) << "no buffer: one batch per step, as before";
  EXPECT_EQ(shardRun(0, 4, 8, 512), 8);
  for (int64_t total : {1, 7, 100, 441, 1849, 7225})
    for (int world : {2, 3, 4, 8})
      for (int64_t batch : {1, 4, 8, 16})
        for (int64_t max_run : {0, 5, 64, 512, 100000}) {
          const int64_t run = shardRun(total, world, batch, max_run);
          const std::string where = std::to_string(total) + " windows, " + std::to_string(world) +
                                    " ranks, batch " + std::to_string(batch) +
                                    ", run <= " + std::to_string(max_run) + ": " + std::to_string(run);
          EXPECT_EQ(run % batch, 0) << where;
          EXPECT_LE(run, std::max(batch, max_run / batch * batch)) << where;
          const int64_t rounds = (total + world * run - 1) / (world * run);
          EXPECT_LT(rounds * world * run - total, rounds * world * batch) << where << ": padded slots";
          SamplerOptions o{world, world - 1, false, 0, false, run};
          EXPECT_EQ(DistributedSampler(total, o).perRank(), rounds * run) << where;
        }
}

// A rank's steps walk its run: a run of 6 with batch 3 is two steps of one rank.
TEST(Sampler, ARunLongerThanABatchSpansSteps) {
  SamplerOptions o;
  o.world_size = 2;
  o.block = shardRun(10, 2, 3, 6);
  ASSERT_EQ(o.block, 6);
  EXPECT_EQ(indices(DistributedSampler(10, o).slots()), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  o.rank = 1;
  auto r1 = DistributedSampler(10, o).slots();
  EXPECT_EQ(indices(r1), (std::vector<int64_t>{6, 7, 8, 9, 0, 1}));
  EXPECT_TRUE(r1[4].padded && r1[5].padded && !r1[3].padded);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SamplerWorlds, ::testing::Values(1, 2, 3, 4, 8));

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
