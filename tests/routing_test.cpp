// routing: a step's predictions and records reach their images' owners, driven without a process group: each
// rank's call runs twice, first recording what every rank sends each owner, then answering the owner's gather
// with every rank's part in rank order (the routing is a function of the window lists, so both runs agree).
#include "tiler/infer/routing.hpp"

#include <gtest/gtest.h>

#include <map>

namespace tiler {
namespace {

// What each rank's routing returns, with `route(ctx)` run by every rank of a world of every_rank.size().
template <typename Route>
std::vector<StepResult> routeEveryRank(int world_size, const std::vector<int>& owners, Route route) {
  std::map<std::pair<int, int>, torch::Tensor> sent;  // (rank, owner) -> part
  std::vector<StepResult> results;
  for (int pass = 0; pass < 2; ++pass) {
    results.clear();
    for (int rank = 0; rank < world_size; ++rank) {
      RouteContext ctx;
      ctx.rank = rank;
      ctx.world_size = world_size;
      ctx.owners = owners;
      ctx.gather = [&, rank, pass](const torch::Tensor& part, int owner, const std::string&) {
        if (pass == 0) {  // a stand-in of the gathered size; the second pass's results are the ones kept
          sent[{rank, owner}] = part.clone();
          std::vector<int64_t> sizes = part.sizes().vec();
          sizes[0] *= world_size;
          return torch::zeros(sizes, part.options());
        }
        std::vector<torch::Tensor> parts;
        for (int r = 0; r < world_size; ++r) parts.push_back(sent.at({r, owner}));
        return owner == rank ? torch::cat(parts, 0) : torch::Tensor();
      };
      results.push_back(route(ctx));
    }
  }
  return results;
}

// Rank r's slot k holds prediction rows of the value 100 r + k.
torch::Tensor predictionsOf(int rank, int64_t slots) {
  return (torch::arange(slots, torch::kFloat32) + 100.0f * float(rank))
      .view({slots, 1, 1})
      .expand({slots, 2, 3});
}

TEST(Routing, AStepOfOneOwnerGoesWholeAndEachOwnerGetsOnlyItsWindowsPackedAndPadded) {
  // Images 0 and 1 on rank 0, image 2 on rank 1.
  const std::vector<int> owners = {0, 0, 1};
  const std::vector<StepSlots> every_rank = {{{0, 0, SlotStatus::kOk},
                                              {2, 9, SlotStatus::kOk},
                                              {1, 4, SlotStatus::kOk},
                                              {2, 10, SlotStatus::kFailed}},
                                             {{2, 11, SlotStatus::kOk},
                                              {0, 1, SlotStatus::kOk},
                                              {-1, -1, SlotStatus::kPadded},
                                              {2, 12, SlotStatus::kOk}}};
  const auto results = routeEveryRank(2, owners, [&](const RouteContext& ctx) {
    return routePredictions(every_rank, predictionsOf(ctx.rank, 4), {2, 3}, ctx, "step 0");
  });
  // Rank 0 owns rank 0's slots 0 and 2 and rank 1's slot 1: two a rank, rank 1's padded with zeros.
  const StepResult& zero = results[0];
  ASSERT_EQ(zero.preds.sizes(), torch::IntArrayRef({4, 2, 3}));
  const std::vector<float> firsts = {0, 2, 101, 0};
  const std::vector<int64_t> windows = {0, 4, 1, -1};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(zero.preds[int64_t(i)][1][2].item<float>(), firsts[i]) << "slot " << i;
    EXPECT_EQ(zero.slots[i].window, windows[i]) << "slot " << i;
  }
  // Rank 1 owns rank 0's slot 1 and rank 1's slots 0 and 3.
  const StepResult& one = results[1];
  ASSERT_EQ(one.preds.sizes(), torch::IntArrayRef({4, 2, 3}));
  const std::vector<float> ones = {1, 0, 100, 103};
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(one.preds[int64_t(i)][0][0].item<float>(), ones[i]) << "slot " << i;
  EXPECT_EQ(one.slots[0].window, 9);
  EXPECT_FALSE(one.slots[1].ok()) << "padding";
  EXPECT_EQ(one.slots[3].window, 12);

  // Every window of one owner: each rank's batch as it is, its slots as they are.
  const std::vector<StepSlots> to_zero = {{{0, 0, SlotStatus::kOk}, {1, 4, SlotStatus::kFailed}},
                                          {{1, 5, SlotStatus::kOk}, {-1, -1, SlotStatus::kPadded}}};
  const auto whole = routeEveryRank(2, owners, [&](const RouteContext& ctx) {
    return routePredictions(to_zero, predictionsOf(ctx.rank, 2), {2, 3}, ctx, "step 1");
  });
  ASSERT_EQ(whole[0].preds.sizes(), torch::IntArrayRef({4, 2, 3}));
  EXPECT_EQ(whole[0].preds[2][0][0].item<float>(), 100);
  EXPECT_EQ(whole[0].slots[1].status, SlotStatus::kFailed) << "the batch's slots as they are";
  EXPECT_FALSE(whole[1].preds.defined()) << "rank 1 owns none of the step";
  EXPECT_TRUE(whole[1].slots.empty());
}

TEST(Routing, OneRankGetsItsOwnPredictionsWithoutACopy) {
  const std::vector<StepSlots> every_rank = {{{0, 0, SlotStatus::kOk}, {0, 1, SlotStatus::kOk}}};
  const torch::Tensor preds = predictionsOf(0, 2).contiguous();
  const auto results = routeEveryRank(1, {0}, [&](const RouteContext& ctx) {
    RouteContext alone = ctx;
    alone.gather = [](const torch::Tensor& part, int, const std::string&) { return part; };
    return routePredictions(every_rank, preds, {2, 3}, alone, "step 0");
  });
  EXPECT_EQ(results[0].preds.data_ptr(), preds.data_ptr());
}

TEST(Routing, RecordsReachTheirOwnersEndToEndInRankOrder) {
  const std::vector<int> owners = {1, 0};
  std::vector<StepSlots> every_rank = {
      {{0, 0, SlotStatus::kOk}, {1, 3, SlotStatus::kOk}, {0, 1, SlotStatus::kOk}},
      {{0, 2, SlotStatus::kOk}, {1, 4, SlotStatus::kFailed}}};
  const std::vector<std::vector<std::string>> records = {{"aa", "b", "ccc"}, {"dddd", ""}};
  for (size_t r = 0; r < records.size(); ++r)
    for (size_t k = 0; k < records[r].size(); ++k)
      every_rank[r][k].record_bytes = int64_t(records[r][k].size());
  const auto results = routeEveryRank(2, owners, [&](const RouteContext& ctx) {
    return routeRecords(every_rank, records[size_t(ctx.rank)], ctx, "step 0");
  });
  EXPECT_EQ(results[1].records, (std::vector<std::string>{"aa", "ccc", "dddd"}));
  ASSERT_EQ(results[1].slots.size(), 3u);
  EXPECT_EQ(results[1].slots[2].window, 2);
  EXPECT_EQ(results[0].records, (std::vector<std::string>{"b"})) << "the failed slot sends nothing";
  EXPECT_FALSE(results[0].preds.defined());
}

}  // namespace
}  // namespace tiler
