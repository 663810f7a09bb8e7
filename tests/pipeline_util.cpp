// The fixture's scratch root and model, and the helpers of pipeline_util.hpp.
#include "pipeline_util.hpp"

#include <torch/script.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "slide_util.hpp"
#include "tiler/core/platform.hpp"

namespace tiler::e2e {

// Set before any test starts a process (see test_util.hpp).
const bool kChildrenOnCpu = (test::pinChildProcessesToCpu(), true);

void writeImage(const std::string& path, const cv::Mat& img, SampleType type) {
  WriterOptions o;
  o.format = fs::path(path).extension() == ".png" ? "png" : "tif";
  ImageWriter w(path, img.cols, img.rows, img.channels(), type, o);
  w.writeRows(img);
  w.close();
}

cv::Mat pattern(int h, int w, int type, double scale) {
  cv::Mat f(h, w, CV_MAKETYPE(CV_32F, CV_MAT_CN(type)));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < f.channels(); ++c)
        f.ptr<float>(y)[x * f.channels() + c] =
            float(0.5 + 0.5 * std::sin(x * 0.05 + c) * std::cos(y * 0.07));
  cv::Mat out;
  f.convertTo(out, type, scale);
  return out;
}

void Pipeline::SetUpTestSuite() {
  root_ = (fs::path(::testing::TempDir()) / ("pipeline_" + std::to_string(getpid()))).string();
  removeTree(root_);
  ref_.clear();
  fs::create_directories(root_ + "/images");
  // A small fully convolutional model: 3x3 conv (3 -> 4), relu, 1x1 conv (4 -> 2).
  torch::jit::Module m("Tiny");
  torch::manual_seed(0);
  m.register_parameter("w1", torch::randn({4, 3, 3, 3}) * 0.5, false);
  m.register_parameter("w2", torch::randn({2, 4, 1, 1}), false);
  m.define(R"JIT(
def forward(self, x):
    return torch.conv2d(torch.relu(torch.conv2d(x, self.w1, padding=1)), self.w2)
)JIT");
  model_ = root_ + "/tiny.pt";
  m.save(model_);
  writeImage(root_ + "/images/a_large.tif", pattern(500, 700, CV_8UC3, 255), SampleType::kU8);
  writeImage(root_ + "/images/b_mixed.png", pattern(200, 300, CV_8UC3, 255), SampleType::kU8);
  writeImage(root_ + "/images/c_small.png", pattern(40, 50, CV_8UC3, 255), SampleType::kU8);
  writeImage(root_ + "/images/d_gray16.tif", pattern(190, 260, CV_16UC1, 65535), SampleType::kU16);
  writeImage(root_ + "/images/e_float.tif", pattern(150, 150, CV_32FC3, 1.0), SampleType::kF32);
}

std::string Pipeline::root_;
std::string Pipeline::model_;
std::string Pipeline::ref_;

std::vector<std::string> partialFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".partial") out.push_back(e.path().string());
  return out;
}

const nlohmann::json* imageEntry(const nlohmann::json& report, const std::string& name) {
  for (const auto& e : report["images"])
    if (fs::path(e["input"].get<std::string>()).filename() == name) return &e;
  return nullptr;
}

bool have(const std::string& tool) {
  return run("command -v " + tool + " >/dev/null").code == 0;
}

void makeGoodSlide(const std::string& dir) {
  fs::create_directories(dir + "/slides");
  test::makeSlide(pattern(768, 1024, CV_8UC3, 255), dir + "/plain.tif", dir + "/slides/a_good.svs", 0.25, 40);
}

std::string thresholdModel(const std::string& dir) {
  torch::jit::Module m("Threshold");
  m.define(
      "def forward(self, x):\n    r = x[:, 0:1]\n    return torch.cat([torch.zeros_like(r), r - 0.5], 1)\n");
  const std::string path = dir + "/threshold.pt";
  m.save(path);
  return path;
}

std::string saveDetector(const std::string& path, const std::string& forward) {
  torch::jit::Module m("Detector");
  m.define(forward);
  m.save(path);
  return path;
}

std::string blobsAndGreenModel(const std::string& root) {
  torch::jit::Module m("BlobsAndGreen");
  m.register_module("blobs",
                    torch::jit::load(std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/instances.pt"));
  m.define("def forward(self, x):\n    return torch.cat([self.blobs.forward(x), x[:, 1:2]], 1)\n");
  const std::string path = root + "/blobs_green.pt";
  m.save(path);
  return path;
}

std::string perWindowModel(const std::string& root, const std::string& name, const std::string& forward) {
  torch::jit::Module m("PerWindow");
  torch::manual_seed(3);
  m.register_parameter("w", torch::randn({8, 3, 3, 3}) * 0.5, false);
  m.register_parameter("head", torch::randn({3, 8}), false);
  m.define(
      "def forward(self, x):\n    f = torch.mean(torch.relu(torch.conv2d(x, self.w, stride=2)), [2, 3])\n" +
      forward);
  const std::string path = root + "/" + name + ".pt";
  m.save(path);
  return path;
}

}  // namespace tiler::e2e
