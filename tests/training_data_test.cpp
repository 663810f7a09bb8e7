// training_data: a label source drives which images join, which windows are trained and validated on, and
// what a window's labels are; here a fake one, so the catalog and the split are tested without label files.
#include "tiler/finetune/training_data.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <opencv2/imgcodecs.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/finetune/plan.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// Labels every even grid window with its image's id; records what the data loader asked of it.
class EvenWindowLabels final : public LabelSource {
 public:
  using LabelSource::LabelSource;
  std::string labelOf(const ImageSet& set, const std::string& image) const override {
    return (set.held_out ? "held-out:" : "train:") + fs::path(image).filename().string();
  }
  void add(CatalogImage& image, int image_id) override {
    added.push_back(image_id);
    labels.push_back(image.label);
  }
  void finish() const override { ++finished; }
  bool labelled(int /*image_id*/, int64_t local) const override { return local % 2 == 0; }
  LabelShape shape() const override { return {1, 1, 1}; }
  void read(const CatalogImage& /*image*/, int image_id, int64_t /*local*/, ReaderCache& /*readers*/,
            float* target, float* valid) const override {
    target[0] = float(image_id);
    valid[0] = 1;
  }
  std::vector<int> added;
  std::vector<std::string> labels;
  mutable int finished = 0;
};

class TrainingDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratchDir(std::string("training_data_") +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    o_.window = "32";
    o_.overlap = "0";
    o_.labels_dir = dir_ + "/labels";  // chooses label images' row; the fake reads no file
    probe_.input_channels = 3;
    probe_.output_channels = 2;
  }
  // `count` grey 64x64 images (four 32x32 windows each) in `sub`.
  std::string images(const std::string& sub, int count) {
    fs::create_directories(dir_ + "/" + sub);
    for (int i = 0; i < count; ++i)
      EXPECT_TRUE(cv::imwrite(dir_ + "/" + sub + "/" + std::to_string(i) + ".png",
                              cv::Mat(64, 64, CV_8UC3, cv::Scalar(100, 100, 100))));
    return dir_ + "/" + sub;
  }
  std::string dir_;
  FinetuneOptions o_;
  ModelProbe probe_;
};

TEST_F(TrainingDataTest, TheSourceChoosesTheWindowsAndWholeImagesAreHeldOut) {
  o_.images_dir = images("images", 3);
  o_.val_fraction = 0.34;  // one image of three
  const FinetunePlan plan = planFinetune(o_);
  const LabelContext context{o_, plan, probe_};
  auto fake = std::make_unique<EvenWindowLabels>(context);
  const EvenWindowLabels& labels = *fake;
  const TrainingData data = loadTrainingData(context, std::move(fake), nullptr);
  EXPECT_EQ(labels.added, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(labels.finished, 1);
  ASSERT_EQ(data.catalog.images().size(), 3u);
  EXPECT_EQ(data.catalog.image(1).label, "train:1.png") << "the source names each image's label";
  ASSERT_EQ(data.train.size(), 4u) << "two labelled windows of each of two images";
  ASSERT_EQ(data.val.size(), 2u);
  for (const auto& w : data.val) EXPECT_EQ(w.image, data.val.front().image) << "a whole image is held out";
  for (const auto* pool : {&data.train, &data.val})
    for (const auto& w : *pool) {
      EXPECT_EQ(w.local % 2, 0);
      EXPECT_EQ(w.global, data.catalog.image(w.image).first_window + w.local);
      if (pool == &data.train) {
        EXPECT_NE(w.image, data.val.front().image) << "a held-out image trains no window";
      }
    }
  ReaderCache readers;
  float target = -1, valid = 0;
  data.readLabels(data.train.back(), readers, &target, &valid);
  EXPECT_EQ(target, float(data.train.back().image));
  EXPECT_EQ(valid, 1.0f);
  const TrainingData again = loadTrainingData(context, std::make_unique<EvenWindowLabels>(context), nullptr);
  EXPECT_EQ(again.val.front().image, data.val.front().image) << "the split is seeded by --seed alone";
}

TEST_F(TrainingDataTest, HeldOutImagesTakeTheirOwnSource) {
  o_.images_dir = images("images", 2);
  o_.val_images = images("val", 1);
  o_.val_labels = dir_ + "/val_labels";
  const FinetunePlan plan = planFinetune(o_);
  const LabelContext context{o_, plan, probe_};
  auto held_out = std::make_unique<EvenWindowLabels>(context);
  const EvenWindowLabels& held_out_labels = *held_out;
  const TrainingData data =
      loadTrainingData(context, std::make_unique<EvenWindowLabels>(context), std::move(held_out));
  EXPECT_EQ(held_out_labels.added, (std::vector<int>{2}));
  EXPECT_EQ(held_out_labels.labels, (std::vector<std::string>{"held-out:0.png"}));
  EXPECT_EQ(data.source_of, (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(data.train.size(), 4u);
  ASSERT_EQ(data.val.size(), 2u);
  EXPECT_EQ(data.val.front().image, 2);
}

TEST_F(TrainingDataTest, ADirectoryWithoutImagesIsNamed) {
  fs::create_directories(dir_ + "/empty");
  o_.images_dir = dir_ + "/empty";
  const FinetunePlan plan = planFinetune(o_);
  const LabelContext context{o_, plan, probe_};
  try {
    loadTrainingData(context, std::make_unique<EvenWindowLabels>(context), nullptr);
    FAIL() << "an empty --images was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no images in '" + dir_ + "/empty'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tiler
