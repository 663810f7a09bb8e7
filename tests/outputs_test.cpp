// Image outputs: the labels type at the class-count edges, two-phase commit, a stage that fails one image
// and goes on, or stops at once with abort_on_error, and the device stitcher (device_stitch), run here on
// the CPU device with the same LibTorch operations a GPU runs: the host's bytes, and the host's path for an
// image whose accumulator the device cannot hold.
#include "tiler/stitch/outputs.hpp"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>
#include <limits>

#include "test_util.hpp"
#include "tiler/core/fault.hpp"
#include "tiler/tasks/registry.hpp"

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

// What a segmentation's consumer writes with: the model's channels and the task's own flags.
struct Segmentation {
  int64_t classes = 3;
  FlagValues flags;  // segment's: --blend, --probs_dtype, ...
  Activation activation = Activation::kNone;
};

// The stage as the job makes it for a segmentation: each image's consumer from the task's row.
OutputOptions segmentStage(OutputOptions o, const Segmentation& segmentation = {}) {
  TaskOutputs outputs;
  outputs.stage = o;
  outputs.probe.output_channels = segmentation.classes;
  outputs.flags.activation = segmentation.activation;
  outputs.flags.settings = parseTaskSettings(segmentation.flags, outputs.flags);
  o.parts = {{consumersFor(*findTask("segment"), outputs)}};
  return o;
}

StepResult stepOf(int n) {
  StepResult s;
  s.preds = torch::rand({n, 3, 8, 8});
  for (int i = 0; i < n; ++i) s.slots.push_back(WindowSlot{i, i, SlotStatus::kOk});
  return s;
}

// TILER_FAULT stage:write: the tiles of the image of the stage's 2nd window throw in the compression pool.
TEST(Outputs, AWriteFailureFailsThatImageAloneAndLeavesNoFinalFile) {
  const std::string dir = test::scratchDir("stage");
  WindowCatalog c = smallCatalog(dir, 3);
  OutputOptions o = OutputOptions();
  o.write_threads = 2;
  o.stitched_window = faultHooks(Fault{0, 2, "throw", "write"}, 0).stitched_window;
  OutputStage stage(c, segmentStage(o));
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
  OutputOptions o = OutputOptions();
  o.owners = {1, 0, 1};
  o.rank = 1;
  OutputStage stage(mine, segmentStage(o));
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

// A head whose consumer fails while aggregating (on the thread the stage gives each head after the first):
// that image fails, the other head's files of it are never final, and the other images are whole; the heads
// of a good image each write what that head alone writes.
class ThrowingHead : public ImageConsumer {
 public:
  explicit ThrowingHead(const CatalogImage& image) : input_(image.input) {}
  void aggregate(const std::vector<WindowResult>& windows) override {
    TILER_CHECK(input_.find("in1.png") == std::string::npos, IoError, "'" << input_ << "': the head failed");
    seen_ += int64_t(windows.size());
  }
  bool done() const override { return seen_ > 0; }
  std::vector<std::string> finalize() override { return {}; }

 private:
  std::string input_;
  int64_t seen_ = 0;
};

TEST(Outputs, AHeadThatFailsFailsItsImageAloneAndTheOtherHeadWritesAsAlone) {
  const std::string dir = test::scratchDir("stage_heads"), alone = test::scratchDir("stage_head_alone");
  WindowCatalog c = smallCatalog(dir, 3), one = smallCatalog(alone, 3);
  OutputOptions o = segmentStage(OutputOptions());
  o.parts.push_back({[](CatalogImage& image, const WriterOptions&) -> std::unique_ptr<ImageConsumer> {
    return std::make_unique<ThrowingHead>(image);
  }});
  OutputStage stage(c, o), single(one, segmentStage(OutputOptions()));
  StepResult step = stepOf(3);
  StepResult same = step;
  ASSERT_TRUE(stage.submit(std::move(step)));
  ASSERT_TRUE(single.submit(std::move(same)));
  stage.finish();
  single.finish();
  EXPECT_FALSE(stage.error());
  EXPECT_EQ(c.image(1).status, "error");
  EXPECT_NE(c.image(1).error.find("in1.png': the head failed"), std::string::npos) << c.image(1).error;
  EXPECT_FALSE(fs::exists(dir + "/img1_labels.tif"));
  EXPECT_FALSE(fs::exists(dir + "/img1_probs.tif"));
  for (int i : {0, 2}) {
    EXPECT_EQ(c.image(i).status, "done") << i;
    for (const char* kind : {"_labels.tif", "_probs.tif"}) {
      const std::string name = "/img" + std::to_string(i) + kind;
      EXPECT_EQ(test::slurp(dir + name), test::slurp(alone + name)) << name;
    }
  }
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().extension(), ".partial") << e.path();
  removeTree(dir);
  removeTree(alone);
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
  TaskOutputs embed;
  embed.flags.kinds = {"features"};
  embed.probe.output_channels = 5;
  embed.flags.settings = parseTaskSettings({}, embed.flags);
  o.parts = {{consumersFor(*findTask("embed"), embed)}};
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
  OutputOptions o = OutputOptions();
  o.abort_on_error = true;
  OutputStage stage(c, segmentStage(o));
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

// Images that take the stitcher through its edges, windows of `window` px at 0.25 overlap (scale 1/k: output
// windows of window/k): shifted last columns and rows, an image smaller than a window (padding), and a mask
// that keeps a subset with a whole grid row missing (rows the ring never held).
WindowCatalog edgeCatalog(const std::string& dir, int64_t window, Scale scale) {
  WindowCatalog c;
  const GridSpec spec{window, window, 0.25, 0.25};
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{100, 70}, {20, 13}, {90, 130}};
  for (size_t i = 0; i < sizes.size(); ++i) {
    CatalogImage img;
    img.input = dir + "/in" + std::to_string(i) + ".png";
    img.info.width = sizes[i].first;
    img.info.height = sizes[i].second;
    img.info.format = "png";
    img.grid = WindowGrid(img.info.width, img.info.height, spec, scale);
    if (i == 2) {
      img.masked = true;
      const int64_t columns = img.grid.columns();
      for (int64_t w = 0; w < img.grid.count(); ++w)
        if (w / columns != 1 && w != columns * 2 + 1) img.kept.push_back(w);
    }
    img.outputs["labels"] = dir + "/img" + std::to_string(i) + "_labels.tif";
    img.outputs["probs"] = dir + "/img" + std::to_string(i) + "_probs.tif";
    c.add(img, true);
  }
  return c;
}

// Predictions for every window of edgeCatalog: random, with the values that find a difference in rounding:
// ties between classes, huge and negative values, halves of 1/255.
torch::Tensor edgePredictions(int64_t windows, int channels, int64_t size) {
  torch::manual_seed(7);
  auto preds = torch::rand({windows, channels, size, size});
  preds[0].fill_(0.5f);                      // every class equal: label 0
  preds[1][0].narrow(0, 0, 2).fill_(1e10f);  // huge: u8 255
  preds[2].narrow(1, 0, 3).fill_(-3.f);      // negative: u8 0
  preds[3].copy_((torch::randint(0, 255, {channels, size, size}) + 0.5f) / 255.f);  // halves of 1/255
  return preds;
}

// Runs one stage over edgeCatalog in steps of 5 windows, the predictions on o.stitch_device when set (else
// the CPU); `nan_window`: the global window given a NaN; `backwards`: the steps from the last (every window
// but the last step's arrives before its turn, as other ranks' parts of a row do).
void runEdgeStage(const std::string& dir, OutputOptions o, const Segmentation& segmentation, int64_t window,
                  Scale scale, int64_t nan_window, bool backwards = false) {
  WindowCatalog c = edgeCatalog(dir, window, scale);
  const int64_t size = scale.apply(window);
  torch::Tensor preds = edgePredictions(c.totalWindows(), segmentation.classes, size);
  preds[nan_window][0][size / 2][size / 2].fill_(std::numeric_limits<float>::quiet_NaN());  // in its core
  {
    OutputStage stage(c, segmentStage(o, segmentation));
    std::vector<int64_t> firsts;
    for (int64_t first = 0; first < c.totalWindows(); first += 5) firsts.push_back(first);
    if (backwards) std::reverse(firsts.begin(), firsts.end());
    for (int64_t first : firsts) {
      StepResult step;
      const int64_t n = std::min<int64_t>(5, c.totalWindows() - first);
      step.preds = preds.narrow(0, first, n).to(o.stitch_device.value_or(torch::kCPU)).contiguous();
      for (int64_t k = 0; k < n; ++k)
        step.slots.push_back(WindowSlot{c.locate(first + k).first, first + k, SlotStatus::kOk});
      ASSERT_TRUE(stage.submit(std::move(step)));
    }
    stage.finish();
    ASSERT_FALSE(stage.error()) << *stage.error();
  }
  for (const auto& img : c.images()) ASSERT_EQ(img.status, "done") << img.input << ": " << img.error;
  EXPECT_EQ(c.image(c.locate(nan_window).first).non_finite_values, 1) << "the NaN window's image";
}

void expectSameFiles(const std::string& a, const std::string& b, const std::string& what) {
  int files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    ASSERT_TRUE(fs::exists(b + "/" + name)) << what << ": " << name;
    EXPECT_TRUE(test::slurp(a + "/" + name) == test::slurp(b + "/" + name)) << what << ": " << name;
    ++files;
  }
  EXPECT_EQ(files, std::distance(fs::directory_iterator(b), fs::directory_iterator{})) << what;
  EXPECT_GT(files, 0) << what;
}

// Every blend mode, one and several classes, every stored type, a model's output scale, windows that arrive
// before their turn: the host's bytes from the device stitcher on `device`.
void expectTheHostsBytesOn(torch::Device device) {
  const std::string dir = test::scratchDir("device_stitch");
  struct Case {
    const char* blend;  // --blend
    int classes;
    const char* probs;  // --probs_dtype
    int64_t window;
    Scale scale;
    bool backwards = false;
  };
  const std::vector<Case> cases = {{"gaussian", 3, "f32", 32, {}},    {"gaussian", 3, "u8", 32, {}},
                                   {"constant", 3, "f16", 32, {}},    {"crop", 3, "u8", 32, {}},
                                   {"crop", 1, "f32", 32, {}},        {"gaussian", 1, "u8", 32, {}},
                                   {"gaussian", 2, "u8", 32, {1, 2}}, {"gaussian", 3, "u8", 32, {}, true}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    OutputOptions o;
    const Segmentation segmentation{
        k.classes, {{"blend", k.blend}, {"probs_dtype", k.probs}}, Activation::kSigmoid};  // labels at 0.5
    o.scale = k.scale;
    o.write_threads = 2;
    const std::string what = "case " + std::to_string(i), host = dir + "/host" + std::to_string(i),
                      on_device = dir + "/device" + std::to_string(i);
    fs::create_directories(host);
    fs::create_directories(on_device);
    runEdgeStage(host, o, segmentation, k.window, k.scale, 5, k.backwards);
    o.stitch_device = device;
    runEdgeStage(on_device, o, segmentation, k.window, k.scale, 5, k.backwards);
    expectSameFiles(host, on_device, what);
  }
  removeTree(dir);
}

TEST(Outputs, TheDeviceStitcherWritesTheHostsBytes) {
  expectTheHostsBytesOn(torch::kCPU);
}

// The same on a GPU: CUDA's kernels round a multiply, an add and a division as the host does.
TEST(OutputsGpu, TheDeviceStitcherOnCudaWritesTheHostsBytes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expectTheHostsBytesOn(torch::Device(torch::kCUDA, 0));
}

// Probabilities of every stored type are measurements (zstd, as the f32 file has always been); labels are
// categories (deflate, which every TIFF reader has).
TEST(Outputs, ProbabilitiesCompressAsMeasurementsAndLabelsAsCategories) {
  const std::string dir = test::scratchDir("codec_by_values");
  runEdgeStage(dir, OutputOptions{}, Segmentation{3, {{"probs_dtype", "u8"}}}, 32, {}, 5);
  const auto codec = [](const std::string& path) {
    TIFF* t = TIFFOpen(path.c_str(), "r");
    uint16_t compression = 0;
    if (t) TIFFGetField(t, TIFFTAG_COMPRESSION, &compression);
    if (t) TIFFClose(t);
    return compression;
  };
  if (TIFFIsCODECConfigured(COMPRESSION_ZSTD)) EXPECT_EQ(codec(dir + "/img0_probs.tif"), COMPRESSION_ZSTD);
  EXPECT_EQ(codec(dir + "/img0_labels.tif"), COMPRESSION_ADOBE_DEFLATE);
  removeTree(dir);
}

// Out of memory making an image's device stitcher (TILER_FAULT kind oom, stage stitch): that image is
// stitched on the host, the others on the device, and every file is the host's.
TEST(Outputs, AnImageTheDeviceCannotHoldIsStitchedOnTheHost) {
  const std::string dir = test::scratchDir("device_stitch_oom");
  OutputOptions o;
  const Segmentation segmentation{3, {{"probs_dtype", "u8"}}};
  fs::create_directories(dir + "/host");
  fs::create_directories(dir + "/device");
  runEdgeStage(dir + "/host", o, segmentation, 32, {}, 5);
  o.stitch_device = torch::Device(torch::kCPU);
  int made = 0;
  const FaultHooks hooks = faultHooks(Fault{0, 1, "oom", "stitch"}, 0, [] {
    throw c10::OutOfMemoryError({__func__, __FILE__, uint32_t(__LINE__)}, "injected: out of memory");
  });
  ASSERT_TRUE(hooks.before_device_stitcher);
  o.before_device_stitcher = [&] {
    ++made;
    hooks.before_device_stitcher();
  };
  runEdgeStage(dir + "/device", o, segmentation, 32, {}, 5);
  EXPECT_EQ(made, 3) << "one device stitcher tried for each image";
  expectSameFiles(dir + "/host", dir + "/device", "the second image on the host");
  removeTree(dir);
}

}  // namespace
}  // namespace tiler
