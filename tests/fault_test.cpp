// TILER_FAULT: what the environment may say, and the hooks a rank installs: each fires at its stage's K-th
// window of that rank only, as often as the fault's kind says, and nothing is installed elsewhere.
#include "tiler/core/fault.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

std::optional<Fault> parse(const char* spec, const char* restart = nullptr) {
  setenv("TILER_FAULT", spec, 1);
  if (restart)
    setenv("TORCHELASTIC_RESTART_COUNT", restart, 1);
  else
    unsetenv("TORCHELASTIC_RESTART_COUNT");
  auto f = Fault::fromEnvironment();
  unsetenv("TILER_FAULT");
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  return f;
}

TEST(Fault, TheEnvironmentNamesRankWindowsKindAndStage) {
  auto f = parse("rank:1,after_windows:12,kind:throw,stage:write");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->after_windows, 12);
  EXPECT_EQ(f->kind, "throw");
  EXPECT_EQ(f->stage, "write");
  EXPECT_EQ(parse("rank:0,after_windows:1,kind:oom")->stage, "forward") << "oom is the forward's";
  EXPECT_FALSE(parse("")) << "unset";
  EXPECT_FALSE(parse("rank:0,after_windows:1,kind:crash", "1")) << "a restarted attempt runs clean";
  EXPECT_TRUE(parse("rank:0,after_windows:1,kind:crash", "0"));
  EXPECT_THROW(parse("rank:0,after_windows:x,kind:crash"), ConfigError);
  EXPECT_THROW(parse("rank:0,kind:explode"), ConfigError);
  EXPECT_THROW(parse("rank:0,kind:throw"), ConfigError) << "throw needs a stage";
  EXPECT_THROW(parse("rank:0,colour:red,kind:crash"), ConfigError);
  EXPECT_THROW(parse("rank0"), ConfigError);
}

TEST(Fault, AnotherRanksFaultInstallsNothing) {
  for (const char* stage : {"read", "forward", "write", "checkpoint"}) {
    const FaultHooks h = faultHooks(Fault{1, 3, "throw", stage}, 0);
    EXPECT_FALSE(h.before_read || h.forward_slot || h.in_forward || h.stitched_window || h.after_windows ||
                 h.before_checkpoint)
        << stage;
  }
  const FaultHooks none = faultHooks(std::nullopt, 0);
  EXPECT_FALSE(none.before_read || none.forward_slot || none.stitched_window || none.after_windows);
}

TEST(Fault, AReadThrowsAtTheKthWindowOnceNamingItsFile) {
  const FaultHooks h = faultHooks(Fault{2, 3, "throw", "read"}, 2);
  ASSERT_TRUE(h.before_read);
  EXPECT_FALSE(h.stitched_window || h.forward_slot || h.before_checkpoint);
  h.before_read("a.tif");
  h.before_read("a.tif");
  try {
    h.before_read("b.tif");
    FAIL() << "the 3rd read did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure while reading 'b.tif'"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(h.before_read("c.tif")) << "once";
}

TEST(Fault, AForwardFailsTheSlotOfTheKthWindowCountedAcrossSteps) {
  bool oom = false;
  const FaultHooks h = faultHooks(Fault{0, 4, "oom", "forward"}, 0, [&] { oom = true; });
  ASSERT_TRUE(h.forward_slot && h.in_forward);
  const WindowSlot ok{0, 0, SlotStatus::kOk}, padded{};
  EXPECT_EQ(h.forward_slot({ok, ok, padded}), -1);
  EXPECT_EQ(h.forward_slot({padded, ok, ok, ok}), 2) << "windows 3, 4 and 5: the 4th in slot 2";
  EXPECT_EQ(h.forward_slot({ok, ok}), -1);
  h.in_forward();
  EXPECT_TRUE(oom) << "oom is the caller's out-of-memory error";
  const FaultHooks t = faultHooks(Fault{0, 1, "throw", "forward"}, 0);
  EXPECT_EQ(t.forward_slot({ok}), 0);
  EXPECT_THROW(t.in_forward(), std::runtime_error);
}

TEST(Fault, TheKthStitchedWindowFailsItsImageOnce) {
  const FaultHooks h = faultHooks(Fault{0, 3, "throw", "write"}, 0);
  ASSERT_TRUE(h.stitched_window);
  EXPECT_FALSE(h.stitched_window());
  EXPECT_FALSE(h.stitched_window());
  EXPECT_TRUE(h.stitched_window());
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(h.stitched_window()) << "once";
}

TEST(Fault, ACheckpointFailsOnceKWindowsWereRead) {
  const FaultHooks h = faultHooks(Fault{0, 2, "throw", "checkpoint"}, 0);
  ASSERT_TRUE(h.before_read && h.before_checkpoint);
  h.before_read("x.tif");
  EXPECT_NO_THROW(h.before_checkpoint("epoch_1")) << "1 window read of 2";
  EXPECT_NO_THROW(h.before_read("x.tif")) << "a checkpoint fault only counts reads";
  EXPECT_THROW(h.before_checkpoint("epoch_2"), std::runtime_error);
}

TEST(FaultDeathTest, ExitActsOnceTheRankHasDoneKWindows) {
  const FaultHooks h = faultHooks(Fault{0, 5, "exit", ""}, 0);
  ASSERT_TRUE(h.after_windows);
  EXPECT_FALSE(h.before_read || h.stitched_window);
  h.after_windows(4);
  EXPECT_EXIT(h.after_windows(5), ::testing::ExitedWithCode(3), "injecting 'exit' after 5 windows");
}

}  // namespace
}  // namespace tiler
