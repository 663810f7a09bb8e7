// finetune/plan: finetune's flags parsed once into typed values, refused in the words the command has always
// used.
#include "tiler/finetune/plan.hpp"

#include <gtest/gtest.h>

#include "tiler/core/error.hpp"
#include "tiler/finetune/label_source.hpp"

namespace tiler {
namespace {

std::string planRefusal(FinetuneOptions o) {
  try {
    planFinetune(o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(FinetunePlan, FlagsBecomeTypedValues) {
  FinetuneOptions o;
  o.labels_dir = "labels";
  o.loss = "dice";
  o.optimizer = "sgd";
  o.schedule = "cosine";
  o.unlabeled = "background";
  o.classes = "bg,tumor";
  o.class_weights = "1,2.5";
  const FinetunePlan plan = planFinetune(o);
  EXPECT_EQ(plan.loss, LossKind::kDice);
  EXPECT_EQ(plan.optimizer, OptimizerKind::kSgd);
  EXPECT_EQ(plan.schedule, Schedule::kCosine);
  EXPECT_STREQ(plan.labels->flag, "--labels");
  EXPECT_TRUE(plan.unlabeled_background);
  EXPECT_EQ(plan.class_names, (std::vector<std::string>{"bg", "tumor"}));
  EXPECT_EQ(plan.class_weights, (std::vector<float>{1.0f, 2.5f}));
  EXPECT_FALSE(plan.auto_class_weights);
  EXPECT_EQ(plan.spec.window_w, 128) << "finetune's own default window";
  EXPECT_EQ(o.report, "finetuned.pt.report.json");
  o.class_weights = "auto";
  EXPECT_TRUE(planFinetune(o).auto_class_weights);
}

TEST(FinetunePlan, RefusalsNameTheFlag) {
  FinetuneOptions o;
  o.labels_dir = "labels";
  auto with = [o](auto change) {
    FinetuneOptions changed = o;
    change(changed);
    return planRefusal(changed);
  };
  EXPECT_NE(
      with([](FinetuneOptions& x) { x.loss = "l1"; }).find("--loss must be ce, bce, mse or dice; got 'l1'"),
      std::string::npos);
  EXPECT_NE(with([](FinetuneOptions& x) { x.resume = true; }).find("--resume needs --checkpoint_dir"),
            std::string::npos);
  EXPECT_NE(with([](FinetuneOptions& x) {
              x.loss = "bce";
              x.class_weights = "1,1";
            }).find("--class_weights weigh the classes of --loss ce or dice"),
            std::string::npos);
  EXPECT_NE(with([](FinetuneOptions& x) { x.val_images = "val"; }).find("--val_images needs --val_labels"),
            std::string::npos);
  EXPECT_NE(with([](FinetuneOptions& x) { x.labels_dir.clear(); }).find("give --labels (label images)"),
            std::string::npos);
}

TEST(FinetunePlan, TheLearningRateWarmsUpThenFollowsItsSchedule) {
  FinetuneOptions o;
  o.labels_dir = "labels";
  o.lr = 1.0;
  o.epochs = 4;
  o.warmup_epochs = 1;
  FinetunePlan plan = planFinetune(o);
  EXPECT_NEAR(learningRate(o, plan, 0.125), 0.5, 1e-6) << "half way through the first epoch's warm-up";
  EXPECT_EQ(learningRate(o, plan, 0.6), 1.0);
  plan.schedule = Schedule::kCosine;
  EXPECT_NEAR(learningRate(o, plan, 0.625), 0.5, 1e-12) << "half way from the warm-up's end to the last step";
  EXPECT_NEAR(learningRate(o, plan, 1.0), 0.0, 1e-12);
}

}  // namespace
}  // namespace tiler
