// The step exchange with ranks as threads over an in-process store: statuses travel with the step's first
// collective, and a rank that fails makes every rank throw at the same step, none left waiting.
#include "tiler/dist/exchange.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "ranks_util.hpp"

namespace tiler {
namespace {

class ExchangeWorlds : public ::testing::TestWithParam<int> {};

// Routing without a process group: each ok slot goes to its image's owner, in slot order per rank; failed and
// padded slots go nowhere.
TEST(Exchange, RoutesSendEachOkSlotToItsImagesOwner) {
  const std::vector<int> owners = {0, 1, 0};  // images 0 and 2 written by rank 0, image 1 by rank 1
  const StepSlots rank0 = {{0, 0, SlotStatus::kOk},
                           {1, 7, SlotStatus::kOk},
                           {2, 9, SlotStatus::kFailed},
                           {2, 10, SlotStatus::kOk}};
  const StepSlots rank1 = {{1, 8, SlotStatus::kOk}, {0, 1, SlotStatus::kOk}, {-1, -1, SlotStatus::kPadded}};
  const StepRoutes routes = routeSlots({rank0, rank1}, owners);
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_EQ(routes[0][0], (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(routes[0][1], (std::vector<int64_t>{1}));
  EXPECT_EQ(routes[1][0], (std::vector<int64_t>{1}));
  EXPECT_EQ(routes[1][1], (std::vector<int64_t>{0}));
  // One rank: every ok slot to itself.
  const StepRoutes one = routeSlots({rank0}, {0, 0, 0});
  EXPECT_EQ(one[0][0], (std::vector<int64_t>{0, 1, 3}));
}

TEST_P(ExchangeWorlds, ShareReturnsEveryRanksRowsInRankOrder) {
  const int size = GetParam();
  test::runRanks(size, [size](DistContext& ctx) {
    StepExchange ex(ctx);
    for (int step = 0; step < 3; ++step) {
      auto mine = torch::full({2, 2}, int64_t(10 * ctx.rank() + step), torch::kInt64);
      auto all = ex.share(mine, std::nullopt, "step " + std::to_string(step));
      ASSERT_EQ(int(all.size()), size);
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(all[size_t(r)].sizes(), mine.sizes());
        EXPECT_EQ(all[size_t(r)][1][1].item<int64_t>(), 10 * r + step);
      }
    }
    EXPECT_EQ(ex.agreeOnExitCode(ctx.rank() == 0 ? 2 : 0, std::nullopt), 2) << "rank 0's verdict";
  });
}

// The window slots of a step reach every rank with their image, window and status as each rank sent them.
TEST_P(ExchangeWorlds, ShareSlotsReturnsEveryRanksSlotsAsSent) {
  const int size = GetParam();
  test::runRanks(size, [size](DistContext& ctx) {
    StepExchange ex(ctx);
    const int r = ctx.rank();
    const StepSlots mine = {WindowSlot{r, 1000 + r, SlotStatus::kOk, 17 * r + 1}, WindowSlot{},
                            WindowSlot{7, int64_t(1) << 40, SlotStatus(r % 4)}};
    auto all = ex.shareSlots(mine, std::nullopt, "slots");
    ASSERT_EQ(int(all.size()), size);
    for (int q = 0; q < size; ++q) {
      const StepSlots& theirs = all[size_t(q)];
      ASSERT_EQ(theirs.size(), 3u);
      EXPECT_EQ(theirs[0].image, q);
      EXPECT_EQ(theirs[0].window, 1000 + q);
      EXPECT_TRUE(theirs[0].ok());
      EXPECT_EQ(theirs[0].record_bytes, 17 * q + 1);
      EXPECT_EQ(theirs[1].image, -1);
      EXPECT_EQ(theirs[1].window, -1);
      EXPECT_EQ(theirs[1].status, SlotStatus::kPadded);
      EXPECT_EQ(theirs[2].window, int64_t(1) << 40);
      EXPECT_EQ(theirs[2].status, SlotStatus(q % 4));
    }
  });
}

// Rank `bad` fails at step 2 of 5: every rank must leave at step 2 with the failing rank's message, the
// failing rank with its own, the others naming it.
TEST_P(ExchangeWorlds, AFailingRankEndsEveryRankAtTheSameStep) {
  const int size = GetParam();
  for (int bad = 0; bad < size; ++bad) {
    std::mutex m;
    std::vector<int> left_at(size_t(size), -1);
    const auto t0 = std::chrono::steady_clock::now();
    auto errors = test::runRanksCollect(
        size,
        [&](DistContext& ctx) {
          StepExchange ex(ctx);
          for (int step = 0; step < 5; ++step) {
            {
              std::lock_guard<std::mutex> lock(m);
              left_at[size_t(ctx.rank())] = step;
            }
            auto status = captureFailure([&] {
              if (ctx.rank() == bad && step == 2) throw std::runtime_error("label 'x.png' is truncated");
            });
            ex.share(torch::zeros({1, 2}, torch::kInt64), status, "step");
            auto preds = torch::ones({2});
            ex.gather(preds, 0, "predictions");
          }
        },
        std::chrono::seconds(20));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
        << "nobody waited for a timeout";
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(left_at[size_t(r)], 2) << "rank " << r;
      ASSERT_TRUE(errors[size_t(r)]) << "rank " << r << " did not throw";
      try {
        std::rethrow_exception(errors[size_t(r)]);
      } catch (const RankFailure& e) {
        EXPECT_EQ(e.failedRank(), r == bad ? r : bad);
        EXPECT_NE(e.message().find("label 'x.png' is truncated"), std::string::npos) << e.message();
        if (r != bad) {
          EXPECT_NE(e.message().find("rank " + std::to_string(bad) + " failed"), std::string::npos);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": not a RankFailure: " << e.what();
      }
    }
  }
}

TEST_P(ExchangeWorlds, ImageFailuresTravelThroughTheStore) {
  const int size = GetParam();
  test::runRanks(size, [size](DistContext& ctx) {
    StepExchange ex(ctx);
    if (ctx.rank() == size - 1) ex.reportImageFailure(7, "'a.tif': bad tile");
    ex.check(std::nullopt, "after the report");
    const std::string fallback = "no message";
    EXPECT_EQ(ex.imageFailure(7, fallback), "'a.tif': bad tile")
        << "also on one rank, where there is no store";
    EXPECT_EQ(ex.imageFailure(8, fallback), fallback);
  });
}

TEST_P(ExchangeWorlds, AFatalExitCodeIsAFailureEverywhere) {
  const int size = GetParam();
  auto errors = test::runRanksCollect(size, [](DistContext& ctx) {
    StepExchange ex(ctx);
    ex.agreeOnExitCode(
        0, ctx.rank() == 0 ? std::optional<std::string>("cannot write the report") : std::nullopt);
  });
  for (auto& e : errors) EXPECT_TRUE(e);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ExchangeWorlds, ::testing::Values(1, 2, 3, 4));

// Rank 0 is still at work (an owner writing its outputs) when rank 1, past the last step, waits for it in a
// collective: rank 1's timeout names rank 0, the rank that is behind, and not itself, the one that waited.
TEST(Exchange, ATimeoutNamesTheRankBehindNotTheOneThatWaited) {
  auto errors = test::runRanksCollect(
      2,
      [](DistContext& ctx) {
        StepExchange ex(ctx);
        ex.markStep(0);
        ex.check(std::nullopt, "step 0");
        if (ctx.rank() == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past rank 1's timeout
          return;
        }
        ex.markStep(1);
        ex.check(std::nullopt, "the end of the output stages");
      },
      std::chrono::seconds(1));
  ASSERT_TRUE(errors[1]) << "rank 1 waited past its timeout";
  try {
    std::rethrow_exception(errors[1]);
  } catch (const TimeoutError& e) {
    EXPECT_NE(e.message().find("the end of the output stages"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("behind: rank 0 (last seen at step 0)"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("rank 1 (last seen"), std::string::npos) << e.message();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a TimeoutError: " << e.what();
  }
}

TEST(Exchange, CaptureFailureDescribesAnyException) {
  EXPECT_EQ(captureFailure([] {}), std::nullopt);
  EXPECT_EQ(*captureFailure([] { throw std::bad_alloc(); }), "out of memory (std::bad_alloc)");
  EXPECT_EQ(*captureFailure([] { throw 42; }), "unknown exception");
  EXPECT_EQ(*captureFailure([] { TILER_THROW(IoError, "'a.tif': broken"); }), "'a.tif': broken");
  auto oom = captureFailure([] {
    throw c10::OutOfMemoryError({__func__, __FILE__, uint32_t(__LINE__)}, "CUDA out of memory. Tried 2 GiB");
  });
  EXPECT_EQ(oom->find("Exception raised from"), std::string::npos) << *oom;
  EXPECT_NE(oom->find("CUDA out of memory"), std::string::npos);
}

}  // namespace
}  // namespace tiler
