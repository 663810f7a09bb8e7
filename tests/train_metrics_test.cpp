// What a user reads of a training run: per-class IoU and Dice, the epochs CSV and the curves PNG.
#include "tiler/finetune/train_metrics.hpp"

#include <gtest/gtest.h>

#include <opencv2/core.hpp>

namespace tiler {
namespace {

TEST(TrainMetrics, PerClassMetricsCsvAndCurves) {
  // Class a: 6 of 8 predicted right of 10 true; class c absent from both.
  const auto m = segmentationMetrics({{6, 8, 10}, {0, 0, 0}, {1, 2, 2}}, {"a", "c", "b,x"});
  EXPECT_DOUBLE_EQ(m["val_class_iou"]["a"].get<double>(), 6.0 / 12.0);
  EXPECT_DOUBLE_EQ(m["val_class_dice"]["a"].get<double>(), 12.0 / 18.0);
  EXPECT_TRUE(m["val_class_dice"]["c"].is_null());
  EXPECT_DOUBLE_EQ(m["val_dice"].get<double>(), (12.0 / 18.0 + 0.5) / 2);
  nlohmann::json e1 = {{"epoch", 1}, {"train_loss", 2.0}, {"val_loss", 1.5}, {"lr", 0.01}, {"seconds", 1.0}};
  e1.update(m);
  nlohmann::json e2 = {{"epoch", 2}, {"train_loss", 1.0}, {"seconds", 2.0}};
  const nlohmann::json history = {e1, e2};
  const std::string csv = epochsCsv(history);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "epoch,train_loss,val_loss,val_iou,val_dice,val_psnr,lr,seconds,iou_a,\"iou_b,x\",iou_c,dice_a,"
            "\"dice_b,x\",dice_c")
      << "names as the report orders them; a comma quoted";
  EXPECT_NE(csv.find("\n2,1,,,,,,2,,,,,,\n"), std::string::npos) << csv;
  const cv::Mat plot = drawCurves(history, 400, 300);
  ASSERT_EQ(plot.size(), cv::Size(400, 300));
  // The train loss curve (BGR 200,80,0) is drawn from epoch 1 (top: loss 2 of 2) to epoch 2.
  cv::Mat train_colour;
  cv::inRange(plot, cv::Scalar(200, 80, 0), cv::Scalar(200, 80, 0), train_colour);
  EXPECT_GT(cv::countNonZero(train_colour), 100);
  cv::Mat dice_colour;
  cv::inRange(plot, cv::Scalar(40, 40, 200), cv::Scalar(40, 40, 200), dice_colour);
  EXPECT_GT(cv::countNonZero(dice_colour), 10) << "one point and its legend";
}

// Window classification's epochs carry val_accuracy: a CSV column after val_dice and a curve of its own.
TEST(TrainMetrics, AccuracyHasAColumnAndACurveWhereEpochsHaveIt) {
  const nlohmann::json history = {{{"epoch", 1}, {"train_loss", 1.0}, {"val_accuracy", 0.25}},
                                  {{"epoch", 2}, {"train_loss", 0.5}, {"val_accuracy", 0.75}}};
  const std::string csv = epochsCsv(history);
  EXPECT_EQ(csv,
            "epoch,train_loss,val_loss,val_iou,val_dice,val_accuracy,val_psnr,lr,seconds\n"
            "1,1,,,,0.25,,,\n2,0.5,,,,0.75,,,\n");
  cv::Mat accuracy_colour;
  cv::inRange(drawCurves(history, 400, 300), cv::Scalar(160, 40, 160), cv::Scalar(160, 40, 160),
              accuracy_colour);
  EXPECT_GT(cv::countNonZero(accuracy_colour), 100);
}

}  // namespace
}  // namespace tiler
