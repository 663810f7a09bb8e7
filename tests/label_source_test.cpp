// label_source: the flags choose one source by its row; label images and window labels each fill a window's
// target and valid mask as the loader holds them.
#include "tiler/finetune/label_source.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/finetune/plan.hpp"
#include "tiler/finetune/training_data.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

std::string refusalOf(const FinetuneOptions& o) {
  try {
    chooseLabelSource(o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LabelSources, TheOneLabelFlagGivenChoosesItsRow) {
  FinetuneOptions o;
  const std::string refusal =
      "give --labels (label images), --annotations (GeoJSON) or --window_labels (CSV), one of them";
  EXPECT_NE(refusalOf(o).find(refusal), std::string::npos) << refusalOf(o);
  o.window_labels = "w.csv";
  EXPECT_STREQ(chooseLabelSource(o).flag, "--window_labels");
  EXPECT_TRUE(chooseLabelSource(o).per_window);
  o.annotations = "a.geojson";
  EXPECT_NE(refusalOf(o).find(refusal), std::string::npos) << "two given";
  o.window_labels.clear();
  EXPECT_STREQ(chooseLabelSource(o).flag, "--annotations");
  EXPECT_EQ(&heldOutLabelSource(o, chooseLabelSource(o)), &chooseLabelSource(o));
  o.annotations.clear();
  o.labels_dir = "labels";
  o.val_annotations = "val.geojson";
  EXPECT_STREQ(heldOutLabelSource(o, chooseLabelSource(o)).flag, "--annotations")
      << "held-out annotations are drawn as annotations";
}

class LabelSourceFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratchDir(std::string("label_source_") +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ + "/images");
    fs::create_directories(dir_ + "/labels");
    o_.images_dir = dir_ + "/images";
    probe_.input_channels = 3;
    probe_.output_channels = 3;
  }
  TrainingData load() {
    plan_ = planFinetune(o_);
    const LabelContext context{o_, plan_, probe_};
    return loadTrainingData(context, plan_.labels->make(context), nullptr);
  }
  // What load() refuses an image or label for; empty: nothing.
  std::string loadRefusal() {
    try {
      load();
    } catch (const IoError& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
  FinetuneOptions o_;
  FinetunePlan plan_;
  ModelProbe probe_;
};

TEST_F(LabelSourceFiles, ALabelImageIsCountedInsideTheImageOnly) {
  // A 40x40 image under one 48x48 window: the label's 40x40 are counted, the window's padding is not.
  ASSERT_TRUE(cv::imwrite(dir_ + "/images/a.png", cv::Mat(40, 40, CV_8UC3, cv::Scalar(50, 50, 50))));
  cv::Mat label(40, 40, CV_8UC1, cv::Scalar(1));
  label(cv::Rect(0, 0, 20, 40)).setTo(2);
  ASSERT_TRUE(cv::imwrite(dir_ + "/labels/a.png", label));
  o_.labels_dir = dir_ + "/labels";
  o_.window = "48";
  o_.val_fraction = 0;
  const TrainingData data = load();
  ASSERT_EQ(data.train.size(), 1u);
  const LabelShape shape = data.labelShape();
  ASSERT_EQ(shape.h, 48);
  ASSERT_EQ(shape.c, 1);
  cv::Mat target(48, 48, CV_32F, cv::Scalar(0)), valid(48, 48, CV_32F, cv::Scalar(0));
  ReaderCache readers;
  data.readLabels(data.train[0], readers, target.ptr<float>(), valid.ptr<float>());
  EXPECT_EQ(cv::sum(valid)[0], 40.0 * 40.0);
  EXPECT_EQ(valid.at<float>(0, 0), 0.0f) << "the window's padding";
  EXPECT_EQ(valid.at<float>(47, 47), 0.0f);
  EXPECT_EQ(target.at<float>(24, 10), 2.0f);
  EXPECT_EQ(target.at<float>(24, 35), 1.0f);
  EXPECT_EQ(cv::sum(target)[0], 20.0 * 40 * 2 + 20.0 * 40) << "nothing drawn outside the label";
}

TEST_F(LabelSourceFiles, ALabelImageWithAClassPastTheModelsIsNamed) {
  ASSERT_TRUE(cv::imwrite(dir_ + "/images/a.png", cv::Mat(32, 32, CV_8UC3, cv::Scalar(50, 50, 50))));
  ASSERT_TRUE(cv::imwrite(dir_ + "/labels/a.png", cv::Mat(32, 32, CV_8UC1, cv::Scalar(3))));
  o_.labels_dir = dir_ + "/labels";
  o_.window = "32";
  const std::string refusal = loadRefusal();
  EXPECT_NE(refusal.find("class id 3 but the model has 3 output channels"), std::string::npos) << refusal;
}

TEST_F(LabelSourceFiles, WindowLabelsLabelTheirWindowsAndNameARowNoImageTakes) {
  ASSERT_TRUE(cv::imwrite(dir_ + "/images/a.png", cv::Mat(64, 64, CV_8UC3, cv::Scalar(50, 50, 50))));
  std::ofstream(dir_ + "/windows.csv") << "image,x,y,label\na,32,0,2\na.png,0,32,1\n";
  o_.window_labels = dir_ + "/windows.csv";
  o_.window = "32";
  o_.overlap = "0";
  o_.val_fraction = 0;
  const TrainingData data = load();
  ASSERT_EQ(data.train.size(), 2u) << "only the labelled windows";
  EXPECT_EQ(data.train[0].local, 1);
  EXPECT_EQ(data.train[1].local, 2);
  ReaderCache readers;
  float target = 0, valid = 0;
  data.readLabels(data.train[0], readers, &target, &valid);
  EXPECT_EQ(target, 2.0f);
  EXPECT_EQ(valid, 1.0f);
  o_.unlabeled = "background";
  EXPECT_EQ(load().train.size(), 4u) << "the others are class 0";
  std::ofstream(dir_ + "/windows.csv", std::ios::app) << "b,0,0,1\n";
  const std::string refusal = loadRefusal();
  EXPECT_NE(refusal.find("line 4: image 'b' is none of --images"), std::string::npos) << refusal;
}

}  // namespace
}  // namespace tiler
