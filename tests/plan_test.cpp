// plan: infer's flags parsed once into typed values; each head takes the job-wide flags it does not set.
#include "tiler/infer/plan.hpp"

#include <gtest/gtest.h>

#include "tiler/core/error.hpp"

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
  EXPECT_EQ(plan.heads[0].classes.size(), 2u) << "--classes, parsed before the heads take it";
  EXPECT_EQ(plan.heads[0].activation, Activation::kSoftmax);
  EXPECT_EQ(plan.heads[1].classes.size(), 3u);
  EXPECT_EQ(plan.heads[1].activation, Activation::kNone);
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
