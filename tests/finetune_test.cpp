// End-to-end tests of `tiler finetune`: real processes through ctrun, on small generated image/label pairs.
#include "tiler/finetune.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.hpp"
#include "tiler/image_io.hpp"
#include "tiler/platform.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// Set before any test starts a process (see test_util.hpp).
const bool kChildrenOnCpu = (test::pinChildProcessesToCpu(), true);

const std::string kCtrun = std::string(TILER_BIN_DIR) + "/ctrun";
const std::string kTiler = std::string(TILER_BIN_DIR) + "/tiler";
const std::string kSamples = std::string(TILER_TEST_SOURCE_DIR) + "/samples";

auto run = test::runCommand;

nlohmann::json readJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<torch::Tensor> parametersOf(const std::string& path) {
  std::vector<torch::Tensor> out;
  for (const auto& p : torch::jit::load(path).parameters()) out.push_back(p.detach().clone());
  return out;
}

double maxDifference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

class Finetune : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        (fs::path(::testing::TempDir()) / ("finetune_" + std::to_string(getpid()) + "_" +
                                           ::testing::UnitTest::GetInstance()->current_test_info()->name()))
            .string();
    removeTree(dir_);
    fs::create_directories(dir_);
  }
  // Four image/label pairs of the bundled training set, so each test runs in seconds.
  std::string data() {
    for (const char* kind : {"images", "labels"}) {
      fs::create_directories(dir_ + "/data/" + kind);
      for (int i = 0; i < 4; ++i) {
        std::string name = "train_0" + std::to_string(i) + ".png";
        fs::copy_file(kSamples + "/train/" + kind + "/" + name, dir_ + "/data/" + kind + "/" + name,
                      fs::copy_options::skip_existing);
      }
    }
    return "--images " + dir_ + "/data/images --labels " + dir_ + "/data/labels";
  }
  std::string common(const std::string& out, const std::string& extra = "") {
    return " finetune -m " + kSamples + "/models/init.pt -o " + dir_ + "/" + out +
           " --window 96 --overlap 0 --threads 1 --no_progress --seed 3 " + extra;
  }
  std::string dir_;
};

TEST_F(Finetune, LossFallsRanksAgreeAndInferUsesTheOutput) {
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler +
               common("a.pt", data() + " --epochs 3 --lr 3e-3"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto report = readJson(dir_ + "/a.pt.report.json");
  EXPECT_EQ(report["world_size"], 2);
  ASSERT_EQ(report["epochs"].size(), 3u);
  for (const char* k : {"epoch", "train_loss", "val_loss", "val_iou", "val_dice", "seconds"})
    EXPECT_TRUE(report["epochs"][0].contains(k)) << k;
  EXPECT_LT(report["epochs"][2]["train_loss"].get<double>(), report["epochs"][0]["train_loss"].get<double>());
  EXPECT_GT(report["epochs"][2]["val_iou"].get<double>(), 0.5);
  auto infer = run(kTiler + " -m " + dir_ + "/a.pt -i " + kSamples + "/images/small.png -o " + dir_ +
                   "/infer --no_progress");
  EXPECT_EQ(infer.code, 0) << infer.output;
  EXPECT_TRUE(fs::exists(dir_ + "/infer/small_labels.tif"));
}

// Two ranks of batch B take the same steps as one rank of batch 2B, and as one rank summing 2 micro-batches
// of B per step (--grad_accum_steps 2); without accumulation one rank of batch B takes other steps.
TEST_F(Finetune, TwoRanksOfBatchBEqualOneRankOfBatch2BAndTwoMicroBatches) {
  const std::string args = data() + " --optimizer sgd --momentum 0 --lr 0.05 --epochs 2 --val_fraction 0";
  auto two = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler +
                 common("two.pt", args + " --batch_size 2"));
  ASSERT_EQ(two.code, 0) << two.output;
  auto one = run(kTiler + common("one.pt", args + " --batch_size 4"));
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_LT(maxDifference(parametersOf(dir_ + "/two.pt"), parametersOf(dir_ + "/one.pt")), 1e-5);
  EXPECT_GT(maxDifference(parametersOf(dir_ + "/one.pt"), parametersOf(kSamples + "/models/init.pt")), 1e-3)
      << "training moved the parameters";
  auto accum = run(kTiler + common("accum.pt", args + " --batch_size 2 --grad_accum_steps 2"));
  ASSERT_EQ(accum.code, 0) << accum.output;
  auto plain = run(kTiler + common("plain.pt", args + " --batch_size 2"));
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_LT(maxDifference(parametersOf(dir_ + "/two.pt"), parametersOf(dir_ + "/accum.pt")), 1e-5);
  EXPECT_GT(maxDifference(parametersOf(dir_ + "/plain.pt"), parametersOf(dir_ + "/accum.pt")), 1e-4)
      << "without accumulation the steps differ";
  EXPECT_EQ(readJson(dir_ + "/accum.pt.report.json")["steps"],
            readJson(dir_ + "/two.pt.report.json")["steps"]);
}

// A label that fails on one rank mid-epoch: every rank stops at that step, naming the file.
TEST_F(Finetune, ALabelFailingOnOneRankStopsEveryRank) {
  auto r = run("TILER_FAULT=rank:1,after_windows:10,kind:throw,stage:read " + kCtrun +
               " --nproc_per_node 2 --master_port 0 " + kTiler +
               common("x.pt", data() + " --epochs 2 --batch_size 2 --timeout 300"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 60) << "nobody waited for --timeout";
  EXPECT_NE(
      r.output.find("rank 1 failed: TILER_FAULT: injected failure while reading '" + dir_ + "/data/labels/"),
      std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/x.pt"));
}

// Killed while writing the epoch-2 checkpoint: --resume continues from epoch 1 to the same parameters.
TEST_F(Finetune, KillDuringACheckpointWriteResumesToTheSameParameters) {
  const std::string args = data() + " --epochs 3 --batch_size 4 --checkpoint_dir ";
  auto straight = run(kTiler + common("straight.pt", args + dir_ + "/ck1"));
  ASSERT_EQ(straight.code, 0) << straight.output;
  // 3 training images of 16 windows: 48 windows an epoch; the second checkpoint is the first after 49.
  auto killed = run("TILER_FAULT=rank:0,after_windows:49,kind:crash,stage:checkpoint " + kTiler +
                    common("resumed.pt", args + dir_ + "/ck2"));
  EXPECT_EQ(killed.code, 128 + SIGSEGV) << killed.output;
  EXPECT_TRUE(fs::exists(dir_ + "/ck2/epoch-000001/state.json"));
  EXPECT_TRUE(fs::exists(dir_ + "/ck2/epoch-000002.partial/model.pt")) << "killed mid-write";
  EXPECT_FALSE(fs::exists(dir_ + "/ck2/epoch-000002"));
  auto resumed = run(kTiler + common("resumed.pt", args + dir_ + "/ck2 --resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming after epoch 1"), std::string::npos) << resumed.output;
  EXPECT_EQ(maxDifference(parametersOf(dir_ + "/straight.pt"), parametersOf(dir_ + "/resumed.pt")), 0.0);
  EXPECT_FALSE(fs::exists(dir_ + "/ck2/epoch-000002.partial")) << "leftovers removed";
  EXPECT_TRUE(fs::exists(dir_ + "/ck2/epoch-000003/model.pt"));
}

TEST_F(Finetune, ACheckpointOfAnotherModelIsRefused) {
  const std::string args = data() + " --epochs 1 --batch_size 4 --checkpoint_dir " + dir_ + "/ck";
  ASSERT_EQ(run(kTiler + common("a.pt", args)).code, 0);
  // Swap the checkpoint's weights for a model with other shapes.
  torch::jit::Module other("Other");
  other.register_parameter("w", torch::zeros({5, 3, 1, 1}), false);
  other.define("def forward(self, x):\n    return torch.conv2d(x, self.w)\n");
  other.save(dir_ + "/ck/epoch-000001/model.pt");
  auto r = run(kTiler + common("a.pt", data() + " --epochs 2 --batch_size 4 --resume --checkpoint_dir " +
                                           dir_ + "/ck"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("epoch-000001/model.pt': 1 parameter tensors, the model has"), std::string::npos)
      << r.output;
}

TEST_F(Finetune, ASecondRunIntoALockedCheckpointDirectoryStops) {
  fs::create_directories(dir_ + "/ck_locked");
  DirectoryLock held(dir_ + "/ck_locked");  // this test process plays the first run
  ASSERT_TRUE(held.locked()) << held.error();
  auto r = run(kTiler + common("locked.pt", data() + " --epochs 1 --batch_size 4 --checkpoint_dir " + dir_ +
                                                "/ck_locked"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("another tiler run (pid " + std::to_string(getpid()) + ")"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/locked.pt"));
}

TEST_F(Finetune, ResumeEndsWhereAnUninterruptedRunEnds) {
  const std::string args = data() + " --epochs 2 --batch_size 4 --augment";
  auto straight = run(kTiler + common("straight.pt", args + " --checkpoint_dir " + dir_ + "/ck1"));
  ASSERT_EQ(straight.code, 0) << straight.output;
  auto first =
      run(kTiler + common("resumed.pt",
                          data() + " --epochs 1 --batch_size 4 --augment --checkpoint_dir " + dir_ + "/ck2"));
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_TRUE(fs::exists(dir_ + "/ck2/epoch-000001/state.json"));
  auto second = run(kTiler + common("resumed.pt", args + " --resume --checkpoint_dir " + dir_ + "/ck2"));
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_EQ(maxDifference(parametersOf(dir_ + "/straight.pt"), parametersOf(dir_ + "/resumed.pt")), 0.0);
  EXPECT_EQ(readJson(dir_ + "/resumed.pt.report.json")["epochs"].size(), 2u) << "history carried over";
}

// Parameters that became NaN are a diverged training, not ranks that disagree (NaN != NaN).
TEST_F(Finetune, ADivergedTrainingSaysSo) {
  auto r = run(kTiler + common("x.pt", data() + " --epochs 1 --lr 1e30"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("training diverged"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("holds different parameters"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/x.pt"));
}

TEST_F(Finetune, BadDataIsNamed) {
  const std::string d = data();
  fs::remove(dir_ + "/data/labels/train_02.png");
  auto missing = run(kTiler + common("x.pt", d));
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("train_02.png': no label with the same stem"), std::string::npos)
      << missing.output;
  // A label of the wrong size.
  WriterOptions png;
  png.format = "png";
  {
    ImageWriter w(dir_ + "/data/labels/train_02.png", 100, 50, 1, SampleType::kU8, png);
    w.writeRows(cv::Mat::zeros(50, 100, CV_8UC1));
    w.close();
  }
  auto size = run(kTiler + common("x.pt", d));
  EXPECT_EQ(size.code, 1);
  EXPECT_NE(size.output.find("train_02.png': label is 100x50 but image"), std::string::npos) << size.output;
  // A class the 2-channel model cannot predict.
  fs::remove(dir_ + "/data/labels/train_02.png");
  {
    ImageWriter w(dir_ + "/data/labels/train_02.png", 384, 384, 1, SampleType::kU8, png);
    w.writeRows(cv::Mat(384, 384, CV_8UC1, cv::Scalar(5)));
    w.close();
  }
  auto cls = run(kTiler + common("x.pt", d));
  EXPECT_EQ(cls.code, 1);
  EXPECT_NE(cls.output.find("class id 5 but the model has 2 output channels"), std::string::npos)
      << cls.output;
  EXPECT_FALSE(fs::exists(dir_ + "/x.pt"));
}

}  // namespace
}  // namespace tiler
