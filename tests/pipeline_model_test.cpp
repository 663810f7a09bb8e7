// End-to-end tests of `tiler infer` on what the model does: running out of memory (halving), answering a
// batch wrongly or with NaN, class counts at the label type's edges, pinned pixels of a known model, model
// replicas, the BLAS it calls, a .pt2 package, a model card's per-image statistics.
#include "pipeline_util.hpp"

#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>

#include "tiler/core/cpu_layout.hpp"
#include "tiler/model/model_runtime.hpp"

namespace tiler::e2e {
namespace {

// Out of memory in a forward: the batch is retried in halves, down to one window; only the window that still
// runs out of memory alone fails its image. Rank 0's 20th window is b_mixed's first, in a batch with the last
// three of a_large (4-window runs per rank and step), so a_large must come out as in a clean run.
TEST_F(Pipeline, OutOfMemoryRetriesInHalvesAndFailsOnlyTheWindowsImage) {
  const std::string out = root_ + "/out_oom";
  // The 52 windows' rows are short, so they are stacked into one piece: rank 1 takes windows 26-51. Its
  // 11th, window 36, is b_mixed.png's second; its batch, 34-37, also holds a_large.tif's last window.
  auto r = run("TILER_FAULT=rank:1,after_windows:11,kind:oom " + kCtrun +
               " --nproc_per_node 2 --master_port 0 " + tilerArgs(out));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("out of memory in a forward of 4 windows: retrying in halves"), std::string::npos)
      << r.output;
  auto j = report(out);
  const std::string message = (*imageEntry(j, "b_mixed.png"))["error"].get<std::string>();
  EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
  EXPECT_NE(message.find("[rank 1]"), std::string::npos) << message;
  EXPECT_EQ((*imageEntry(j, "a_large.tif"))["status"], "ok") << "its window in the same batch was retried";
  EXPECT_TRUE(slurp(out + "/a_large_labels.tif") == slurp(reference() + "/a_large_labels.tif"));
  cv::Mat got = ImageReader::open(out + "/a_large_probs.tif")->readRegion({0, 0, 700, 500});
  cv::Mat want = ImageReader::open(reference() + "/a_large_probs.tif")->readRegion({0, 0, 700, 500});
  EXPECT_LT(cv::norm(got, want, cv::NORM_INF), 1e-5) << "smaller batches, the same numbers";
  EXPECT_EQ((*imageEntry(j, "e_float.tif"))["status"], "ok");
}

// A 1x1 convolution that also asks the allocator for 2^50 floats (4 PiB) for each window of a batch beyond
// its first (`even_alone`: for every window holding a non-zero pixel, so the zero window of the probe fits).
std::string memoryHungryModel(const std::string& dir, bool even_alone) {
  torch::jit::Module m("Hungry");
  torch::manual_seed(3);
  m.register_parameter("w", torch::randn({2, 3, 1, 1}), false);
  const std::string floats = even_alone ? "x.size(0) * int(bool(x.abs().sum() > 0))" : "x.size(0) - 1";
  m.define("def forward(self, x):\n    big = torch.zeros([(" + floats +
           ") * 1125899906842624])\n    return torch.conv2d(x, self.w) + big.sum()\n");
  const std::string path = dir + "/hungry" + std::to_string(even_alone) + ".pt";
  m.save(path);
  return path;
}

// A real allocation failure inside a TorchScript model reaches tiler as the interpreter's std::runtime_error,
// which keeps only the allocator's text (not c10's OutOfMemoryError type): it is retried in halves all the
// same (as a CUDA out of memory is), and a window that fails alone fails its image with that text, also on
// one process (no "failed on another rank").
TEST_F(Pipeline, AllocationFailureInsideTheModelIsRetriedInHalves) {
  auto args = [&](const std::string& model, const std::string& out, int batch) {
    // AddressSanitizer's allocator aborts on a 4 PiB request unless told to fail it as malloc does.
    return "ASAN_OPTIONS=allocator_may_return_null=1 " + kTiler + " -i " + root_ + "/images/b_mixed.png -m " +
           model + " -o " + out +
           " --window 128 --threads 1 --save labels,probs --no_progress --batch_size " +
           std::to_string(batch);
  };
  const std::string model = memoryHungryModel(root_, false);
  const std::string one = root_ + "/out_hungry1", four = root_ + "/out_hungry4";
  auto r = run(args(model, one, 1));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(args(model, four, 4));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("out of memory in a forward of 4 windows: retrying in halves"), std::string::npos)
      << r.output;
  EXPECT_TRUE(slurp(four + "/b_mixed_labels.tif") == slurp(one + "/b_mixed_labels.tif"));
  EXPECT_TRUE(slurp(four + "/b_mixed_probs.tif") == slurp(one + "/b_mixed_probs.tif"));

  const std::string failed = root_ + "/out_hungry_alone";
  r = run(args(memoryHungryModel(root_, true), failed, 4));
  EXPECT_EQ(r.code, 2) << r.output;
  const std::string message = (*imageEntry(report(failed), "b_mixed.png"))["error"].get<std::string>();
  EXPECT_NE(message.find("the model's forward failed"), std::string::npos) << message;
  EXPECT_NE(message.find("allocate"), std::string::npos) << message;
  EXPECT_EQ(message.find("another rank"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(failed + "/b_mixed_labels.tif"));
}

// A model that answers a batch with its first window's prediction alone passes the one-window probe; each
// batch of more then fails its images with the shapes named (copied into the batch's output, it would be
// broadcast to every window and written as if right).
TEST_F(Pipeline, AModelThatAnswersABatchWithFewerWindowsFailsItsImages) {
  torch::jit::Module m("FirstOnly");
  m.register_parameter("w", torch::ones({2, 3, 1, 1}), false);
  m.define("def forward(self, x):\n    return torch.conv2d(x[:1], self.w)\n");
  const std::string model = root_ + "/first_only.pt", out = root_ + "/out_first_only";
  m.save(model);
  auto r = run(kTiler + " -i " + root_ + "/images/b_mixed.png -m " + model + " -o " + out +
               " --window 128 --batch_size 4 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 2) << r.output;
  const std::string message = (*imageEntry(report(out), "b_mixed.png"))["error"].get<std::string>();
  EXPECT_NE(message.find("the model's output is [1, 2, 128, 128] for 4 windows, not [4, 2, 128, 128]"),
            std::string::npos)
      << message;
  EXPECT_FALSE(fs::exists(out + "/b_mixed_labels.tif"));
}

// A model whose forward costs `convolutions` 3x3 convolutions (3 -> 3 channels) of the window, then keeps two
// channels: 40 make a window of 256 px cost tens of milliseconds; 0: one 1x1 convolution instead (the
// light-model bar for 256 px is 2 ms, so that the choice below does not depend on how loaded the machine is).
std::string convolutionsModel(const std::string& dir, int convolutions) {
  torch::jit::Module m("Convolutions");
  torch::manual_seed(4);
  m.register_parameter("w", torch::randn({3, 3, 3, 3}) * 0.1, false);
  if (convolutions == 0)  // a 1x1 convolution 3 -> 2: 1-3 ms of one thread for 256 px, 40: about 100 ms
    m.define("def forward(self, x):\n    return torch.conv2d(x, self.w[:2, :, 1:2, 1:2])\n");
  else
    m.define("def forward(self, x):\n    for i in range(" + std::to_string(convolutions) +
             "):\n        x = torch.conv2d(x, self.w, padding=1)\n    return x[:, :2]\n");
  const std::string path = dir + "/convolutions" + std::to_string(convolutions) + ".pt";
  m.save(path);
  return path;
}

// Model replicas of one thread each write the bytes of one replica with one thread, when asked (3) and by
// default (2 CPUs here, by OMP_NUM_THREADS: 2 replicas for a heavy model; one replica of one thread for a
// model lighter than reading and stitching its windows). A window failing on a replica fails its image only.
TEST_F(Pipeline, ReplicasWriteTheBytesOfOneThreadAndFailImagesAlone) {
  const std::string ref = reference();
  const std::string three = root_ + "/out_replicas3";
  auto r = run(tilerArgs(three, "--replicas 3"));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, three);
  EXPECT_EQ(report(three)["replicas"], 3);
  EXPECT_EQ(report(three)["threads"], 1);
  EXPECT_EQ(report(three)["cpu_blas"], cpuBlasName());
  EXPECT_EQ(report(ref)["replicas"], 1) << "--threads pins one replica";

  auto defaults = [&](int convolutions, const std::string& out, const std::string& flags) {
    auto r = run("OMP_NUM_THREADS=2 " + kTiler + " -i " + root_ + "/images/a_large.tif -m " +
                 convolutionsModel(root_, convolutions) + " -o " + out +
                 " --window 256 --batch_size 4 --save labels,probs --no_progress " + flags);
    EXPECT_EQ(r.code, 0) << r.output;
    return report(out);
  };
  auto heavy = defaults(40, root_ + "/out_heavy_default", "");
  EXPECT_EQ(heavy["replicas"], 2);
  EXPECT_EQ(heavy["threads"], 1);
  defaults(40, root_ + "/out_heavy_pinned", "--threads 1");
  for (const char* kind : {"labels", "probs"}) {
    const std::string name = std::string("/a_large_") + kind + ".tif";
    EXPECT_TRUE(slurp(root_ + "/out_heavy_default" + name) == slurp(root_ + "/out_heavy_pinned" + name))
        << kind;
  }
  auto light = defaults(0, root_ + "/out_light_default", "");
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (A sanitizer's allocator faults in fresh pages for every buffer it hands out: the light model's cost
  // there is not the model's.)
  EXPECT_EQ(light["replicas"], 1);
#endif
  EXPECT_EQ(light["threads"], 1);

  const std::string faulted = root_ + "/out_replicas_fault";
  r = run("TILER_FAULT=rank:0,after_windows:6,kind:throw,stage:forward " +
          tilerArgs(faulted, "--replicas 2"));
  EXPECT_EQ(r.code, 2) << r.output;
  auto j = report(faulted);
  EXPECT_EQ((*imageEntry(j, "a_large.tif"))["status"], "error");
  EXPECT_FALSE(fs::exists(faulted + "/a_large_labels.tif"));
  for (const char* stem : {"b_mixed", "c_small", "d_gray16", "e_float"})
    EXPECT_TRUE(slurp(faulted + "/" + std::string(stem) + "_probs.tif") ==
                slurp(ref + "/" + std::string(stem) + "_probs.tif"))
        << stem;
  EXPECT_TRUE(partialFiles(faulted).empty());
}

// Without --threads and --replicas, a model heavier than its windows' reading and stitching times its first
// batches as one replica of both threads and as two replicas of one, and the faster runs the rest: the report
// gives both timings and keeps the faster; either flag skips the timing. The report's stage seconds: the main
// thread's parts, each >= 0, add up to the rank's wall within 5 % (which the process's own outlasts); the
// other threads' busy seconds stand apart.
TEST_F(Pipeline, TheLayoutIsTimedAndTheStagesAddUpToTheWall) {
  // 40 convolutions: far over the light-model bar (8 sat near it, and a loaded machine judged it light at
  // times: one replica of one thread, nothing timed).
  const std::string model = convolutionsModel(root_, 40);
  double elapsed = 0;
  auto job = [&](const std::string& out, const std::string& flags) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = run("OMP_NUM_THREADS=2 " + kTiler + " -i " + root_ + "/images/a_large.tif -m " + model + " -o " +
                 out + " --window 96 --batch_size 1 --save labels,probs --no_progress " + flags);
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.code, 0) << r.output;
    return report(out);
  };
  const auto timed = job(root_ + "/out_layout_timed", "");
  const double process = elapsed;
  ASSERT_TRUE(timed.contains("layouts_timed")) << timed.dump();
  const auto& layouts = timed["layouts_timed"];
  ASSERT_TRUE(layouts.contains("1x2") && layouts.contains("2x1")) << layouts.dump();
  const std::string kept =
      std::to_string(timed["replicas"].get<int>()) + "x" + std::to_string(timed["threads"].get<int>());
  ASSERT_TRUE(layouts.contains(kept)) << kept;
  for (const auto& [layout, seconds] : layouts.items()) {
    EXPECT_GT(seconds.get<double>(), 0) << layout;
    EXPECT_LE(layouts[kept].get<double>(), seconds.get<double>()) << "the faster layout is kept";
  }
  for (const char* flags : {"--replicas 2", "--threads 2"})
    EXPECT_FALSE(
        job(root_ + "/out_layout_flags", flags + std::string(" --overwrite")).contains("layouts_timed"))
        << flags;

  const auto& rank = timed["per_rank"][0];
  const auto& stages = rank["stages"];
  const double wall = stages["wall"].get<double>();
  EXPECT_GT(wall, 0);
  EXPECT_LE(wall, process + 0.05) << "the process outlasts the rank's wall";
  double sum = 0;
  for (const auto& [part, seconds] : stages["critical_path"].items()) {
    EXPECT_GE(seconds.get<double>(), 0) << part;
    sum += seconds.get<double>();
  }
  EXPECT_NEAR(sum, wall, 0.05 * wall) << stages.dump(2);
  EXPECT_NEAR(stages["critical_path_sum"].get<double>(), sum, 1e-9);
  EXPECT_GT(stages["critical_path"]["libtorch"].get<double>(), 0);
  EXPECT_GT(stages["critical_path"]["model_load"].get<double>(), 0);
  EXPECT_NEAR(rank["libtorch_seconds"].get<double>() + rank["model_load_seconds"].get<double>() +
                  rank["probe_seconds"].get<double>() + rank["setup_seconds"].get<double>(),
              rank["startup_seconds"].get<double>(), 1e-6)
      << "start-up's parts";
  for (const auto& [stage, seconds] : stages["overlapped"].items())
    EXPECT_GE(seconds.get<double>(), 0) << stage;
  EXPECT_GT(stages["overlapped"]["normalize"].get<double>(), 0);
  EXPECT_GT(stages["overlapped"]["forward"].get<double>(), stages["overlapped"]["normalize"].get<double>());
}

// A model whose bytes depend on the intra-op threads (a sum long enough for LibTorch to split between
// threads) is not timed: the default keeps replicas of one thread and writes what one thread writes, as 2
// ranks would.
TEST_F(Pipeline, LayoutsAreTimedOnlyWhereThreadsChangeNoByte) {
  torch::jit::Module m("ThreadSum");
  torch::manual_seed(4);
  m.register_parameter("w", torch::randn({3, 3, 3, 3}) * 0.1, false);
  // Products of the window and fixed random weights (the same bits however a graph executor fuses them),
  // summed in an order that depends on the threads.
  m.register_parameter("r", torch::randn({1, 3, 192, 192}), false);
  m.define(
      "def forward(self, x):\n    y = x\n    for i in range(40):\n        y = torch.conv2d(y, self.w, "
      "padding=1)\n    return y[:, :2] + (x.repeat(1, 1, 2, 2) * self.r).sum() * 0.001\n");
  const std::string model = root_ + "/thread_sum.pt";
  m.save(model);
  auto job = [&](const std::string& out, const std::string& flags) {
    auto r = run("OMP_NUM_THREADS=2 " + kTiler + " -i " + root_ + "/images/a_large.tif -m " + model + " -o " +
                 out + " --window 96 --batch_size 1 --save labels,probs --no_progress " + flags);
    EXPECT_EQ(r.code, 0) << r.output;
    return report(out);
  };
  const auto untimed = job(root_ + "/out_thread_sum", "");
  EXPECT_FALSE(untimed.contains("layouts_timed")) << untimed.dump();
  EXPECT_EQ(untimed["threads"], 1);
  job(root_ + "/out_thread_sum_one", "--replicas 2 --threads 1");
  expectSameOutputs(root_ + "/out_thread_sum_one", root_ + "/out_thread_sum", 2);
}

// Freeze + optimize_for_inference is the default where the probe's check finds the model's outputs within
// kJitOptimizeTolerance: a model whose outputs are random (an op left in training mode) runs as loaded and
// the report says why; --no_jit_optimize and bf16 run as loaded; the two flags together are refused.
TEST_F(Pipeline, JitOptimizeIsTheDefaultWhereItChangesNoOutput) {
  torch::jit::Module noisy("Noisy");
  noisy.register_parameter("w", torch::ones({2, 3, 1, 1}), false);
  noisy.define("def forward(self, x):\n    return torch.conv2d(x, self.w) + torch.rand_like(x[:, :2])\n");
  const std::string noisy_path = root_ + "/noisy.pt";
  noisy.save(noisy_path);
  auto job = [&](const std::string& out, const std::string& model, const std::string& flags) {
    return run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + model + " -o " + out +
               " --window 128 --batch_size 4 --threads 1 --save labels --no_progress " + flags);
  };
  const std::string plain = convolutionsModel(root_, 0);
  struct Case {
    std::string name, model, flags;
    bool optimized;
    std::string why;
  };
  for (const Case& c :
       {Case{"default", plain, "", true, ""}, Case{"off", plain, "--no_jit_optimize", false, ""},
        Case{"bf16", plain, "--precision bf16", false, "--precision bf16"},
        Case{"noisy", noisy_path, "", false, "differs from the model's as loaded"}}) {
    const std::string out = root_ + "/out_jit_" + c.name;
    auto r = job(out, c.model, c.flags);
    ASSERT_EQ(r.code, 0) << c.name << ": " << r.output;
    const auto j = report(out);
    EXPECT_EQ(j["jit_optimize"], c.optimized) << c.name;
    if (c.why.empty()) {
      EXPECT_FALSE(j.contains("jit_optimize_fallback")) << c.name << ": " << j.dump();
    } else {
      ASSERT_TRUE(j.contains("jit_optimize_fallback")) << c.name;
      EXPECT_NE(j["jit_optimize_fallback"].get<std::string>().find(c.why), std::string::npos)
          << j["jit_optimize_fallback"];
    }
  }
  auto r = job(root_ + "/out_jit_both", plain, "--jit_optimize --no_jit_optimize");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--jit_optimize and --no_jit_optimize"), std::string::npos) << r.output;
}

// Debian's reference BLAS (libblas3) first on the library path: the start-up warns, the report names it.
TEST_F(Pipeline, AReferenceBlasIsNamedAndWarnedAbout) {
  std::string reference;
  for (const auto& e : fs::directory_iterator("/usr/lib"))
    if (fs::exists(e.path() / "blas/libblas.so.3")) reference = (e.path() / "blas").string();
  if (reference.empty()) GTEST_SKIP() << "Debian's libblas3 is not installed";
  auto tiler = [&](const std::string& env, const std::string& out) {
    auto r = run(env + kTiler + " -i " + root_ + "/images/c_small.png -m " + model_ + " -o " + out +
                 " --window 64 --threads 1 --no_progress");
    EXPECT_EQ(r.code, 0) << r.output;
    return std::make_pair(r.output, report(out)["cpu_blas"].get<std::string>());
  };
  auto [slow_log, slow] = tiler("LD_LIBRARY_PATH=" + reference + " ", root_ + "/out_blas_reference");
  EXPECT_EQ(slow, kReferenceBlas);
  EXPECT_NE(slow_log.find("LibTorch calls the reference BLAS"), std::string::npos) << slow_log;
  auto [log, installed] = tiler("", root_ + "/out_blas_installed");
  EXPECT_EQ(installed, cpuBlasName());
  EXPECT_NE(installed, kReferenceBlas);
  EXPECT_EQ(log.find("reference BLAS"), std::string::npos) << log;
}

// A model with `classes` output channels (1x1 convolution), for the labels type at its edges.
std::string classesModel(const std::string& dir, int classes) {
  torch::jit::Module m("Classes");
  torch::manual_seed(classes);
  m.register_parameter("w", torch::randn({classes, 3, 1, 1}), false);
  m.define("def forward(self, x):\n    return torch.conv2d(x, self.w)\n");
  const std::string path = dir + "/classes" + std::to_string(classes) + ".pt";
  m.save(path);
  return path;
}

TEST_F(Pipeline, ClassCountsAtTheLabelTypeEdges) {
  for (int classes : {255, 256, 257}) {
    const std::string out = root_ + "/out_classes" + std::to_string(classes);
    auto r = run(kTiler + " -i " + root_ + "/images/b_mixed.png -m " + classesModel(root_, classes) + " -o " +
                 out + " --window 128 --threads 1 --save labels,probs --no_progress");
    ASSERT_EQ(r.code, 0) << classes << ": " << r.output;
    auto labels = ImageReader::open(out + "/b_mixed_labels.tif");
    EXPECT_EQ(labels->info().type, classes <= 256 ? SampleType::kU8 : SampleType::kU16) << classes;
    // Labels are the argmax of the stored probabilities, up to the last class id.
    cv::Mat l = labels->readRegion({0, 0, 300, 200});
    cv::Mat p = ImageReader::open(out + "/b_mixed_probs.tif")->readRegion({0, 0, 300, 200});
    int mismatches = 0;
    for (int y = 0; y < 200; y += 7)
      for (int x = 0; x < 300; x += 7) {
        const float* v = p.ptr<float>(y) + x * classes;
        const int best = int(std::max_element(v, v + classes) - v);
        const int got = l.depth() == CV_8U ? l.at<uint8_t>(y, x) : l.at<uint16_t>(y, x);
        mismatches += best != got;
      }
    EXPECT_EQ(mismatches, 0) << classes;
  }
}

TEST_F(Pipeline, NonFiniteModelOutputsAreCountedAndWarnedAbout) {
  torch::jit::Module m("HalfNan");
  m.register_parameter("w", torch::ones({2, 3, 1, 1}), false);
  // Class 1 is NaN where the input's red channel is over a half.
  m.define(R"JIT(
def forward(self, x):
    y = torch.conv2d(x, self.w)
    nan = torch.full_like(y[:, :1], float('nan'))
    return torch.cat([y[:, :1], torch.where(x[:, :1] > 0.5, nan, y[:, 1:])], 1)
)JIT");
  const std::string model = root_ + "/half_nan.pt", out = root_ + "/out_nan";
  m.save(model);
  auto r = run(kTiler + " -i " + root_ + "/images/c_small.png -m " + model + " -o " + out +
               " --window 32 --batch_size 4 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("of the predictions are not finite (the model gave NaN or Inf)"), std::string::npos)
      << r.output;
  const nlohmann::json j = report(out), ref = report(reference());
  const auto& e = *imageEntry(j, "c_small.png");
  EXPECT_GT(e.value("non_finite_values", int64_t(0)), 0) << e.dump();
  // A model without any: no field, no warning.
  EXPECT_EQ(imageEntry(ref, "c_small.png")->count("non_finite_values"), 0u);
}

// A fixture of known values, independent of tiler's own code: a 3x3 convolution of explicit weights over an
// image of integer formulas. Where every window that covers a pixel sees its whole 3x3 neighbourhood, the
// stitched value is the convolution of the whole image, computed here; on a window's edge (its zero padding
// blended with the neighbour's view by the Gaussian weights) the values are pinned as recorded.
TEST_F(Pipeline, PinnedPixelsOfAKnownModelAndImage) {
  const int W = 96, H = 80;
  cv::Mat img(H, W, CV_8UC3);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      img.at<cv::Vec3b>(y, x) = cv::Vec3b(uint8_t((7 * x + 3 * y) % 256), uint8_t((x * x + y) % 256),
                                          uint8_t((x ^ y) & 255));  // R, G, B as the writer takes them
  const std::string dir = root_ + "/pinned", out = root_ + "/out_pinned", model = root_ + "/pinned.pt";
  fs::create_directories(dir);
  writeImage(dir + "/pinned.tif", img, SampleType::kU8);
  // Class 0: the 3x3 mean of the three channels; class 1: the Laplacian of the first.
  const float lap[9] = {0, -1, 0, -1, 4, -1, 0, -1, 0};
  auto w = torch::zeros({2, 3, 3, 3});
  w[0].fill_(1.0 / 27);
  for (int k = 0; k < 9; ++k) w[1][0][k / 3][k % 3] = lap[k];
  torch::jit::Module m("Pinned");
  m.register_parameter("w", w, false);
  m.define(R"JIT(
def forward(self, x):
    return torch.conv2d(x, self.w, padding=1)
)JIT");
  m.save(model);
  auto r = run(kTiler + " -i " + dir + " -m " + model + " -o " + out +
               " --window 32 --overlap 0.25 --batch_size 4 --threads 1 --save probs --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  const cv::Mat probs = ImageReader::open(out + "/pinned_probs.tif")->readRegion({0, 0, W, H});
  ASSERT_EQ(probs.type(), CV_32FC2);
  auto at = [&](int x, int y, int c) { return probs.ptr<float>(y)[x * 2 + c]; };
  auto sample = [&](int x, int y, int c) {
    if (x < 0 || y < 0 || x >= W || y >= H) return 0.0;  // --pad constant --cval 0
    return img.at<cv::Vec3b>(y, x)[c] / 255.0;
  };
  auto conv = [&](int x, int y, int cls) {
    double v = 0;
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx)
        for (int c = 0; c < 3; ++c)
          v += double(w[cls][c][dy + 1][dx + 1].item<float>()) * sample(x + dx, y + dy, c);
    return v;
  };
  // Windows start every 24 px; a window's first and last columns and rows see its padding.
  const auto window_edge = [](int v, int size) {
    std::vector<int> starts;
    for (int s = 0; s + 32 < size; s += 24) starts.push_back(s);
    starts.push_back(size - 32);
    for (int s : starts)
      if (v >= s && v < s + 32 && (v == s || v == s + 31) && v != 0 && v != size - 1) return true;
    return false;
  };
  int compared = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      if (window_edge(x, W) || window_edge(y, H)) continue;
      for (int cls = 0; cls < 2; ++cls) ASSERT_NEAR(at(x, y, cls), conv(x, y, cls), 1e-5) << x << "," << y;
      ++compared;
    }
  EXPECT_GT(compared, W * H / 2);
  // Recorded (window edges, where the blend decides): the left window's last column, the right's first.
  const struct {
    int x, y, cls;
    float value;
  } pinned[] = {{31, 10, 0, 0.474814862f},
                {31, 10, 1, 0.0239240564f},
                {24, 10, 1, 0.0179902539f},
                {31, 31, 1, 0.0664063841f}};
  for (const auto& p : pinned) {
    EXPECT_NEAR(at(p.x, p.y, p.cls), p.value, 1e-5) << p.x << "," << p.y;
    EXPECT_GT(std::abs(p.value - conv(p.x, p.y, p.cls)), 1e-3)
        << "a window edge differs from the whole image's";
  }
}

// A .pt2 package of the sample UNet, where this build runs packages and a Python here exports them (the
// LibTorch 2.6 stage of CI): the same bytes on 1, 2 and 3 ranks, and what the TorchScript sample gives.
TEST_F(Pipeline, Pt2PackageIsByteIdenticalAcrossRanksAndRunsLikeItsTorchScript) {
  if (!pt2Supported()) GTEST_SKIP() << pt2Unsupported();
  const std::string dir = root_ + "/pt2";
  fs::create_directories(dir + "/images");
  std::string why;
  const std::string package = test::exportSamplePt2(dir, 64, &why);
  if (package.empty()) GTEST_SKIP() << why;
  writeImage(dir + "/images/wave.tif", pattern(300, 420, CV_8UC3, 255), SampleType::kU8);
  const std::string sample = std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/sample.pt";
  const auto args = [&dir](const std::string& model, const std::string& out) {
    return kTiler + " -i " + dir + "/images -m " + model + " -o " + dir + "/" + out +
           " --window 64 --batch_size 4 --threads 1 --save labels,probs --no_progress";
  };
  auto one = run(args(package, "one"));
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_EQ(report(dir + "/one")["runtime"], "pt2");
  for (int n : {2, 3}) {
    const std::string out = "ranks" + std::to_string(n);
    auto r =
        run(kCtrun + " --nproc_per_node " + std::to_string(n) + " --master_port 0 " + args(package, out));
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* f : {"/wave_labels.tif", "/wave_probs.tif"})
      EXPECT_TRUE(slurp(dir + "/one" + f) == slurp(dir + "/" + out + f)) << n << " ranks: " << f;
  }
  auto script = run(args(sample, "script"));
  ASSERT_EQ(script.code, 0) << script.output;
  EXPECT_EQ(report(dir + "/script")["runtime"], "torchscript");
  const cv::Mat p = ImageReader::open(dir + "/one/wave_probs.tif")->readRegion({0, 0, 420, 300});
  const cv::Mat q = ImageReader::open(dir + "/script/wave_probs.tif")->readRegion({0, 0, 420, 300});
  EXPECT_LT(cv::norm(p, q, cv::NORM_INF), 1e-5);
  const cv::Mat a = ImageReader::open(dir + "/one/wave_labels.tif")->readRegion({0, 0, 420, 300});
  const cv::Mat b = ImageReader::open(dir + "/script/wave_labels.tif")->readRegion({0, 0, 420, 300});
  EXPECT_LE(cv::countNonZero(a != b), 420 * 300 / 10000) << "labels differ only where two classes tie";
}

// A card whose preprocessing reads each image's statistics: they are the whole image's (NumPy's over it, not
// any window's), the same on one rank and two, and so are the outputs' bytes; 8-bit and float images alike.
TEST_F(Pipeline, CardStatisticsAreOfTheWholeImageAndTheSameOnEveryRank) {
  const std::string dir = root_ + "/card_stats";
  fs::create_directories(dir + "/pkg");
  fs::create_directories(dir + "/images");
  fs::copy_file(model_, dir + "/pkg/weights.pt");
  fs::copy_file(root_ + "/images/b_mixed.png", dir + "/images/b_mixed.png");
  fs::copy_file(root_ + "/images/e_float.tif", dir + "/images/e_float.tif");
  std::ofstream(dir + "/pkg/rdf.yaml") << R"(type: model
format_version: 0.5.4
name: statistics
inputs:
  - id: raw
    axes:
      - type: batch
      - type: channel
        channel_names: [r, g, b]
      - {type: space, id: y, size: 64}
      - {type: space, id: x, size: 64}
    test_tensor: {source: test_input.npy}
    preprocessing:
      - {id: scale_range, kwargs: {axes: [channel, y, x], min_percentile: 2, max_percentile: 98}}
      - {id: zero_mean_unit_variance, kwargs: {axes: [y, x]}}
outputs:
  - id: probs
    axes:
      - type: batch
      - type: channel
        channel_names: [a, b]
      - {type: space, id: y, size: {tensor_id: raw, axis_id: y}}
      - {type: space, id: x, size: {tensor_id: raw, axis_id: x}}
    test_tensor: {source: test_output.npy}
    postprocessing:
      - {id: softmax}
weights:
  torchscript: {source: weights.pt}
)";
  const std::string args =
      " -i " + dir + "/images -m " + dir + "/pkg --threads 1 --save probs --no_progress -o ";
  const auto one = run(kTiler + args + dir + "/one");
  ASSERT_EQ(one.code, 0) << one.output;
  const auto two = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + args + dir + "/two");
  ASSERT_EQ(two.code, 0) << two.output;
  for (const std::string name : {"b_mixed_probs.tif", "e_float_probs.tif"})
    EXPECT_TRUE(slurp(dir + "/one/" + name) == slurp(dir + "/two/" + name))
        << name << ": two ranks, the same bytes";
  // NumPy's statistics of the whole image, and of its first 64x64 window (which must differ, or this test
  // could not tell them apart).
  std::ofstream(dir + "/stats.py") << R"(import sys, json, numpy as np
from PIL import Image
x = np.asarray(Image.open(sys.argv[1])).astype(np.float64)
if x.ndim == 2: x = x[:, :, None]
def of(a):
    c = a.reshape(-1, a.shape[2])
    return {'mean': list(c.mean(0)), 'std': list(c.std(0)), 'p2': np.percentile(c, 2), 'p98': np.percentile(c, 98)}
print(json.dumps({'image': of(x), 'window': of(x[:64, :64])}))
)";
  const auto numpy = run("/usr/bin/python3 " + dir + "/stats.py " + dir + "/images/b_mixed.png");
  if (numpy.code != 0) GTEST_SKIP() << "no NumPy or PIL: " << numpy.output;
  const auto want = nlohmann::json::parse(numpy.output);
  for (const std::string out : {"one", "two"}) {
    const auto j = report(dir + "/" + out);
    const auto* e = imageEntry(j, "b_mixed.png");
    ASSERT_NE(e, nullptr);
    const auto& got = (*e)["input_statistics"];
    for (size_t c = 0; c < 3; ++c) {
      EXPECT_NEAR(got["mean"][c].get<double>(), want["image"]["mean"][c].get<double>(), 1e-9) << out;
      EXPECT_NEAR(got["std"][c].get<double>(), want["image"]["std"][c].get<double>(), 1e-9) << out;
      EXPECT_EQ(got["count"][c].get<double>(), 200.0 * 300.0);
    }
    EXPECT_NEAR(got["all"]["percentiles"]["2"].get<double>(), want["image"]["p2"].get<double>(), 1e-9);
    EXPECT_NEAR(got["all"]["percentiles"]["98"].get<double>(), want["image"]["p98"].get<double>(), 1e-9);
    // The map the run used (the card's scale 1: raw values), composed by hand from NumPy's numbers.
    const double p2 = want["image"]["p2"], p98 = want["image"]["p98"];
    for (size_t c = 0; c < 3; ++c) {
      const double a = 1 / (p98 - p2 + 1e-6), b = -p2 * a;
      const double mean = a * want["image"]["mean"][c].get<double>() + b,
                   std = a * want["image"]["std"][c].get<double>();
      const double gain = a / (std + 1e-6), offset = (b - mean) / (std + 1e-6);
      EXPECT_NEAR((*e)["input_normalisation"]["gain"][c].get<double>(), gain, 1e-9 * std::abs(gain));
      EXPECT_NEAR((*e)["input_normalisation"]["offset"][c].get<double>(), offset,
                  1e-9 * std::abs(offset) + 1e-12);
    }
  }
  EXPECT_GT(std::abs(want["window"]["mean"][0].get<double>() - want["image"]["mean"][0].get<double>()), 1e-3)
      << "the window's statistics differ from the image's";
  // The float image: percentiles within one bin of its range, the extremes exact.
  const auto one_report = report(dir + "/one");
  const auto* f = imageEntry(one_report, "e_float.tif");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE((*f)["input_statistics"]["all"]["percentiles"].contains("98"));
  EXPECT_EQ((*f)["status"], "ok");
  // An image whose pixels cannot be read for its statistics (a deflate strip overwritten; its header is
  // whole) fails as an unreadable image does, naming the file; the other image runs.
  fs::create_directories(dir + "/broken_images");
  fs::copy_file(root_ + "/images/b_mixed.png", dir + "/broken_images/b_mixed.png");
  std::ofstream(dir + "/broken.py") << R"(import sys, numpy as np
from PIL import Image
Image.fromarray((np.random.RandomState(0).rand(200, 300, 3) * 255).astype(np.uint8)).save(sys.argv[1], compression='tiff_deflate')
b = bytearray(open(sys.argv[1], 'rb').read())
b[len(b) // 2:len(b) // 2 + 2000] = b'U' * 2000
open(sys.argv[1], 'wb').write(bytes(b))
)";
  const auto made = run("/usr/bin/python3 " + dir + "/broken.py " + dir + "/broken_images/broken.tif");
  ASSERT_EQ(made.code, 0) << made.output;
  const auto broken = run(kTiler + " -i " + dir + "/broken_images -m " + dir +
                          "/pkg --threads 1 --save probs --no_progress -o " + dir + "/broken");
  EXPECT_EQ(broken.code, 2) << broken.output;
  const auto broken_report = report(dir + "/broken");
  const auto* b = imageEntry(broken_report, "broken.tif");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ((*b)["status"], "error");
  EXPECT_NE((*b)["error"].get<std::string>().find("broken.tif': reading its statistics: "), std::string::npos)
      << (*b)["error"];
  EXPECT_EQ((*imageEntry(broken_report, "b_mixed.png"))["status"], "ok");
}

}  // namespace
}  // namespace tiler::e2e
