// inspect: `tiler info` and `tiler overlay` as library calls: what info prints and its exit code, the
// overlay's colours, and neither writing over a file it reads.
#include "tiler/infer/inspect.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <opencv2/imgcodecs.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/grid.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

class Inspect : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        (fs::path(::testing::TempDir()) / ("inspect_" + std::to_string(getpid()) + "_" +
                                           ::testing::UnitTest::GetInstance()->current_test_info()->name()))
            .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A grey 100x80 image and its labels: class 1 on the left half, background on the right.
    cv::imwrite(image(), cv::Mat(80, 100, CV_8UC3, cv::Scalar(100, 100, 100)));
    cv::Mat labels(80, 100, CV_8U, cv::Scalar(0));
    labels(cv::Rect(0, 0, 50, 80)).setTo(1);
    cv::imwrite(labels_path(), labels);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string image() const { return dir_ + "/image.png"; }
  std::string labels_path() const { return dir_ + "/labels.png"; }
  std::string dir_;
};

TEST_F(Inspect, InfoPrintsTheReaderViewAndGridAndGoesOnPastAnImageItCannotRead) {
  InfoOptions o;
  o.paths = {image(), dir_ + "/no_such.png"};
  o.window = "64";
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = runInfo(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, kExitSomeFailed);
  EXPECT_NE(out.find(image() + ": 100x80, 3 channel(s), u8, reader opencv, png\n"), std::string::npos) << out;
  const WindowGrid grid(100, 80, GridSpec{64, 64, 0.25, 0.25});
  EXPECT_NE(out.find("  grid: " + std::to_string(grid.count()) + " windows (" +
                     std::to_string(grid.startsX().size()) + " x " + std::to_string(grid.startsY().size()) +
                     ") of 64x64, overlap 0.25,0.25"),
            std::string::npos)
      << out;
  EXPECT_NE(err.find("tiler info: '" + dir_ + "/no_such.png': no such file"), std::string::npos) << err;
  o.paths = {image()};
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(runInfo(o), kExitOk);
  ::testing::internal::GetCapturedStdout();
}

TEST_F(Inspect, InfoNeverWritesItsMaskPreviewOverAnImageItReads) {
  InfoOptions o;
  o.paths = {image()};
  o.mask = "auto";
  o.mask_preview = image();
  const std::string before = test::slurp(image());
  try {
    runInfo(o);
    FAIL() << "the preview was written over the image";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("--mask_preview '" + image() + "' is the image"), std::string::npos)
        << e.message();
  }
  EXPECT_EQ(test::slurp(image()), before);
}

TEST_F(Inspect, OverlayBlendsAClassColourOverItsPixelsAndLeavesTheBackground) {
  const std::string out = dir_ + "/overlay.png";
  writeOverlay(image(), labels_path(), out);
  const cv::Mat rgb = cv::imread(out, cv::IMREAD_COLOR);  // OpenCV's BGR
  ASSERT_EQ(rgb.size(), cv::Size(100, 80));
  // Class 1's colour (255, 40, 40) at 50% over grey 100; its left edge is drawn solid, so look inside.
  EXPECT_EQ(rgb.at<cv::Vec3b>(40, 25), cv::Vec3b(70, 70, 177));
  EXPECT_EQ(rgb.at<cv::Vec3b>(40, 75), cv::Vec3b(100, 100, 100));
  EXPECT_EQ(rgb.at<cv::Vec3b>(40, 50), cv::Vec3b(100, 100, 100)) << "background past the boundary";
  try {
    writeOverlay(image(), labels_path(), labels_path());
    FAIL() << "the overlay was written over the labels";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("the overlay '" + labels_path() + "' is the labels"), std::string::npos)
        << e.message();
  }
}

}  // namespace
}  // namespace tiler
