// train_metrics: what a user reads of a training run: per-class IoU and Dice from the validation counts, the
// epochs as a CSV (one row an epoch) and the curves as a PNG that OpenCV draws.
// Promise: a class that neither the predictions nor the labels hold has no IoU or Dice (null in JSON, an
// empty CSV cell) and counts for neither mean; the CSV and the plot are made from the report's epochs alone,
// so a resumed run draws its whole history. No LibTorch.
#pragma once

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <string>
#include <vector>

namespace tiler {

// Each class's counts over the validation pixels: predicted and true, predicted, true.
struct ClassCounts {
  double intersection = 0, predicted = 0, truth = 0;
};

// {"val_iou", "val_dice" (the means over classes present), "val_class_iou", "val_class_dice" (objects by
// class name, null where absent)} of `counts`, one per name of `classes`.
nlohmann::json segmentationMetrics(const std::vector<ClassCounts>& counts,
                                   const std::vector<std::string>& classes);

// The epochs of a report (`history`: objects with epoch, train_loss and, where validated, val_loss,
// val_iou, val_dice, val_accuracy (a column only where an epoch has it), val_class_iou, val_class_dice, and
// lr, seconds) as CSV text with a header row; the per-class columns (iou_<name>, then dice_<name>) in the
// order of `classes` (empty: the report's, by name).
std::string epochsCsv(const nlohmann::json& history, const std::vector<std::string>& classes = {});

// The curves of `history` (train and validation loss on the left axis, mean IoU and Dice, and accuracy where
// there is one, in [0,1] on the right) on a white BGR image of width x height, with axes, epoch ticks and a
// legend.
cv::Mat drawCurves(const nlohmann::json& history, int width = 800, int height = 480);

}  // namespace tiler
