// End-to-end tests of `tiler finetune`: real processes through ctrun, on small generated image/label pairs.
#include "tiler/finetune/finetune.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "qupath_util.hpp"
#include "slide_util.hpp"
#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/finetune/checkpoint.hpp"
#include "tiler/infer/job.hpp"
#include "tiler/io/image_io.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// Set before any test starts a process (see test_util.hpp).
const bool kChildrenOnCpu = (test::pinChildProcessesToCpu(), true);

const std::string kCtrun = std::string(TILER_BIN_DIR) + "/ctrun";
const std::string kTiler = std::string(TILER_BIN_DIR) + "/tiler";
const std::string kSamples = std::string(TILER_TEST_SOURCE_DIR) + "/samples";

auto run = test::runCommand;
using test::QuPathFeature;
using test::square;
using test::writeQuPathGeoJson;

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

// Three ranks of batch 2 take the steps of one rank of batch 6, class weights included: --class_weights auto
// counts each rank's share of the training windows and sums them (48 windows: no rank pads).
TEST_F(Finetune, ThreeRanksOfBatch2EqualOneRankOfBatch6WithAutoClassWeights) {
  const std::string args =
      data() + " --optimizer sgd --momentum 0 --lr 0.05 --epochs 1 --val_fraction 0.25 --class_weights auto";
  auto three = run(kCtrun + " --nproc_per_node 3 --master_port 0 " + kTiler +
                   common("three.pt", args + " --batch_size 2"));
  ASSERT_EQ(three.code, 0) << three.output;
  auto one = run(kTiler + common("one.pt", args + " --batch_size 6"));
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_LT(maxDifference(parametersOf(dir_ + "/three.pt"), parametersOf(dir_ + "/one.pt")), 1e-5);
  const auto w3 = readJson(dir_ + "/three.pt.report.json")["class_weights"],
             w1 = readJson(dir_ + "/one.pt.report.json")["class_weights"];
  ASSERT_EQ(w1.size(), 2u);
  for (size_t c = 0; c < 2; ++c) EXPECT_NEAR(w3[c].get<double>(), w1[c].get<double>(), 1e-6) << c;
  EXPECT_NE(w1[0], w1[1]) << "the classes are not balanced";
  EXPECT_EQ(readJson(dir_ + "/three.pt.report.json")["world_size"], 3);
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

// --channels in training: 4-band copies of the images (a noise band first, the colours out of order) with
// --channels 3,1,2 train as the RGB images do, step for step.
TEST_F(Finetune, ChosenChannelsTrainAsAPreSlicedCopy) {
  const std::string args = data() + " --optimizer sgd --momentum 0 --lr 0.05 --epochs 1 --val_fraction 0";
  fs::create_directories(dir_ + "/bands");
  for (const auto& e : fs::directory_iterator(dir_ + "/data/images")) {
    auto reader = ImageReader::open(e.path().string());
    const cv::Mat rgb = reader->readRegion({0, 0, reader->info().width, reader->info().height});
    ASSERT_EQ(rgb.channels(), 3);
    cv::Mat noise(rgb.size(), CV_8U), bands(rgb.size(), CV_8UC4);
    cv::randu(noise, 0, 255);
    const cv::Mat from[] = {noise, rgb};
    const int from_to[] = {0, 0, 2, 1, 3, 2, 1, 3};  // [noise, G, B, R]
    cv::mixChannels(from, 2, &bands, 1, from_to, 4);
    WriterOptions o;
    ImageWriter w(dir_ + "/bands/" + e.path().stem().string() + ".tif", bands.cols, bands.rows, 4,
                  SampleType::kU8, o);
    w.writeRows(bands);
    w.close();
  }
  auto plain = run(kTiler + common("plain.pt", args));
  ASSERT_EQ(plain.code, 0) << plain.output;
  auto chosen = run(kTiler + common("chosen.pt", "--images " + dir_ + "/bands --labels " + dir_ +
                                                     "/data/labels --optimizer sgd --momentum 0 --lr 0.05 " +
                                                     "--epochs 1 --val_fraction 0 --channels 3,1-2"));
  ASSERT_EQ(chosen.code, 0) << chosen.output;
  EXPECT_EQ(maxDifference(parametersOf(dir_ + "/plain.pt"), parametersOf(dir_ + "/chosen.pt")), 0.0);
  auto bad = run(kTiler + common("bad.pt", args + " --channels 0,x"));
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--channels '0,x': 'x' is not a channel index"), std::string::npos) << bad.output;
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

// The docs promise the lock file goes when the run ends: Ctrl-C left `.tiler.lock` behind (the kernel drops
// the flock, the file stayed). A real process, interrupted mid-training, still ends by SIGINT.
TEST_F(Finetune, InterruptedItRemovesItsCheckpointLock) {
  const std::string lock = dir_ + "/ck/.tiler.lock", log = dir_ + "/interrupted.log";
  const std::string command =
      "exec " + kTiler +
      common("x.pt", data() + " --epochs 1000 --batch_size 4 --checkpoint_dir " + dir_ + "/ck");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
    _exit(127);
  }
  // Held once the lock file names this process (set-up done: the data check runs after it).
  bool held = false, exited = false;
  int status = 0;
  for (int i = 0; i < 1200 && !held && !exited; ++i) {
    held = test::slurp(lock) == std::to_string(pid) + "\n";
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!held && !exited) usleep(100000);
  }
  ASSERT_FALSE(exited) << test::slurp(log);
  if (!held) kill(pid, SIGKILL);
  ASSERT_TRUE(held) << test::slurp(log);
  usleep(500000);  // into training
  kill(pid, SIGINT);
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status << "\n" << test::slurp(log);
  EXPECT_FALSE(fs::exists(lock)) << test::slurp(log);
}

// -o and --report are checked as infer's outputs are: `-o img/t0.png --report lab/t1.png` replaced a training
// image and a label. The checkpoints' epoch-* entries, which each epoch removes, hold nothing else either.
TEST_F(Finetune, ItsOutputsNeverReplaceWhatTrainingReads) {
  const std::string d = data();
  const std::string image = dir_ + "/data/images/train_00.png", label = dir_ + "/data/labels/train_01.png";
  const std::string image_bytes = test::slurp(image), label_bytes = test::slurp(label);
  fs::create_directories(dir_ + "/old/epoch-000001");
  fs::copy_file(kSamples + "/models/init.pt", dir_ + "/old/epoch-000001/model.pt");
  struct Case {
    std::string out, extra, message;
  };
  const std::vector<Case> cases = {
      {"data/images/train_00.png", "", "-o '" + image + "' is the training image '" + image + "'"},
      {"x.pt", "--report " + label, "--report '" + label + "' is the training label '" + label + "'"},
      {"x.pt", "--report " + dir_ + "/x.pt", "--report '" + dir_ + "/x.pt' is -o '" + dir_ + "/x.pt'"},
      {"ck/epoch-000002/x.pt", "--checkpoint_dir " + dir_ + "/ck",
       "-o '" + dir_ + "/ck/epoch-000002/x.pt' lies in the checkpoints '" + dir_ + "/ck/epoch-*'"},
      {"x.pt", "--checkpoint_dir " + dir_ + "/ck --report " + dir_ + "/ck/.tiler.lock",
       "is the --checkpoint_dir lock"},
  };
  for (const auto& c : cases) {
    auto r = run(kTiler + common(c.out, d + " --epochs 1 --batch_size 4 " + c.extra));
    EXPECT_EQ(r.code, 1) << c.out << " " << c.extra << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
  // The model of an earlier checkpoint as this run's start, in the directory whose checkpoints it replaces.
  auto r = run(kTiler + " finetune -m " + dir_ + "/old/epoch-000001/model.pt -o " + dir_ +
               "/x.pt --window 96 --overlap 0 --threads 1 --no_progress --epochs 1 --batch_size 4 " + d +
               " --checkpoint_dir " + dir_ + "/old");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("the model '" + dir_ + "/old/epoch-000001/model.pt' lies in the checkpoints '" +
                          dir_ + "/old/epoch-*', which this run makes and removes"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir_ + "/old/epoch-000001/model.pt"));
  EXPECT_EQ(test::slurp(image), image_bytes);
  EXPECT_EQ(test::slurp(label), label_bytes);
  EXPECT_FALSE(fs::exists(dir_ + "/x.pt"));
  // --timeout past what the clocks hold (it overflowed to "-9.2e15 s") is refused as infer's is.
  r = run(kTiler + common("x.pt", d + " --timeout 1e308"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(
      r.output.find("--timeout must be a number of seconds > 0 and at most 2147483 (24.8 days); got 1e+308"),
      std::string::npos)
      << r.output;
}

// infer and finetune check the flags they share in one function: a value either refuses, the other refuses in
// the same words (finetune took --threads -1 and --scale -1 that infer refused: the command line's own checks
// hid it, a --config file or a library caller did not).
TEST(SharedJobFlags, ABadSharedFlagIsRefusedInTheSameWordsByInferAndFinetune) {
  const std::vector<std::function<void(JobOptions&)>> bad = {
      [](JobOptions& o) { o.threads = -1; },    [](JobOptions& o) { o.scale = -1; },
      [](JobOptions& o) { o.batch_size = 0; },  [](JobOptions& o) { o.prefetch = 0; },
      [](JobOptions& o) { o.timeout = 1e308; }, [](JobOptions& o) { o.pad = "mirror"; },
      [](JobOptions& o) { o.window = "64,0"; }, [](JobOptions& o) { o.channels = "0,x"; },
  };
  for (const auto& set : bad) {
    InferOptions infer;
    FinetuneOptions finetune;
    set(infer);
    set(finetune);
    finetune.images_dir = finetune.labels_dir = "/no/such/dir";
    const std::string infer_says = test::configError([&] { runInfer(infer); });
    EXPECT_NE(infer_says, "no error");
    EXPECT_EQ(test::configError([&] { runFinetune(finetune); }), infer_says);
  }
}

// A checkpoint's counts are whole numbers in range: `"epoch": 1e300` said "names epoch -2147483648".
TEST_F(Finetune, ACheckpointCountOutOfRangeIsNamed) {
  const std::string args = data() + " --epochs 1 --batch_size 4 --checkpoint_dir " + dir_ + "/ck";
  ASSERT_EQ(run(kTiler + common("a.pt", args)).code, 0);
  const std::string state_file = dir_ + "/ck/epoch-000001/state.json";
  auto state = readJson(state_file);
  state["epoch"] = 1e300;
  std::ofstream(state_file) << state.dump();
  auto r = run(kTiler + common("a.pt", data() + " --epochs 2 --batch_size 4 --resume --checkpoint_dir " +
                                           dir_ + "/ck"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(state_file + "': epoch is 1e+300, not a whole number from 0 to 2147483647"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("-2147483648"), std::string::npos) << r.output;
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

// A .pt2 package is compiled code: training refuses it as such, whatever its metadata says (here: a package
// for CUDA without tiler's shapes, which the runtime would refuse for either first).
TEST_F(Finetune, APackageIsRefusedAsUntrainableWhateverItsMetadata) {
  const std::string package = dir_ + "/exported.pt2";
  const auto made =
      run("/usr/bin/python3 -c \"import sys, zipfile\n"
          "with zipfile.ZipFile(sys.argv[1], 'w') as z:\n"
          "    z.writestr('p/archive_format', 'pt2')\n"
          "    z.writestr('p/data/aotinductor/model/m_metadata.json', '{\\\"AOTI_DEVICE_KEY\\\": "
          "\\\"cuda\\\"}')\n\" " +
          package);
  ASSERT_EQ(made.code, 0) << made.output;
  auto r = run(kTiler + " finetune -m " + package + " -o " + dir_ + "/x.pt --window 96 --threads 1 " +
               "--no_progress --epochs 1 " + data());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("'" + package + "': training needs a TorchScript model"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/x.pt"));
}

TEST(LossScaler, SkipsAndHalvesOnOverflowAndDoublesAfterGoodSteps) {
  LossScaler s;
  s.scale = 1024;
  s.growth_steps = 3;
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale, 512);
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale, 512) << "two good steps of three";
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale, 1024) << "grown after three";
  EXPECT_EQ(s.good_steps, 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale, 512);
  EXPECT_EQ(s.good_steps, 0) << "an overflow starts the count again";
}

// A small fully convolutional model of random weights: 3 channels in, 3 classes out.
std::string writeShapeModel(const std::string& path) {
  torch::manual_seed(7);
  torch::jit::Module m("ShapeNet");
  m.register_parameter("w1", torch::randn({8, 3, 3, 3}) * 0.3, false);
  m.register_parameter("b1", torch::zeros({8}), false);
  m.register_parameter("w2", torch::randn({3, 8, 1, 1}) * 0.3, false);
  m.register_parameter("b2", torch::zeros({3}), false);
  m.define(
      "def forward(self, x):\n"
      "    h = torch.relu(torch.conv2d(x, self.w1, self.b1, [1, 1], [1, 1]))\n"
      "    return torch.conv2d(h, self.w2, self.b2)\n");
  m.save(path);
  return path;
}

// A 1024 x 1024 slide at 0.25 um/px: a 4 x 4 grid of shapes on white, Tumor (red discs, class 1) and Stroma
// (blue squares, class 2, one with a white hole); `truth` is the class map at 0.5 um/px. The annotations
// cover the left half: a Background rectangle first, the shapes after it (later wins).
struct ShapeSlide {
  std::string slide, annotations;
  cv::Mat truth;
};

ShapeSlide makeShapeSlide(const std::string& dir) {
  cv::Mat rgb(1024, 1024, CV_8UC3, cv::Scalar(240, 240, 240));
  cv::Mat truth = cv::Mat::zeros(512, 512, CV_8U);
  std::vector<QuPathFeature> features = {{"Background", {square(0, 0, 512, 1024)}}};
  for (int row = 0; row < 4; ++row)
    for (int col = 0; col < 4; ++col) {
      const double cx = 128 + 256 * col, cy = 128 + 256 * row;
      const bool tumor = (row + col) % 2 == 0, annotated = cx < 512;
      QuPathFeature f{tumor ? "Tumor" : "Stroma", {}};
      if (tumor) {
        cv::circle(rgb, {int(cx), int(cy)}, 70, cv::Scalar(200, 30, 30), cv::FILLED);
        cv::circle(truth, {int(cx / 2), int(cy / 2)}, 35, cv::Scalar(1), cv::FILLED);
        std::vector<std::array<double, 2>> ring;
        for (int k = 0; k < 64; ++k)
          ring.push_back({cx + 70 * std::cos(k * M_PI / 32), cy + 70 * std::sin(k * M_PI / 32)});
        f.rings.push_back(ring);
      } else {
        cv::rectangle(rgb, cv::Rect(int(cx) - 70, int(cy) - 70, 140, 140), cv::Scalar(30, 30, 200),
                      cv::FILLED);
        cv::rectangle(truth, cv::Rect(int(cx / 2) - 35, int(cy / 2) - 35, 70, 70), cv::Scalar(2), cv::FILLED);
        f.rings.push_back(square(cx - 70, cy - 70, cx + 70, cy + 70));
        if (row == 1 && col == 0) {  // a hole, white in the image
          cv::rectangle(rgb, cv::Rect(int(cx) - 25, int(cy) - 25, 50, 50), cv::Scalar(240, 240, 240),
                        cv::FILLED);
          cv::rectangle(truth, cv::Rect(int(cx / 2) - 12, int(cy / 2) - 12, 25, 25), cv::Scalar(0),
                        cv::FILLED);
          f.rings.push_back(square(cx - 25, cy - 25, cx + 25, cy + 25));
        }
      }
      if (annotated) features.push_back(f);
    }
  ShapeSlide s;
  s.slide = dir + "/slide.svs";
  test::makeSlide(rgb, dir + "/slide.tif", s.slide, 0.25, 40);
  fs::remove(dir + "/slide.tif");
  s.annotations = writeQuPathGeoJson(dir + "/slide.geojson", features);
  s.truth = truth;
  return s;
}

// The user's story: a slide at 40x, a QuPath export over half of it, training at 0.5 um/px from random
// weights in one command; per-class Dice every epoch in the report, CSV and plot; then infer with the trained
// file alone (window, um/px and classes from the file) finds the shapes of the half never annotated.
TEST_F(Finetune, ASlideAndItsQuPathAnnotationsTrainAtHalfAMicronAndInferFindsTheShapes) {
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips, tiffset and openslide-show-properties are needed";
  fs::create_directories(dir_ + "/slides");
  const ShapeSlide s = makeShapeSlide(dir_ + "/slides");
  fs::rename(s.annotations, dir_ + "/slide.geojson");
  const std::string model = writeShapeModel(dir_ + "/random.pt");
  auto r = run(kTiler + " finetune -m " + model + " -o " + dir_ + "/shapes.pt --images " + dir_ +
               "/slides --annotations " + dir_ + "/slide.geojson --classes Background,Tumor:#c81e1e,Stroma " +
               "--mpp 0.5 --window 64 --overlap 0 --batch_size 8 --epochs 8 --lr 0.05 --val_fraction 0.25 " +
               "--threads 1 --no_progress --seed 1 --save_best");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto report = readJson(dir_ + "/shapes.pt.report.json");
  ASSERT_EQ(report["epochs"].size(), 8u);
  const auto& last = report["epochs"][7];
  for (const char* name : {"Background", "Tumor", "Stroma"}) {
    EXPECT_TRUE(last["val_class_dice"].contains(name)) << name;
    EXPECT_TRUE(last["val_class_iou"].contains(name)) << name;
  }
  // The threshold: every class of the validation windows at Dice 0.8 or more.
  for (const auto& [name, dice] :
       report["epochs"][size_t(report["best"]["epoch"].get<int>() - 1)]["val_class_dice"].items())
    if (!dice.is_null()) {
      EXPECT_GT(dice.get<double>(), 0.8) << name << "\n" << report.dump(1);
    }
  EXPECT_GT(report["best"]["val_dice"].get<double>(), report["epochs"][0]["val_dice"].get<double>());
  EXPECT_TRUE(fs::exists(dir_ + "/shapes.pt.best.pt"));
  const std::string csv = test::slurp(dir_ + "/shapes.pt.epochs.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 9) << csv;
  EXPECT_NE(csv.find(",dice_Background,dice_Tumor,dice_Stroma\n"), std::string::npos) << csv;
  const cv::Mat plot = cv::imread(dir_ + "/shapes.pt.curves.png");
  EXPECT_FALSE(plot.empty());
  // Infer with the file alone: the window, --mpp 0.5 and the classes come from it.
  const auto settings = readTrainedSettings(dir_ + "/shapes.pt");
  ASSERT_TRUE(settings.has_value());
  EXPECT_EQ(settings->window, "64,64");
  EXPECT_EQ(settings->mpp, 0.5);
  auto infer = run(kTiler + " -m " + dir_ + "/shapes.pt.best.pt -i " + s.slide + " -o " + dir_ +
                   "/out --threads 1 --no_progress");
  ASSERT_EQ(infer.code, 0) << infer.output;
  const auto infer_report = readJson(dir_ + "/out/report.json");
  EXPECT_EQ(infer_report["model_card"], dir_ + "/shapes.pt.best.pt") << "the file is its own card";
  for (const char* setting : {"window", "mpp", "classes"})
    EXPECT_EQ(infer_report["settings_from"][setting], "card") << setting;
  EXPECT_EQ(infer_report["window"], nlohmann::json({64, 64}));
  EXPECT_EQ(infer_report["images"][0]["mpp"], 0.5);
  const auto labels = ImageReader::open(dir_ + "/out/slide_labels.tif");
  ASSERT_EQ(labels->info().width, 512) << "at 0.5 um/px";
  const cv::Mat predicted = labels->readRegion({256, 0, 256, 512});
  const cv::Mat truth = s.truth(cv::Rect(256, 0, 256, 512));
  for (int c = 1; c <= 2; ++c) {
    const double inter = cv::countNonZero((predicted == c) & (truth == c)),
                 uni = cv::countNonZero((predicted == c) | (truth == c));
    EXPECT_GT(inter / uni, 0.8) << "class " << c << " in the half never annotated";
  }
}

// Training at a µm/px finer than the images' is upsampling them, and says so as infer does (rank 0, once an
// image); --no_upsample refuses it. Annotations are drawn at the processing resolution, so they still fit.
TEST_F(Finetune, UpsampledImagesAreWarnedAboutAsInferWarns) {
  fs::create_directories(dir_ + "/img");
  ASSERT_TRUE(cv::imwrite(dir_ + "/img/a.png", cv::Mat(64, 64, CV_8UC3, cv::Scalar(200, 200, 200))));
  writeQuPathGeoJson(dir_ + "/a.geojson", {{"Tumor", {square(0, 0, 32, 32)}}});
  const std::string args = " finetune -m " + writeShapeModel(dir_ + "/random.pt") + " --images " + dir_ +
                           "/img --annotations " + dir_ + "/a.geojson --classes Background,Tumor,Stroma " +
                           "--window 32 --overlap 0 --val_fraction 0 --epochs 1 --threads 1 --no_progress " +
                           "--input_mpp 0.5 --mpp 0.25 -o " + dir_;
  auto r = run(kTiler + args + "/up.pt");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string warning =
      "a.png': its level 0 (0.5 um/px) is coarser than the model's 0.25 um/px: "
      "upsampled 2x by area (--no_upsample refuses)";
  EXPECT_NE(r.output.find(warning), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(warning), r.output.rfind(warning)) << r.output;
  r = run(kTiler + args + "/no.pt --no_upsample");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--no_upsample refuses it"), std::string::npos) << r.output;
}

// --class_weights auto weighs each class by the inverse of its labelled pixels in the training windows:
// with --unlabeled ignore only annotated pixels count (the Background rectangle's), with background every
// unannotated pixel is class 0 too.
TEST_F(Finetune, AutoClassWeightsCountOnlyLabelledPixels) {
  fs::create_directories(dir_ + "/img");
  cv::Mat image(128, 128, CV_8UC3, cv::Scalar(200, 200, 200));
  ASSERT_TRUE(cv::imwrite(dir_ + "/img/a.png", image));
  // Background 32x16 = 512 px, Tumor 16x16 = 256 (over Background's corner: later wins), Stroma 8x8 = 64.
  writeQuPathGeoJson(dir_ + "/a.geojson", {{"Background", {square(0, 0, 32, 16)}},
                                           {"Tumor", {square(16, 0, 32, 16)}},
                                           {"Stroma", {square(64, 64, 72, 72)}}});
  const std::string model = writeShapeModel(dir_ + "/random.pt");
  const std::string args = " finetune -m " + model + " --images " + dir_ + "/img --annotations " + dir_ +
                           "/a.geojson --window 32 --overlap 0 --mask_fraction 0 " +
                           "--val_fraction 0 --epochs 1 --threads 1 --no_progress --class_weights auto";
  const std::string classes = " --classes Background,Tumor,Stroma";
  // -o in a directory that does not exist yet: the epochs' CSV and plot, written first, make it.
  auto ignore = run(kTiler + args + classes + " -o " + dir_ + "/new/i.pt");
  ASSERT_EQ(ignore.code, 0) << ignore.output;
  EXPECT_TRUE(fs::exists(dir_ + "/new/i.pt.epochs.csv"));
  auto weights = readJson(dir_ + "/new/i.pt.report.json")["class_weights"];
  const double total = 256 + 256 + 64;
  ASSERT_EQ(weights.size(), 3u);
  EXPECT_NEAR(weights[0].get<double>(), total / (3 * 256), 1e-5);
  EXPECT_NEAR(weights[1].get<double>(), total / (3 * 256), 1e-5);
  EXPECT_NEAR(weights[2].get<double>(), total / (3 * 64), 1e-5);
  auto background = run(kTiler + args + classes + " -o " + dir_ + "/b.pt --unlabeled background");
  ASSERT_EQ(background.code, 0) << background.output;
  weights = readJson(dir_ + "/b.pt.report.json")["class_weights"];
  const double all = 128 * 128;
  EXPECT_NEAR(weights[0].get<double>(), all / (3 * (all - 256 - 64)), 1e-5);
  EXPECT_NEAR(weights[2].get<double>(), all / (3 * 64), 1e-5);
  // Unknown names stop the run, naming the class and the file.
  auto unknown = run(kTiler + args + " -o " + dir_ + "/u.pt --classes Background,Tumor,Other");
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(
      unknown.output.find("a.geojson': class 'Stroma' is not one of --classes (Background, Tumor, Other)"),
      std::string::npos)
      << unknown.output;
}

// Held-out slides validate with their own annotations (--val_images, --val_annotations); --roi draws label
// images' windows as it draws infer's; the label flags that do not go together are refused in one line.
TEST_F(Finetune, HeldOutImagesRoiAndLabelFlagsThatDoNotGoTogether) {
  for (const char* sub : {"/train", "/val", "/ann"}) fs::create_directories(dir_ + sub);
  ASSERT_TRUE(cv::imwrite(dir_ + "/train/a.png", cv::Mat(128, 128, CV_8UC3, cv::Scalar(200, 200, 200))));
  ASSERT_TRUE(cv::imwrite(dir_ + "/val/b.png", cv::Mat(128, 128, CV_8UC3, cv::Scalar(90, 90, 90))));
  // a: two of its 16 windows of 32 annotated; b: three.
  writeQuPathGeoJson(dir_ + "/ann/a.geojson", {{"Tumor", {square(0, 0, 64, 32)}}});
  writeQuPathGeoJson(dir_ + "/ann/b.geojson", {{"Stroma", {square(32, 64, 128, 96)}}});
  const std::string model = writeShapeModel(dir_ + "/random.pt");
  const std::string base =
      kTiler + " finetune -m " + model + " -o " + dir_ +
      "/x.pt --window 32 --overlap 0 --epochs 1 --threads 1 --classes Background,Tumor,Stroma ";
  auto held_out = run(base + "--images " + dir_ + "/train --annotations " + dir_ + "/ann --val_images " +
                      dir_ + "/val --val_annotations " + dir_ + "/ann");
  ASSERT_EQ(held_out.code, 0) << held_out.output;
  EXPECT_NE(held_out.output.find("finetune: 2 train / 3 val windows of 32x32"), std::string::npos)
      << held_out.output;
  const auto epoch = readJson(dir_ + "/x.pt.report.json")["epochs"][0];
  EXPECT_GT(epoch["val_class_dice"]["Stroma"].get<double>(), -1) << "b's Stroma was validated";
  // Label images with an ROI: the windows inside it only.
  fs::create_directories(dir_ + "/labels");
  ASSERT_TRUE(cv::imwrite(dir_ + "/labels/a.png", cv::Mat(128, 128, CV_8UC1, cv::Scalar(1))));
  auto roi = run(base + "--images " + dir_ + "/train --labels " + dir_ + "/labels --roi " + dir_ +
                 "/ann --val_fraction 0");
  ASSERT_EQ(roi.code, 0) << roi.output;
  EXPECT_NE(roi.output.find("finetune: 2 train / 0 val windows"), std::string::npos) << roi.output;
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--labels " + dir_ + "/labels --annotations " + dir_ + "/ann",
       "give --labels (label images), --annotations (GeoJSON) or --window_labels (CSV), one of them"},
      {"--window_labels " + dir_ + "/ann/a.geojson --loss dice",
       "--window_labels trains a model's [B,K] class scores by cross-entropy: --loss ce, not 'dice'"},
      {"--window_labels " + dir_ + "/ann/a.geojson --val_images " + dir_ + "/val --val_labels " + dir_ +
           "/labels",
       "--window_labels labels --val_images' windows too: not --val_labels or --val_annotations"},
      {"--annotations " + dir_ + "/ann --roi " + dir_ + "/ann",
       "--roi with --annotations: the annotations are the region windows are drawn from"},
      {"--annotations " + dir_ + "/ann --val_images " + dir_ + "/val --val_labels " + dir_ + "/labels",
       "--val_images needs --val_annotations as training has --annotations"},
      {"--annotations " + dir_ + "/ann --unlabeled some",
       "--unlabeled must be ignore or background; got 'some'"},
      {"--annotations " + dir_ + "/ann --class_weights 1,x,2", "--class_weights: 'x' is not a number >= 0"},
      {"--annotations " + dir_ + "/ann --class_weights 1,2",
       "--class_weights has 2 weights, the model 3 classes"},
  };
  for (const auto& [flags, message] : refused) {
    auto r = run(base + "--images " + dir_ + "/train " + flags);
    EXPECT_EQ(r.code, 1) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
  auto no_classes = run(kTiler + " finetune -m " + model + " -o " + dir_ + "/x.pt --window 32 --images " +
                        dir_ + "/train --annotations " + dir_ + "/ann");
  EXPECT_NE(no_classes.output.find("--annotations needs --classes"), std::string::npos) << no_classes.output;
}

// A forced overflow on the CPU: a first loss scale past float32's range makes the gradients infinite, so
// steps are skipped and the scale halved until they are finite; the scaler's state is checkpointed, and a
// resumed run ends with the weights of an uninterrupted one, bit for bit.
TEST_F(Finetune, AnOverflowSkipsTheStepHalvesTheScaleAndResumesBitwise) {
  const std::string args = data() + " --batch_size 4 --loss_scale 1e39 --loss_scale_growth_steps 4";
  auto straight = run(kTiler + common("straight.pt", args + " --epochs 2 --checkpoint_dir " + dir_ + "/ck1"));
  ASSERT_EQ(straight.code, 0) << straight.output;
  const auto report = readJson(dir_ + "/straight.pt.report.json");
  EXPECT_GE(report["loss_scale"]["skipped_steps"].get<int>(), 2) << "1e39 and 5e39 overflow float32";
  EXPECT_LT(report["loss_scale"]["scale"].get<double>(), 3.4e38);
  EXPECT_NE(straight.output.find("loss scale 1e+39 overflowed: step skipped, now 5e+38"), std::string::npos)
      << straight.output;
  EXPECT_GT(maxDifference(parametersOf(dir_ + "/straight.pt"), parametersOf(kSamples + "/models/init.pt")),
            1e-4)
      << "the finite steps were taken";
  auto first = run(kTiler + common("resumed.pt", args + " --epochs 1 --checkpoint_dir " + dir_ + "/ck2"));
  ASSERT_EQ(first.code, 0) << first.output;
  auto state = readJson(dir_ + "/ck2/epoch-000001/state.json");
  EXPECT_EQ(state["loss_scale"], readJson(dir_ + "/ck1/epoch-000002/state.json")["history"][0]["loss_scale"]);
  auto second =
      run(kTiler + common("resumed.pt", args + " --epochs 2 --resume --checkpoint_dir " + dir_ + "/ck2"));
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_EQ(maxDifference(parametersOf(dir_ + "/straight.pt"), parametersOf(dir_ + "/resumed.pt")), 0.0);
  EXPECT_EQ(readJson(dir_ + "/resumed.pt.report.json")["loss_scale"], report["loss_scale"]);
  // Another seed would continue another run: refused, naming both.
  auto reseeded =
      run(kTiler + " finetune -m " + kSamples + "/models/init.pt -o " + dir_ +
          "/r.pt --window 96 --overlap 0 --threads 1 --no_progress --seed 4 --epochs 3 --resume " +
          "--checkpoint_dir " + dir_ + "/ck2 " + args);
  EXPECT_EQ(reseeded.code, 1);
  EXPECT_NE(reseeded.output.find("the run used --seed 3, this one 4"), std::string::npos) << reseeded.output;
}

// A 256 x 256 image of 8 x 8 windows of 32, each red (class 1) or blue (class 0) with noise, chosen by
// `seed`; `classes` gets each window's class, row by row.
cv::Mat colourWindows(uint32_t seed, std::vector<int>& classes) {
  cv::RNG rng(seed);
  cv::Mat image(256, 256, CV_8UC3);
  for (int wy = 0; wy < 8; ++wy)
    for (int wx = 0; wx < 8; ++wx) {
      const int c = int(rng.uniform(0, 2));
      classes.push_back(c);
      cv::Mat window = image(cv::Rect(wx * 32, wy * 32, 32, 32));
      window.setTo(c ? cv::Scalar(60, 60, 200) : cv::Scalar(200, 60, 60));  // BGR: red, blue
      cv::Mat noise(32, 32, CV_8UC3);
      rng.fill(noise, cv::RNG::UNIFORM, cv::Scalar::all(0), cv::Scalar::all(50));
      window += noise;
    }
  return image;
}

// Per-window classification: a [B,K] model (samples/models/classifier.pt) learns the windows' colours from a
// CSV of window labels, validates on a held-out image, agrees across ranks, and `tiler infer` runs it.
TEST_F(Finetune, WindowLabelsTrainAClassifierThatInferRuns) {
  for (const char* sub : {"/train", "/val"}) fs::create_directories(dir_ + sub);
  std::vector<int> train_classes, val_classes;
  ASSERT_TRUE(cv::imwrite(dir_ + "/train/a.png", colourWindows(1, train_classes)));
  ASSERT_TRUE(cv::imwrite(dir_ + "/val/b.png", colourWindows(2, val_classes)));
  // a's windows by class name, all but its last row (left out: --unlabeled ignore); b's by class index.
  std::ofstream csv(dir_ + "/windows.csv");
  csv << "image,x,y,label\n";
  int counts[2] = {0, 0};
  for (int k = 0; k < 56; ++k) {
    csv << "a.png," << k % 8 * 32 << "," << k / 8 * 32 << "," << (train_classes[size_t(k)] ? "Red" : "Blue")
        << "\n";
    ++counts[train_classes[size_t(k)]];
  }
  for (int k = 0; k < 64; ++k)
    csv << "b," << k % 8 * 32 << "," << k / 8 * 32 << "," << val_classes[size_t(k)] << "\n";
  csv.close();
  const std::string base =
      " finetune -m " + kSamples + "/models/classifier.pt --images " + dir_ + "/train --val_images " + dir_ +
      "/val --window_labels " + dir_ +
      "/windows.csv --classes Blue,Red --window 32 --overlap 0 --threads 1 --no_progress "
      "--seed 5 ";
  auto trained = run(kTiler + base + "-o " + dir_ + "/c.pt --epochs 4 --lr 3e-3 --batch_size 8");
  ASSERT_EQ(trained.code, 0) << trained.output;
  EXPECT_NE(trained.output.find("finetune: 56 train / 64 val windows of 32x32"), std::string::npos)
      << trained.output;
  const auto epochs = readJson(dir_ + "/c.pt.report.json")["epochs"];
  ASSERT_EQ(epochs.size(), 4u);
  EXPECT_LT(epochs[3]["train_loss"].get<double>(), epochs[0]["train_loss"].get<double>());
  EXPECT_GE(epochs[3]["val_accuracy"].get<double>(), 0.9) << epochs;
  EXPECT_TRUE(epochs[3]["val_class_dice"].contains("Red")) << epochs;
  std::ifstream epochs_csv(dir_ + "/c.pt.epochs.csv");
  std::string header;
  std::getline(epochs_csv, header);
  EXPECT_NE(header.find(",val_accuracy,"), std::string::npos) << header;
  // infer's classify task on the held-out image: the trained model's classes are the windows' colours.
  auto infer = run(kTiler + " -m " + dir_ + "/c.pt -i " + dir_ + "/val/b.png -o " + dir_ +
                   "/infer --task classify --overlap 0 --save csv --no_progress");
  ASSERT_EQ(infer.code, 0) << infer.output;
  std::ifstream rows(dir_ + "/infer/b.csv");
  std::string line;
  std::getline(rows, line);
  EXPECT_EQ(line, "minx,miny,width,height,prob_Blue,prob_Red") << "the window and classes from the model";
  int right = 0, seen = 0;
  while (std::getline(rows, line)) {
    double x, y, w, h, blue, red;
    ASSERT_EQ(std::sscanf(line.c_str(), "%lf,%lf,%lf,%lf,%lf,%lf", &x, &y, &w, &h, &blue, &red), 6) << line;
    right += (red > blue) == (val_classes[size_t(y / 32 * 8 + x / 32)] == 1);
    ++seen;
  }
  EXPECT_EQ(seen, 64);
  EXPECT_GE(right, 58);
  // Two ranks of batch 4 reach one rank's two micro-batches of 4, with class weights of the windows' labels.
  const std::string same = base + "--epochs 1 --batch_size 4 --optimizer sgd --lr 0.05 --class_weights auto ";
  auto two = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + same + "-o " + dir_ + "/two.pt");
  ASSERT_EQ(two.code, 0) << two.output;
  auto one = run(kTiler + same + "--grad_accum_steps 2 -o " + dir_ + "/one.pt");
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_LT(maxDifference(parametersOf(dir_ + "/two.pt"), parametersOf(dir_ + "/one.pt")), 1e-5);
  EXPECT_GT(maxDifference(parametersOf(dir_ + "/one.pt"), parametersOf(kSamples + "/models/classifier.pt")),
            1e-4);
  const auto weights = readJson(dir_ + "/one.pt.report.json")["class_weights"];
  ASSERT_EQ(weights.size(), 2u);
  EXPECT_NEAR(weights[0].get<double>(), 56.0 / (2 * counts[0]), 1e-5);
  EXPECT_NEAR(weights[1].get<double>(), 56.0 / (2 * counts[1]), 1e-5);
}

// A row that is no window of the grid, or of no image, stops the run before training, naming the line.
TEST_F(Finetune, AWindowLabelOffTheGridIsNamed) {
  fs::create_directories(dir_ + "/img");
  ASSERT_TRUE(cv::imwrite(dir_ + "/img/a.png", cv::Mat(64, 64, CV_8UC3, cv::Scalar(9, 9, 9))));
  const std::string base = kTiler + " finetune -m " + kSamples + "/models/classifier.pt --images " + dir_ +
                           "/img --window 32 --overlap 0 --threads 1 --no_progress -o " + dir_ +
                           "/x.pt --window_labels " + dir_ + "/w.csv";
  std::ofstream(dir_ + "/w.csv") << "image,x,y,label\na,0,0,1\na,16,0,0\n";
  auto off = run(base);
  EXPECT_EQ(off.code, 1) << off.output;
  EXPECT_NE(off.output.find("w.csv' line 3: (16, 0) of '" + dir_ +
                            "/img/a.png' is not the level-0 top-left corner of a window of --window 32"),
            std::string::npos)
      << off.output;
  std::ofstream(dir_ + "/w.csv") << "image,x,y,label\na,0,0,1\nb,32,0,0\n";
  auto other = run(base);
  EXPECT_EQ(other.code, 1) << other.output;
  EXPECT_NE(other.output.find("w.csv' line 3: image 'b' is none of --images"), std::string::npos)
      << other.output;
  std::ofstream(dir_ + "/w.csv") << "image,x,y,label\na,0,0,2\n";
  auto too_many = run(base);
  EXPECT_EQ(too_many.code, 1) << too_many.output;
  EXPECT_NE(too_many.output.find("w.csv' line 2: class 2 but the model has 2 classes"), std::string::npos)
      << too_many.output;
  EXPECT_FALSE(fs::exists(dir_ + "/x.pt"));
}

}  // namespace
}  // namespace tiler
