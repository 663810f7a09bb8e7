// plan: infer's flags parsed once into typed values; each head takes the job-wide flags it does not set.
#include "tiler/infer/plan.hpp"

#include <gtest/gtest.h>

#include "tiler/core/error.hpp"
#include "tiler/tasks/registry.hpp"

namespace tiler {
namespace {

TEST(Plan, AHeadTakesTheJobWideFlagsItDoesNotSetItself) {
  InferOptions o;
  o.heads = "np,tp";
  o.classes = "bg,cell";
  o.activation = "softmax";
  o.head_opt = {"tp.classes=bg,a,b", "tp.activation=none"};
  const InferPlan plan = planInfer(o);
  ASSERT_EQ(plan.heads.size(), 2u);
  EXPECT_EQ(plan.heads[0].flags.classes.size(), 2u) << "--classes, parsed before the heads take it";
  EXPECT_EQ(plan.heads[0].flags.activation, Activation::kSoftmax);
  EXPECT_EQ(plan.heads[1].flags.classes.size(), 3u);
  EXPECT_EQ(plan.heads[1].flags.activation, Activation::kNone);
}

// Each task's own flags are parsed into its settings, a head's with its own --head_opt values; a value the
// task cannot take is refused when planning, naming the flag.
TEST(Plan, TaskFlagsAreParsedIntoEachTasksSettingsPerHead) {
  InferOptions o;
  o.heads = "np,hv";
  o.task_flags = {{"blend", "crop"}, {"simplify", "2"}};
  o.head_opt = {"hv.probs_dtype=f16"};
  const InferPlan plan = planInfer(o);
  const Task& segment = *findTask("segment");
  const auto& job = settingsOf<SegmentSettings>(segment, plan.flags);
  EXPECT_EQ(job.stitch.mode, BlendMode::kCrop);
  EXPECT_EQ(job.map.simplify, 2.0);
  EXPECT_EQ(job.map.probs_type, SampleType::kF32);
  EXPECT_EQ(settingsOf<SegmentSettings>(segment, plan.heads[0].flags).map.probs_type, SampleType::kF32);
  const auto& hv = settingsOf<SegmentSettings>(segment, plan.heads[1].flags);
  EXPECT_EQ(hv.map.probs_type, SampleType::kF16) << "the head's own";
  EXPECT_EQ(hv.stitch.mode, BlendMode::kCrop) << "the job-wide flag";
  EXPECT_EQ(plan.flags.map_flags, std::vector<std::string>{"--blend"});
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"probs_dtype", "f64"}, {"blend", "soft"}, {"nms", "many"}, {"simplify", "-1"}}) {
    InferOptions bad;
    bad.task_flags[flag] = value;
    try {
      planInfer(bad);
      FAIL() << "--" << flag << " " << value << " was taken";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--" + flag), std::string::npos) << e.what();
    }
  }
}

TEST(Plan, StitchIsPlacedOnceAndNonsenseIsRefusedNamingTheFlag) {
  InferOptions o;
  o.stitch = "device";
  EXPECT_EQ(planInfer(o).stitch_place, StitchPlace::kDevice);
  o.stitch = "host";
  EXPECT_EQ(planInfer(o).stitch_place, StitchPlace::kHost);
  o.stitch = "gpu";
  try {
    planInfer(o);
    FAIL() << "--stitch gpu was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--stitch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tiler
