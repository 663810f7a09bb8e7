// Image outputs: the labels type at the class-count edges, two-phase commit, and a stage that fails one
// image and goes on, or stops at once with abort_on_error.
#include "tiler/outputs.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <limits>

#include "test_util.hpp"
#include "tiler/fault.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

TEST(Outputs, LabelTypeAtTheClassCountEdges) {
  EXPECT_EQ(labelSampleType(2), SampleType::kU8);
  EXPECT_EQ(labelSampleType(255), SampleType::kU8);
  EXPECT_EQ(labelSampleType(256), SampleType::kU8) << "ids 0..255 fit in a byte";
  EXPECT_EQ(labelSampleType(257), SampleType::kU16);
  for (int classes : {255, 256, 257}) {
    cv::Mat band(1, 2, CV_32FC(classes), cv::Scalar::all(0));
    band.ptr<float>(0)[classes - 1] = 1.f;  // pixel 0: the last class
    cv::Mat labels = labelsFromProbabilities(band, 0.f);
    EXPECT_EQ(labels.depth(), cvDepthOf(labelSampleType(classes))) << classes;
    const int first = labels.depth() == CV_8U ? labels.at<uint8_t>(0, 0) : labels.at<uint16_t>(0, 0);
    EXPECT_EQ(first, classes - 1) << classes;
  }
}

TEST(Outputs, FinishKeepsThePartialNameUntilCommit) {
  const std::string dir = test::scratchDir("commit");
  {
    ImageWriter w(dir + "/a.tif", 4, 4, 1, SampleType::kU8);
    w.writeRows(cv::Mat(4, 4, CV_8UC1, cv::Scalar(3)));
    w.finish();
    EXPECT_TRUE(fs::exists(dir + "/a.tif.partial"));
    EXPECT_FALSE(fs::exists(dir + "/a.tif"));
  }
  EXPECT_FALSE(fs::exists(dir + "/a.tif.partial")) << "a finished, uncommitted writer removes its file";
  ImageWriter w(dir + "/b.tif", 4, 4, 1, SampleType::kU8);
  w.writeRows(cv::Mat(4, 4, CV_8UC1, cv::Scalar(3)));
  w.finish();
  w.commit();
  EXPECT_TRUE(fs::exists(dir + "/b.tif"));
  removeTree(dir);
}

// A catalog of `n` 8x8 images, one 8x8 window each, outputs under dir.
WindowCatalog smallCatalog(const std::string& dir, int n) {
  WindowCatalog c;
  for (int i = 0; i < n; ++i) {
    CatalogImage img;
    img.input = dir + "/in" + std::to_string(i) + ".png";
    img.info.width = img.info.height = 8;
    img.info.format = "png";
    img.grid = WindowGrid(8, 8, GridSpec{8, 8, 0.0, 0.0});
    img.outputs["labels"] = dir + "/img" + std::to_string(i) + "_labels.tif";
    img.outputs["probs"] = dir + "/img" + std::to_string(i) + "_probs.tif";
    c.add(img, true);
  }
  return c;
}

StepResult stepOf(int n) {
  StepResult s;
  s.preds = torch::rand({n, 3, 8, 8});
  for (int i = 0; i < n; ++i) s.slots.push_back(WindowSlot{i, i, SlotStatus::kOk});
  return s;
}

OutputOptions threeClasses() {
  OutputOptions o;
  o.save_labels = o.save_probs = true;
  o.classes = 3;
  return o;
}

// TILER_FAULT stage:write: the tiles of the image of the stage's 2nd window throw in the compression pool.
TEST(Outputs, AWriteFailureFailsThatImageAloneAndLeavesNoFinalFile) {
  const std::string dir = test::scratchDir("stage");
  WindowCatalog c = smallCatalog(dir, 3);
  OutputOptions o = threeClasses();
  o.write_threads = 2;
  o.stitched_window = faultHooks(Fault{0, 2, "throw", "write"}, 0).stitched_window;
  OutputStage stage(c, o);
  ASSERT_TRUE(stage.submit(stepOf(3)));
  stage.finish();
  EXPECT_FALSE(stage.error());
  EXPECT_EQ(c.image(0).status, "done");
  EXPECT_EQ(c.image(1).status, "error");
  EXPECT_NE(c.image(1).error.find("in1.png"), std::string::npos) << c.image(1).error;
  EXPECT_NE(c.image(1).error.find("injected failure while compressing a tile"), std::string::npos)
      << c.image(1).error;
  EXPECT_EQ(c.image(2).status, "done");
  EXPECT_FALSE(fs::exists(dir + "/img1_labels.tif"));
  EXPECT_FALSE(fs::exists(dir + "/img1_probs.tif"));
  for (const char* f : {"/img0_labels.tif", "/img0_probs.tif", "/img2_labels.tif"})
    EXPECT_TRUE(fs::exists(dir + f));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().extension(), ".partial") << e.path();
  removeTree(dir);
}

// A rank writes only the images it owns; what it wrote reaches rank 0's catalog through ownedResults().
TEST(Outputs, AStageWritesOnlyItsOwnImagesAndReportsThem) {
  const std::string dir = test::scratchDir("stage_owners");
  WindowCatalog mine = smallCatalog(dir, 3), rank0 = smallCatalog(dir, 3);
  OutputOptions o = threeClasses();
  o.owners = {1, 0, 1};
  o.rank = 1;
  OutputStage stage(mine, o);
  StepResult step = stepOf(3);
  step.slots[1] = WindowSlot{};  // image 1's slot goes to rank 0: never sent here
  step.failures[1] = "'in1.png': failed on rank 0";
  ASSERT_TRUE(stage.submit(std::move(step)));
  ASSERT_TRUE(stage.submit(StepResult{}));  // a step with none of this rank's windows
  stage.finish();
  EXPECT_EQ(stage.stats().images_owned, 2);
  int64_t bytes = 0;
  for (const char* f : {"/img0_labels.tif", "/img0_probs.tif", "/img2_labels.tif", "/img2_probs.tif"})
    bytes += int64_t(fs::file_size(dir + f));
  EXPECT_EQ(stage.stats().bytes_written, bytes);
  EXPECT_FALSE(fs::exists(dir + "/img1_labels.tif"));
  OutputStage::applyResults(rank0, stage.ownedResults());
  EXPECT_EQ(rank0.image(0).status, "done");
  EXPECT_EQ(rank0.image(1).status, "ok") << "not rank 1's to report";
  EXPECT_EQ(rank0.image(2).status, "done");
  removeTree(dir);
}

// A per-window model's stage: vectors, not maps, go to window_outputs; a write fault fails its image alone.
TEST(Outputs, PerWindowVectorsAreWrittenByTheStageAndAFaultFailsOneImage) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  const std::string dir = test::scratchDir("stage_vectors");
  WindowCatalog c = smallCatalog(dir, 3);
  for (int i = 0; i < 3; ++i) {
    c.image(i).outputs.clear();
    c.image(i).outputs["features"] = dir + "/img" + std::to_string(i) + ".h5";
  }
  OutputOptions o;
  WindowOutputOptions wo;
  wo.task = ModelTask::kEmbed;
  wo.kinds = {"features"};
  wo.dim = 5;
  o.per_window = wo;
  o.stitched_window = faultHooks(Fault{0, 2, "throw", "write"}, 0).stitched_window;
  OutputStage stage(c, o);
  StepResult step;
  step.preds = torch::rand({3, 5});
  step.preds[2][4] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 3; ++i) step.slots.push_back(WindowSlot{i, i, SlotStatus::kOk});
  ASSERT_TRUE(stage.submit(std::move(step)));
  stage.finish();
  EXPECT_FALSE(stage.error());
  EXPECT_EQ(c.image(0).status, "done");
  EXPECT_EQ(c.image(1).status, "error");
  EXPECT_NE(c.image(1).error.find("in1.png': TILER_FAULT: injected write failure"), std::string::npos)
      << c.image(1).error;
  EXPECT_EQ(c.image(2).status, "done");
  EXPECT_EQ(c.image(2).non_finite_values, 1);
  EXPECT_TRUE(fs::exists(dir + "/img0.h5"));
  EXPECT_FALSE(fs::exists(dir + "/img1.h5"));
  EXPECT_EQ(stage.stats().bytes_written,
            int64_t(fs::file_size(dir + "/img0.h5") + fs::file_size(dir + "/img2.h5")));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().extension(), ".partial") << e.path();
  removeTree(dir);
}

TEST(Outputs, AbortStopsTheStageAndRefusesMoreSteps) {
  const std::string dir = test::scratchDir("stage_abort");
  WindowCatalog c = smallCatalog(dir, 2);
  OutputOptions o = threeClasses();
  o.abort_on_error = true;
  OutputStage stage(c, o);
  StepResult first = stepOf(1);
  first.failures[0] = "'in0.png': bad tile";
  ASSERT_TRUE(stage.submit(std::move(first)));
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) refused = !stage.submit(stepOf(0));
  EXPECT_TRUE(refused) << "a stopped stage must not block or accept its producer";
  ASSERT_TRUE(stage.error());
  EXPECT_NE(stage.error()->find("(--on_error abort)"), std::string::npos) << *stage.error();
  stage.finish();
  EXPECT_EQ(c.image(1).status, "ok") << "never stitched";
  removeTree(dir);
}

}  // namespace
}  // namespace tiler
