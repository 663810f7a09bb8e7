// What the end-to-end tests of `tiler infer` (tests/pipeline_*_test.cpp, one executable: pipeline_test)
// share: the `Pipeline` fixture (a scratch root with five images and a tiny model, made once per suite, and
// the reference run every other is compared with), the paths of tiler and ctrun, and the helpers more than
// one file uses, the TorchScript models among them (made in pipeline_util.cpp, so that a test file needs
// LibTorch's headers only where its own tests build a model).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tiler/io/image_io.hpp"

namespace tiler::e2e {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline const std::string kCtrun = std::string(TILER_BIN_DIR) + "/ctrun";
inline const std::string kTiler = std::string(TILER_BIN_DIR) + "/tiler";

using test::freePort;
using test::slurp;
inline const auto run = test::runCommand;

void writeImage(const std::string& path, const cv::Mat& img, SampleType type);

cv::Mat pattern(int h, int w, int type, double scale);

class Pipeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite();

  static std::string tilerArgs(const std::string& out, const std::string& extra = "") {
    return kTiler + " -i " + root_ + "/images -m " + model_ + " -o " + out +
           " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress " + extra;
  }

  static std::string runCtrun(int n, const std::string& out, const std::string& extra = "") {
    auto r =
        run(kCtrun + " --nproc_per_node " + std::to_string(n) + " --master_port 0 " + tilerArgs(out, extra));
    EXPECT_EQ(r.code, 0) << r.output;
    return r.output;
  }

  // The run every other is compared with, made once per suite (SetUpTestSuite starts from an empty root).
  static std::string reference() {
    if (ref_.empty()) {
      ref_ = root_ + "/out_ref";
      auto r = run(tilerArgs(ref_));
      EXPECT_EQ(r.code, 0) << r.output;
    }
    return ref_;
  }

  // The TIFFs of `a` (the reference run's 10 by default) equal `b`'s byte for byte.
  static void expectSameOutputs(const std::string& a, const std::string& b, int expected_files = 10) {
    int files = 0;
    for (const auto& e : fs::directory_iterator(a)) {
      if (e.path().extension() != ".tif") continue;
      ++files;
      EXPECT_TRUE(slurp(e.path().string()) == slurp(b + "/" + e.path().filename().string()))
          << e.path().filename();
    }
    EXPECT_EQ(files, expected_files);
  }

  static nlohmann::json report(const std::string& out) {
    return nlohmann::json::parse(slurp(out + "/report.json"));
  }

  static std::string root_, model_, ref_;
};

std::vector<std::string> partialFiles(const std::string& dir);

const nlohmann::json* imageEntry(const nlohmann::json& report, const std::string& name);

bool have(const std::string& tool);

// `dir`/slides/a_good.svs: an Aperio slide of 1024x768 px at 0.25 µm/px, 40x (the bad slides' good
// neighbour).
void makeGoodSlide(const std::string& dir);

// A pointwise model: class 1 where the red channel is above half, else class 0; windows blend exactly.
std::string thresholdModel(const std::string& dir);

// A detector whose forward is `forward` (TorchScript source), saved at `path`.
std::string saveDetector(const std::string& path, const std::string& forward);

// An instance model: the bundled one's ids (8-connected bright blobs, window-local ids), then the green
// channel as one class score, saved under `root`.
std::string blobsAndGreenModel(const std::string& root);

// Per-window models: a tiny encoder ([B, 8]: 3x3 stride-2 convolution, relu, mean over the window) and a
// classifier (its features through a linear head, [B, 3]), saved under `root`.
std::string perWindowModel(const std::string& root, const std::string& name, const std::string& forward);

}  // namespace tiler::e2e
