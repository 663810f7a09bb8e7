// End-to-end tests of `tiler infer`: real processes, launched through ctrun or with launcher variables.
#include "tiler/infer/pipeline.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <tiffio.h>
#include <torch/script.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <sstream>

#include "range_server.hpp"
#include "slide_util.hpp"
#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/model/model.hpp"
#include "tiler/model/model_runtime.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace tiler {
namespace {

// Set before any test starts a process (see test_util.hpp).
const bool kChildrenOnCpu = (test::pinChildProcessesToCpu(), true);

const std::string kCtrun = std::string(TILER_BIN_DIR) + "/ctrun";
const std::string kTiler = std::string(TILER_BIN_DIR) + "/tiler";

using test::freePort;
using test::slurp;
auto run = test::runCommand;

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

class Pipeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
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

  static void expectSameOutputs(const std::string& a, const std::string& b) {
    int files = 0;
    for (const auto& e : fs::directory_iterator(a)) {
      if (e.path().extension() != ".tif") continue;
      ++files;
      EXPECT_TRUE(slurp(e.path().string()) == slurp(b + "/" + e.path().filename().string()))
          << e.path().filename();
    }
    EXPECT_EQ(files, 10);
  }

  static nlohmann::json report(const std::string& out) {
    return nlohmann::json::parse(slurp(out + "/report.json"));
  }

  static std::string root_, model_, ref_;
};

std::string Pipeline::root_;
std::string Pipeline::model_;
std::string Pipeline::ref_;

TEST_F(Pipeline, WorldSizesOneToFourAreByteIdentical) {
  const std::string ref = reference();
  for (int n = 1; n <= 4; ++n) {
    const std::string out = root_ + "/out_w" + std::to_string(n);
    runCtrun(n, out);
    expectSameOutputs(ref, out);
    EXPECT_EQ(report(out)["world_size"], n);
    EXPECT_EQ(report(out)["gather"], n == 1 ? "none" : "shared_memory") << "ranks of one host";
    // Every rank writes the images it owns: together all of them, and every byte of the outputs.
    int64_t owned = 0, bytes = 0, files = 0;
    const nlohmann::json j = report(out);  // alive while the loop reads it
    for (const auto& r : j["per_rank"]) {
      owned += r["images_owned"].get<int64_t>();
      bytes += r["bytes_written"].get<int64_t>();
      EXPECT_GT(r["bytes_written"].get<int64_t>(), 0) << "rank " << r["rank"] << " of " << n;
    }
    for (const auto& e : fs::directory_iterator(out))
      if (e.path().extension() == ".tif") files += int64_t(fs::file_size(e.path()));
    EXPECT_EQ(owned, 5);
    EXPECT_EQ(bytes, files);
  }
  // Through gloo's sockets, the same bytes.
  const std::string out = root_ + "/out_w3_sockets";
  runCtrun(3, out, "--no_shared_memory");
  expectSameOutputs(ref, out);
  EXPECT_EQ(report(out)["gather"], "gloo");
}

TEST_F(Pipeline, ReportHasEveryField) {
  auto j = report(reference());
  for (const char* key : {"world_size", "backend", "device", "precision", "seconds", "windows_total",
                          "windows_per_second", "per_rank", "images", "gather"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["backend"], "gloo");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["precision"], "fp32");
  for (const char* key : {"rank", "windows", "read_seconds", "forward_seconds", "gather_seconds",
                          "peak_rss_mb", "tiles_decoded", "write_seconds", "bytes_written", "images_owned"})
    EXPECT_TRUE(j["per_rank"][0].contains(key)) << key;
  EXPECT_EQ(j["shard_run"], j["windows_total"]) << "one rank: every window in a row";
  ASSERT_EQ(j["images"].size(), 5u);
  int64_t windows = 0;
  for (const auto& img : j["images"]) {
    EXPECT_EQ(img["status"], "ok") << img.dump();
    windows += img["windows"].get<int64_t>();
    for (const char* kind : {"labels", "probs"})
      EXPECT_TRUE(fs::exists(img["outputs"][kind].get<std::string>()));
  }
  EXPECT_EQ(j["windows_total"], windows);
  EXPECT_EQ(j["per_rank"][0]["windows"], windows);
  auto small = j["images"][2];
  EXPECT_EQ(small["width"], 50);
  EXPECT_EQ(small["windows"], 1) << "an image smaller than the window is padded to one window";
}

TEST_F(Pipeline, OutputsHaveTheInputsSizeAndTypes) {
  const std::string ref = reference();
  auto labels = ImageReader::open(ref + "/a_large_labels.tif");
  EXPECT_EQ(labels->info().width, 700);
  EXPECT_EQ(labels->info().height, 500);
  EXPECT_EQ(labels->info().type, SampleType::kU8);
  auto probs = ImageReader::open(ref + "/c_small_probs.tif");
  EXPECT_EQ(probs->info().width, 50);
  EXPECT_EQ(probs->info().channels, 2);
  EXPECT_EQ(probs->info().type, SampleType::kF32);
  // Labels are the argmax of the stored probabilities.
  auto p = ImageReader::open(ref + "/a_large_probs.tif")->readRegion({0, 0, 700, 500});
  auto l = labels->readRegion({0, 0, 700, 500});
  int mismatches = 0;
  for (int y = 0; y < 500; ++y)
    for (int x = 0; x < 700; ++x) {
      const float* v = p.ptr<float>(y) + x * 2;
      mismatches += (v[1] > v[0] ? 1 : 0) != l.ptr<uint8_t>(y)[x];
    }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Pipeline, ResumeSkipsFinishedImagesAndOverwriteRedoesThem) {
  const std::string out = root_ + "/out_resume";
  auto first = run(tilerArgs(out));
  ASSERT_EQ(first.code, 0) << first.output;
  auto again = run(tilerArgs(out));
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.output.find("outputs exist already"), std::string::npos) << again.output;
  const auto stamp = fs::last_write_time(out + "/a_large_labels.tif");
  fs::remove(out + "/b_mixed_probs.tif");
  auto resumed = run(tilerArgs(out, "--resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  auto j = report(out);
  EXPECT_EQ(j["images"][0]["status"], "skipped");
  EXPECT_EQ(j["images"][1]["status"], "ok") << "one output missing: redone";
  EXPECT_EQ(fs::last_write_time(out + "/a_large_labels.tif"), stamp);
  expectSameOutputs(reference(), out);
  auto over = run(tilerArgs(out, "--overwrite"));
  ASSERT_EQ(over.code, 0) << over.output;
  EXPECT_NE(fs::last_write_time(out + "/a_large_labels.tif"), stamp);
  expectSameOutputs(reference(), out);
}

TEST_F(Pipeline, RendezvousTimeoutIsAClearDistError) {
  const int port = freePort();
  auto r = run("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
               " " + tilerArgs(root_ + "/out_timeout", "--timeout 2"));
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 60) << "the 2 s --timeout, not the default 300 s, ended the wait";
  EXPECT_NE(r.output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
}

void runTwoWithEnv(const std::string& rank_var, const std::string& size_var, const std::string& cmd) {
  const std::string port = std::to_string(freePort());
  std::vector<std::string> commands;
  for (int r = 0; r < 2; ++r)
    commands.push_back(rank_var + "=" + std::to_string(r) + " " + size_var +
                       "=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " + cmd);
  for (int code : test::runConcurrently(commands)) EXPECT_EQ(code, 0) << rank_var << " run failed";
}

TEST_F(Pipeline, RunsUnderSlurmAndOpenMpiVariables) {
  const std::string slurm = root_ + "/out_slurm";
  runTwoWithEnv("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID=0 " + tilerArgs(slurm));  // srun's step
  expectSameOutputs(reference(), slurm);
  EXPECT_EQ(report(slurm)["world_size"], 2);
  const std::string mpi = root_ + "/out_mpi";
  runTwoWithEnv("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", tilerArgs(mpi));
  expectSameOutputs(reference(), mpi);
}

TEST_F(Pipeline, TwoCtrunNodesOnLoopbackFormOneWorld) {
  const std::string out = root_ + "/out_nodes";
  const std::string port = std::to_string(freePort());
  std::vector<std::string> commands;
  for (int node = 0; node < 2; ++node)
    commands.push_back(kCtrun + " --nnodes 2 --node_rank " + std::to_string(node) +
                       " --nproc_per_node 2 --master_port " + port + " " + tilerArgs(out));
  for (int code : test::runConcurrently(commands)) EXPECT_EQ(code, 0);
  EXPECT_EQ(report(out)["world_size"], 4);
  expectSameOutputs(reference(), out);
}

// PyTorch's own torchrun (python3-torch), or "" when it is missing. Debian's 1.13 under Python 3.11 cannot
// parse its own defaults of -r and -t ("0": IntFlag no longer iterates its zero member), so both are given as
// a value it parses (2: each worker's stderr in a log file and on the console). --monitor_interval 0.2: its
// checks 5 times a second, not every 5 s.
// Why PyTorch's torchrun cannot run here, or "": python3-torch missing, or a TCPStore that cannot start with
// its defaults (Debian trixie's 2.6 is built without libuv yet asks for it, and torchrun's static rendezvous
// passes no use_libuv: torchrun itself fails).
std::string torchrunUnusable() {
  if (run("/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null").code != 0)
    return "python3-torch is missing";
  if (run("/usr/bin/python3 -c 'import torch.distributed as d; d.TCPStore(\"127.0.0.1\", " +
          std::to_string(freePort()) + ", 1, True)' 2>/dev/null")
          .code != 0)
    return "this PyTorch's TCPStore cannot start with its defaults (built without libuv, which it asks for)";
  return "";
}

std::string torchrun(int nproc = 2) {
  if (!torchrunUnusable().empty()) return "";
  // USE_LIBUV=0: Debian trixie's python3-torch 2.6 is built without libuv, yet its TCPStore asks for it
  // unless told not to (torch 2.4+ reads the variable; 1.13 ignores it).
  return "USE_LIBUV=0 /usr/bin/python3 -m torch.distributed.run -r 2 -t 2 --monitor_interval 0.2 "
         "--nproc_per_node " +
         std::to_string(nproc) + " ";
}

// Static (torchrun's default: its agent serves the c10d store on --master_port and every worker reaches it as
// a client under /worker/attempt_0) and c10d (the workers' rank 0 hosts it): the bytes of one process.
TEST_F(Pipeline, TorchrunsStaticAndC10dRendezvousWriteTheBytesOfOneProcess) {
  const std::string launcher = torchrun();
  if (launcher.empty()) GTEST_SKIP() << torchrunUnusable() << ": tiler was not run under PyTorch's torchrun";
  const std::string ref = reference();
  const std::string static_out = root_ + "/out_torchrun_static";
  auto r = run(launcher + "--rdzv_backend static --master_addr 127.0.0.1 --master_port " +
               std::to_string(freePort()) + " --no_python " + tilerArgs(static_out));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, static_out);
  EXPECT_EQ(report(static_out)["world_size"], 2);
  const std::string c10d_out = root_ + "/out_torchrun_c10d";
  r = run(launcher + "--rdzv_backend c10d --rdzv_endpoint 127.0.0.1:" + std::to_string(freePort()) +
          " --rdzv_id e2e --no_python " + tilerArgs(c10d_out));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, c10d_out);
}

// Rank 2 of 3 crashes; ranks 0 and 1 find its connection closed, name it (the rank of this host whose process
// is gone) and wait for torchrun to stop them rather than exit first: torchrun, which stamps a worker without
// an error file when its check finds it dead, names rank 2 alone.
TEST_F(Pipeline, TorchrunNamesAKilledRankAsTheRootCause) {
  const std::string launcher = torchrun(3);
  if (launcher.empty()) GTEST_SKIP() << torchrunUnusable() << ": tiler was not run under PyTorch's torchrun";
  auto r = run("TILER_FAULT=rank:2,after_windows:4,kind:crash " + launcher + "--master_addr 127.0.0.1 " +
               "--master_port " + std::to_string(freePort()) + " --no_python " +
               tilerArgs(root_ + "/out_torchrun_killed"));
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.seconds, 30) << "the job ended at torchrun's check, not at a timeout";
  const auto root = r.output.find("Root Cause (first observed failure):");
  ASSERT_NE(root, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank      : 2 (local_rank: 2)", root), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Signal 11 (SIGSEGV)", root), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("<NO_OTHER_FAILURES>"), std::string::npos) << "no follow-on listed: " << r.output;
  // A survivor that noticed before torchrun stopped it names the vanished rank (on a loaded machine
  // torchrun's check may stop them first: ASurvivorNamesItsVanishedPeer tests the message without a
  // launcher).
  if (r.output.find("[default0]:tiler: error") != std::string::npos ||
      r.output.find("[default1]:tiler: error") != std::string::npos) {
    EXPECT_NE(r.output.find("rank 2's connection closed (it exited or was killed)"), std::string::npos)
        << r.output;
  }
  EXPECT_EQ(r.output.find("failed after waiting"), std::string::npos) << "not a timeout: " << r.output;
}

// Rank 1 of 2 crashes with no launcher to stop rank 0 (srun's environment): the survivor says its peer's
// connection closed, at once, not that it waited up to --timeout.
TEST_F(Pipeline, ASurvivorNamesItsVanishedPeer) {
  const std::string out = root_ + "/out_vanished", port = std::to_string(freePort());
  std::vector<std::string> commands;
  for (int r = 0; r < 2; ++r)
    // A shell of its own keeps its output (runConcurrently sends the outer one's to /dev/null).
    commands.push_back("sh -c 'TILER_FAULT=rank:1,after_windows:4,kind:crash SLURM_STEP_ID=0 SLURM_PROCID=" +
                       std::to_string(r) + " SLURM_NTASKS=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " +
                       tilerArgs(out, "--timeout 300") + " > " + root_ + "/vanished_" + std::to_string(r) +
                       ".log 2>&1'");
  const auto t0 = Clock::now();
  const auto codes = test::runConcurrently(commands);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 60) << "well before --timeout 300";
  EXPECT_EQ(codes[0], 1);
  EXPECT_NE(codes[1], 0);
  const std::string survivor = test::slurp(root_ + "/vanished_0.log");
  EXPECT_NE(survivor.find("rank 1's connection closed (it exited or was killed)"), std::string::npos)
      << survivor;
  EXPECT_EQ(survivor.find("failed after waiting"), std::string::npos) << survivor;
}

// Open MPI's mpirun (openmpi-bin): its ranks read OMPI_COMM_WORLD_*; MASTER_ADDR/PORT passed with -x.
TEST_F(Pipeline, MpirunsTwoRanksWriteTheBytesOfOneProcess) {
  if (run("command -v mpirun").code != 0)
    GTEST_SKIP() << "mpirun is missing (openmpi-bin: scripts/setup-deps.sh)";
  const std::string out = root_ + "/out_mpirun";
  auto r = run(std::string("mpirun --oversubscribe ") + (getuid() == 0 ? "--allow-run-as-root " : "") +
               "-np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=" + std::to_string(freePort()) + " " +
               tilerArgs(out));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(reference(), out);
  EXPECT_EQ(report(out)["world_size"], 2);
}

// `tiler` on a line of an sbatch script: the script runs once, as task 0 of the job's 8, in no srun step.
TEST_F(Pipeline, PlainTilerInAnSbatchScriptOfSeveralTasksSaysToRunItWithSrun) {
  const std::string out = root_ + "/out_sbatch";
  auto r =
      run("env -u SLURM_STEP_ID -u SLURM_STEPID SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=8 "
          "SLURM_TASKS_PER_NODE='4(x2)' SLURM_NODEID=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 " +
          tilerArgs(out));
  EXPECT_EQ(r.code, kExitFatal) << r.output;
  EXPECT_LT(r.seconds, 10) << "at once, not after --timeout";
  EXPECT_NE(r.output.find("SLURM_NTASKS=8 but this process is no task of an srun step"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("run it with srun"), std::string::npos) << r.output;
}

TEST_F(Pipeline, TtaIsReportedAndD4NeedsSquareWindows) {
  const std::string out = root_ + "/out_tta";
  auto r = run(kTiler + " -i " + root_ + "/images/b_mixed.png -m " + model_ + " -o " + out +
               " --window 64 --threads 1 --no_progress --save labels,probs --tta d4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(report(out)["tta"], "d4");
  EXPECT_EQ(report(reference())["tta"], "none");
  r = run(kTiler + " -i " + root_ + "/images/b_mixed.png -m " + model_ + " -o " + out +
          "_rect --window 64,32 --threads 1 --no_progress --tta d4");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--tta d4 rotates windows, so they must be square"), std::string::npos) << r.output;
}

TEST_F(Pipeline, ConfigFileTakesAnyFlag) {
  const std::string out = root_ + "/out_config";
  const std::string cfg = root_ + "/run.toml";
  std::ofstream(cfg)
      << "window = \"128\"\nbatch_size = 4\nthreads = 1\nsave = \"labels,probs\"\nno_progress = true\n"
      << "output = \"" << out << "\"\nmodel = \"" << model_ << "\"\ninput = [\"" << root_ << "/images\"]\n";
  auto r = run(kTiler + " --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(reference(), out);
}

}  // namespace
}  // namespace tiler

namespace tiler {
namespace {

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

// -i D -o D: a re-run never takes tiler's own outputs as inputs (x_labels_labels.tif), and never writes over
// a file of the user's that is an input of the run, with or without --resume.
TEST_F(Pipeline, AnInputDirectoryThatIsAlsoTheOutputDirectory) {
  const std::string dir = root_ + "/same_dir";
  fs::create_directories(dir);
  fs::copy_file(root_ + "/images/c_small.png", dir + "/c_small.png");
  fs::copy_file(root_ + "/images/e_float.tif", dir + "/e_float.tif");
  writeImage(dir + "/u.tif", pattern(60, 70, CV_8UC3, 255), SampleType::kU8);
  // The user's own file where u's labels would go (a ground truth, say): an input of the run.
  writeImage(dir + "/u_labels.tif", pattern(60, 70, CV_8UC3, 200), SampleType::kU8);
  const std::string users = slurp(dir + "/u_labels.tif");
  const std::string args = kTiler + " -i " + dir + " -m " + model_ + " -o " + dir +
                           " --window 64 --batch_size 4 --threads 1 --save labels --no_progress ";
  for (const std::string flags : {"", "--resume", "--overwrite"}) {
    auto r = run(args + flags);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.output;
    EXPECT_EQ(slurp(dir + "/u_labels.tif"), users) << flags << ": the user's file was overwritten";
    const auto j = report(dir);
    const auto* u = imageEntry(j, "u.tif");
    ASSERT_NE(u, nullptr);
    EXPECT_EQ((*u)["status"], "error");
    EXPECT_NE((*u)["error"].get<std::string>().find("is read by this run"), std::string::npos) << *u;
    EXPECT_EQ((*imageEntry(j, "u_labels.tif"))["status"], flags == "--resume" ? "skipped" : "ok") << flags;
    EXPECT_EQ(imageEntry(j, "c_small_labels.tif"), nullptr) << flags << ": tiler's own output taken as input";
    EXPECT_EQ(imageEntry(j, "u_labels_labels.tif"), nullptr) << flags;
    EXPECT_FALSE(fs::exists(dir + "/c_small_labels_labels.tif")) << flags;
    if (!flags.empty()) {
      EXPECT_NE(r.output.find("tiler's own outputs"), std::string::npos) << r.output;
    }
    fs::remove(dir + "/report.json");
  }
}

TEST_F(Pipeline, BadInputsAreReportedAndTheRestGoesOn) {
  const std::string in = root_ + "/bad_in", out = root_ + "/bad_out";
  fs::create_directories(in);
  for (const char* good : {"a_large.tif", "d_gray16.tif", "e_float.tif"})
    fs::copy_file(root_ + "/images/" + good, in + "/" + good, fs::copy_options::overwrite_existing);
  std::string bytes = slurp(root_ + "/images/a_large.tif");
  std::ofstream(in + "/truncated.tif", std::ios::binary)
      .write(bytes.data(), std::streamsize(bytes.size() / 3));
  std::ofstream(in + "/text.tif") << "this is a text file named .tif\n";
  std::ofstream(in + "/empty.png").close();
  writeImage(in + "/one_pixel.png", cv::Mat(1, 1, CV_8UC3, cv::Scalar(9, 99, 199)), SampleType::kU8);
  writeImage(in + "/five_channels.tif", pattern(40, 40, CV_8UC(5), 255), SampleType::kU8);
  test::writeAbsurdTiff(in + "/absurd.tif", 3);
  const bool root = geteuid() == 0;
  writeImage(in + "/unreadable.png", pattern(20, 20, CV_8UC3, 255), SampleType::kU8);
  fs::permissions(in + "/unreadable.png", fs::perms::none);

  auto r =
      run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + " -i " + in + " -m " + model_ + " -o " +
          out + " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress --timeout 60");
  fs::permissions(in + "/unreadable.png", fs::perms::owner_all);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_LT(r.seconds, 60) << "no hang";
  auto j = report(out);
  auto expectError = [&](const std::string& name, const std::string& reason) {
    const nlohmann::json* e = imageEntry(j, name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ((*e)["status"], "error") << name;
    const std::string msg = (*e)["error"].get<std::string>();
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find(reason), std::string::npos) << name << ": " << msg;
  };
  expectError("truncated.tif", "not a readable TIFF");
  expectError("text.tif", "not a TIFF");
  expectError("empty.png", "empty file");
  expectError("absurd.tif", "too large to decode");
  expectError("five_channels.tif", "image has 5 channel(s) but the model takes 3");
  if (!root) expectError("unreadable.png", "cannot read");
  for (const char* good : {"a_large.tif", "d_gray16.tif", "e_float.tif", "one_pixel.png"})
    EXPECT_EQ((*imageEntry(j, good))["status"], "ok") << good;
  for (const char* stem : {"a_large", "d_gray16", "e_float"})
    for (const char* kind : {"_labels.tif", "_probs.tif"})
      EXPECT_TRUE(slurp(out + "/" + stem + kind) == slurp(reference() + "/" + stem + kind)) << stem << kind;
  EXPECT_TRUE(partialFiles(out).empty());
  EXPECT_FALSE(fs::exists(out + "/truncated_labels.tif"));
}

TEST_F(Pipeline, SetupErrorsAreFatalWithAOneLineCause) {
  auto dir =
      run(kTiler + " -i " + root_ + "/images -m " + model_ + " -o /proc/tiler-cannot-write --no_progress");
  EXPECT_EQ(dir.code, 1);
  EXPECT_NE(dir.output.find("cannot write to the output directory '/proc/tiler-cannot-write'"),
            std::string::npos)
      << dir.output;
  const std::string corrupt = root_ + "/corrupt.pt";
  std::ofstream(corrupt) << "PK\x03\x04 not really a zip";
  auto model = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + " -i " + root_ + "/images -m " +
                   corrupt + " -o " + root_ + "/out_corrupt --no_progress");
  EXPECT_EQ(model.code, 1) << model.output;
  EXPECT_NE(model.output.find("is not a TorchScript file or is corrupt"), std::string::npos) << model.output;
  EXPECT_EQ(model.output.find("Segmentation"), std::string::npos);
}

TEST_F(Pipeline, CrashedRankRestartsAndResumesToTheSameBytes) {
  const std::string out = root_ + "/out_crash";
  auto r = run("TILER_FAULT=rank:1,after_windows:20,kind:crash " + kCtrun +
               " --nproc_per_node 2 --master_port 0 --max_restarts 1 --grace_period 2 " +
               tilerArgs(out, "--resume"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("SIGSEGV"), std::string::npos) << "the first attempt crashed: " << r.output;
  EXPECT_NE(r.output.find("restarting worker group"), std::string::npos);
  expectSameOutputs(reference(), out);
  auto j = report(out);
  int ok = 0, skipped = 0;
  for (const auto& e : j["images"]) {
    ok += e["status"] == "ok";
    skipped += e["status"] == "skipped";
  }
  EXPECT_EQ(ok + skipped, 5) << "no image lost";
  EXPECT_TRUE(partialFiles(out).empty());
  for (const auto& entry : fs::directory_iterator(out))
    EXPECT_EQ(entry.path().string().find(".tiler-reading"), std::string::npos)
        << entry.path() << ": every image finished, no reading mark stays";
}

TEST_F(Pipeline, TwoC10dAgentsRestartACrashedNodeTogetherToTheSameBytes) {
  // Node ranks from the rendezvous; rank 1 (on node 1) crashes on the first attempt; both nodes restart.
  const std::string out = root_ + "/out_c10d_crash";
  const std::string agent = "TILER_FAULT=rank:1,after_windows:20,kind:crash " + kCtrun +
                            " --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:" +
                            std::to_string(freePort()) +
                            " --rdzv_id e2e --max_restarts 1 --grace_period 2 --heartbeat_interval 0.2 " +
                            tilerArgs(out, "--resume");
  const std::string log = root_ + "/c10d_agent_";
  for (int code :
       test::runConcurrently({"(" + agent + " >" + log + "0 2>&1)", "(" + agent + " >" + log + "1 2>&1)"}))
    EXPECT_EQ(code, 0);
  const std::string logs = slurp(log + "0") + slurp(log + "1");
  EXPECT_NE(logs.find("rank 1 failed (SIGSEGV); restarting worker group"), std::string::npos) << logs;
  EXPECT_EQ(report(out)["world_size"], 2);
  expectSameOutputs(reference(), out);
  EXPECT_TRUE(partialFiles(out).empty());
}

TEST_F(Pipeline, HungRankTimesOutAndTheSummaryNamesIt) {
  const std::string out = root_ + "/out_hang";
  auto r = run("TILER_FAULT=rank:1,after_windows:4,kind:hang " + kCtrun +
               " --nproc_per_node 2 --master_port 0 --grace_period 2 " + tilerArgs(out, "--timeout 3"));
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.seconds, 60) << "the 3 s --timeout ended the hang";
  EXPECT_NE(r.output.find("behind: rank 1 (last seen at step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Root cause"), std::string::npos) << r.output;
}

// Rank 0 stops after its last step, as an owner still writing its outputs would: rank 1, done, waits for it
// at the end of the output stages, and its timeout names rank 0, not only itself.
TEST_F(Pipeline, AnOwnerStillAtWorkAfterTheLastStepIsTheRankATimeoutNames) {
  const std::string counted = root_ + "/out_owner_windows";
  runCtrun(2, counted);
  const int64_t windows = report(counted)["per_rank"][0]["windows"].get<int64_t>();
  const std::string out = root_ + "/out_owner_slow";
  auto r = run("TILER_FAULT=rank:0,after_windows:" + std::to_string(windows) + ",kind:hang " + kCtrun +
               " --nproc_per_node 2 --master_port 0 --grace_period 2 " + tilerArgs(out, "--timeout 3"));
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.seconds, 60) << "the 3 s --timeout ended the wait";
  EXPECT_NE(r.output.find("behind: rank 0 (last seen at step"), std::string::npos) << r.output;
}

TEST_F(Pipeline, DiskFullIsAClearErrorAndEarlierOutputsSurvive) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  const std::string mnt = root_ + "/tiny_disk", in = root_ + "/disk_in";
  fs::create_directories(mnt);
  fs::create_directories(in);
  if (std::system(("mount -t tmpfs -o size=2m tmpfs " + mnt + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here";
  fs::copy_file(root_ + "/images/c_small.png", in + "/a_small.png");
  cv::Mat noise(1200, 1200, CV_8UC3);
  cv::randu(noise, 0, 255);
  writeImage(in + "/b_noise.tif", noise, SampleType::kU8);
  auto r = run(kTiler + " -i " + in + " -m " + model_ + " -o " + mnt + "/out --window 128 --threads 1 " +
               "--save labels,probs --compression none --no_progress");
  // Compare decoded pixels: this run writes uncompressed TIFFs, the reference deflate ones.
  bool small_intact = false;
  try {
    cv::Mat got = ImageReader::open(mnt + "/out/a_small_labels.tif")->readRegion({0, 0, 50, 40});
    cv::Mat want = ImageReader::open(reference() + "/c_small_labels.tif")->readRegion({0, 0, 50, 40});
    small_intact = cv::countNonZero(got != want) == 0;
  } catch (const Error&) {
  }
  const bool partial_left = !partialFiles(mnt).empty();
  const bool noise_out = fs::exists(mnt + "/out/b_noise_probs.tif");
  // No byte left at all: not even the report can be written (exit 1), and no empty .partial stays behind
  // (libtiff writes a TIFF's header as it opens it; that failure left a 0-byte labels file).
  removeTree(mnt + "/out");
  fs::create_directories(mnt + "/out_full");
  std::system(("dd if=/dev/zero of=" + mnt + "/filler bs=4k 2>/dev/null").c_str());
  auto full = run(kTiler + " -i " + in + "/a_small.png -m " + model_ + " -o " + mnt +
                  "/out_full --window 128 --threads 1 --no_progress");
  const std::vector<std::string> left_when_full = partialFiles(mnt);
  std::system(("umount " + mnt).c_str());
  EXPECT_EQ(full.code, 1) << full.output;
  EXPECT_NE(full.output.find("No space left on device"), std::string::npos) << full.output;
  EXPECT_TRUE(left_when_full.empty()) << left_when_full.front();
  EXPECT_EQ(r.code, 2) << r.output;
  // Whichever of the image's files the disk ran out under (their tiles are written side by side) is named.
  EXPECT_TRUE(r.output.find("b_noise_probs.tif") != std::string::npos ||
              r.output.find("b_noise_labels.tif") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_TRUE(small_intact) << "the earlier output is intact";
  EXPECT_FALSE(partial_left);
  EXPECT_FALSE(noise_out);
}

}  // namespace
}  // namespace tiler

namespace tiler {
namespace {

TEST_F(Pipeline, OnErrorAbortStopsAtTheFirstBadImage) {
  const std::string in = root_ + "/abort_in";
  fs::create_directories(in);
  fs::copy_file(root_ + "/images/b_mixed.png", in + "/b_mixed.png", fs::copy_options::overwrite_existing);
  std::ofstream(in + "/a_text.tif") << "not a tiff";
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + " -i " + in + " -m " + model_ +
               " -o " + root_ + "/out_abort --window 128 --threads 1 --no_progress --on_error abort");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("a_text.tif': not a TIFF"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(--on_error abort)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/out_abort/b_mixed_labels.tif"));
}

TEST_F(Pipeline, InfoShowsWhatTheReaderSeesAndTheGrid) {
  auto r =
      run(kTiler + " info " + root_ + "/images/a_large.tif " + root_ + "/images/b_mixed.png --window 128");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("a_large.tif: 700x500, 3 channel(s), u8, reader tiff, tiled 256x256, deflate"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("grid: 35 windows (7 x 5) of 128x128"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("b_mixed.png: 300x200, 3 channel(s), u8, reader opencv, png"), std::string::npos)
      << r.output;
  // At another resolution: the grid infer would cut there (the catalog's description of the image).
  r = run(kTiler + " info " + root_ + "/images/a_large.tif --input_mpp 0.25 --mpp 0.5 --window 128");
  ASSERT_EQ(r.code, 0) << r.output;
  const WindowGrid half(350, 250, GridSpec{128, 128, 0.25, 0.25});
  EXPECT_NE(r.output.find("processing: level 0 resampled, 350x250, 0.5 um/px"), std::string::npos)
      << r.output;
  EXPECT_NE(
      r.output.find("grid: " + std::to_string(half.count()) + " windows (" + std::to_string(half.columns()) +
                    " x " + std::to_string(half.startsY().size()) + ") of 128x128"),
      std::string::npos)
      << r.output;
  auto bad = run(kTiler + " info " + root_ + "/no_such.tif");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("no_such.tif': no such file"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace tiler

namespace tiler {
namespace {

// The failure matrix: a std::runtime_error (not a tiler error) thrown while rank R reads or runs the image of
// its 6th window, which is a_large.tif for either rank (35 windows come first), or compresses a tile of the
// image of the 6th window it stitches: rank 0 owns a_large.tif (the most windows), rank 1 the others, of
// which b_mixed.png comes first and has more than 6 windows.
struct FaultCase {
  int rank;
  std::string stage;  // read | forward | write
  bool abort;
  std::string victim() const { return rank == 1 && stage == "write" ? "b_mixed" : "a_large"; }
  bool ctrun;  // else two processes with Slurm's variables, as srun starts them: no launcher to tear down
};

std::string faultCaseName(const ::testing::TestParamInfo<FaultCase>& info) {
  const FaultCase& c = info.param;
  return "rank" + std::to_string(c.rank) + "_" + c.stage + (c.abort ? "_abort" : "_skip") +
         (c.ctrun ? "_ctrun" : "_srun");
}

void PrintTo(const FaultCase& c, std::ostream* os) {
  *os << faultCaseName({c, 0});
}

class PipelineFaults : public Pipeline, public ::testing::WithParamInterface<FaultCase> {};

TEST_P(PipelineFaults, EveryRankLeavesTogetherAndNothingFailedIsFinal) {
  const FaultCase& c = GetParam();
  const std::string out = root_ + "/out_fault_" + faultCaseName({c, 0});
  const std::string fault =
      "TILER_FAULT=rank:" + std::to_string(c.rank) + ",after_windows:6,kind:throw,stage:" + c.stage + " ";
  const std::string args =
      tilerArgs(out, std::string("--timeout 300") + (c.abort ? " --on_error abort" : ""));
  int code = -1;
  std::string output;
  const auto t0 = Clock::now();
  if (c.ctrun) {
    auto r = run(fault + kCtrun + " --nproc_per_node 2 --master_port 0 " + args);
    code = r.code;
    output = r.output;
  } else {
    const std::string port = std::to_string(freePort());
    std::vector<std::string> commands;
    for (int r = 0; r < 2; ++r)
      commands.push_back(fault + "SLURM_STEP_ID=0 SLURM_PROCID=" + std::to_string(r) +
                         " SLURM_NTASKS=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " + args);
    auto codes = test::runConcurrently(commands);
    EXPECT_EQ(codes[0], codes[1]) << "both ranks give the same verdict";
    code = codes[0];
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(seconds, 60) << "every process gone well before --timeout 300";
  EXPECT_EQ(code, c.abort ? 1 : 2) << output;
  if (c.ctrun) {
    EXPECT_NE(output.find("TILER_FAULT: injected failure"), std::string::npos) << output;
  }
  const std::string victim = c.victim();
  EXPECT_FALSE(fs::exists(out + "/" + victim + "_labels.tif"));
  EXPECT_FALSE(fs::exists(out + "/" + victim + "_probs.tif"));
  EXPECT_TRUE(partialFiles(out).empty());
  if (c.abort) return;
  auto j = report(out);
  const std::string victim_file = victim == "a_large" ? "a_large.tif" : "b_mixed.png";
  const nlohmann::json* failed = imageEntry(j, victim_file);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["status"], "error");
  const std::string message = (*failed)["error"].get<std::string>();
  EXPECT_NE(message.find(victim_file), std::string::npos) << message;
  EXPECT_NE(message.find("TILER_FAULT: injected failure"), std::string::npos) << message;
  for (const char* good : {"a_large.tif", "b_mixed.png", "c_small.png", "d_gray16.tif", "e_float.tif"}) {
    if (good == victim_file) continue;
    EXPECT_EQ((*imageEntry(j, good))["status"], "ok") << good;
    const std::string stem = fs::path(good).stem().string();
    EXPECT_TRUE(slurp(out + "/" + stem + "_labels.tif") == slurp(reference() + "/" + stem + "_labels.tif"))
        << stem;
  }
}

std::vector<FaultCase> faultCases() {
  std::vector<FaultCase> cases;
  for (bool ctrun : {true, false})
    for (bool abort : {false, true})
      for (const auto& [rank, stage] : std::vector<std::pair<int, std::string>>{
               {0, "read"}, {1, "read"}, {0, "forward"}, {1, "forward"}, {0, "write"}, {1, "write"}})
        cases.push_back({rank, stage, abort, ctrun});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Matrix, PipelineFaults, ::testing::ValuesIn(faultCases()), faultCaseName);

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

// The read threads of a rank (one, or the loader thread and two helpers) write the bytes of the default.
TEST_F(Pipeline, ReadThreadsWriteTheSameBytes) {
  const std::string ref = reference();
  EXPECT_EQ(report(ref)["read_threads"],
            chooseReadThreads(0, ForwardLayout{1, 1}, false, defaultIntraOpThreads()));
  for (int threads : {1, 3}) {
    const std::string out = root_ + "/out_read_threads" + std::to_string(threads);
    auto r = run(tilerArgs(out, "--read_threads " + std::to_string(threads)));
    ASSERT_EQ(r.code, 0) << r.output;
    expectSameOutputs(ref, out);
    EXPECT_EQ(report(out)["read_threads"], threads);
  }
}

// --stitch device blends on the model's device (here the CPU's, the same LibTorch operations a GPU runs):
// the host's bytes, on one rank and on two whose gather reaches that device (gloo between CPU ranks, as
// NCCL between GPUs); an image whose accumulator is out of memory is stitched on the host, saying so.
TEST_F(Pipeline, StitchingOnTheDeviceWritesTheHostsBytes) {
  const std::string ref = reference();
  EXPECT_EQ(report(ref)["stitch"], "host") << "auto on a CPU";
  const std::string out = root_ + "/out_stitch_device";
  auto r = run(tilerArgs(out, "--stitch device"));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, out);
  EXPECT_EQ(report(out)["stitch"], "device");
  const std::string oom = root_ + "/out_stitch_oom";
  r = run("TILER_FAULT=rank:0,after_windows:1,kind:oom,stage:stitch " + tilerArgs(oom, "--stitch device"));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, oom);
  EXPECT_NE(r.output.find("stitched on the host: cpu is out of memory for its accumulator"),
            std::string::npos)
      << r.output;
  const std::string two = root_ + "/out_stitch_two_ranks";
  runCtrun(2, two, "--stitch device");
  expectSameOutputs(ref, two);
  EXPECT_EQ(report(two)["stitch"], "device");
}

// Two ranks take a part of every row of windows each (rank 0 holds the other part's early predictions) and
// decode the input tiles their parts share only where the parts meet: a 1024 px image of 64 px tiles, 11 rows
// of 11 windows. With --shard_buffer 0 rows are cut into pieces of one batch a rank, whose parts meet more
// often.
TEST_F(Pipeline, RanksTakePartsOfRowsDecodeSharedTilesOnceAndWriteTheSameBytes) {
  const std::string dir = root_ + "/runs";
  fs::create_directories(dir + "/in");
  WriterOptions wo;
  wo.tile = 64;
  ImageWriter w(dir + "/in/tiles.tif", 1024, 1024, 3, SampleType::kU8, wo);
  w.writeRows(pattern(1024, 1024, CV_8UC3, 255));
  w.close();
  const std::string args = kTiler + " -i " + dir + "/in -m " + model_ +
                           " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress";
  auto tiles = [&](const std::string& out) {
    int64_t sum = 0;
    const nlohmann::json j = report(out);  // held: a loop over a temporary's member would dangle
    for (const auto& r : j["per_rank"]) sum += r["tiles_decoded"].get<int64_t>();
    return sum;
  };
  auto one = run(args + " -o " + dir + "/one");
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_EQ(tiles(dir + "/one"), 256) << "one rank decodes every tile once";
  EXPECT_EQ(report(dir + "/one")["shard_run"], 121) << "one rank: every window in a row";
  const std::string two_ranks = kCtrun + " --nproc_per_node 2 --master_port 0 " + args;
  std::map<std::string, int64_t> decoded;
  for (const char* buffer : {"", "--shard_buffer 0"}) {
    const std::string out = dir + (*buffer ? "/two_pieces" : "/two");
    auto two = run(two_ranks + " -o " + out + " " + buffer);
    ASSERT_EQ(two.code, 0) << two.output;
    for (const char* kind : {"labels", "probs"}) {
      const std::string name = std::string("/tiles_") + kind + ".tif";
      EXPECT_TRUE(slurp(dir + "/one" + name) == slurp(out + name)) << out << name;
    }
    decoded[buffer] = tiles(out);
    // Rows of 11 are stacked (11 x 11 is under the default's pieces), halves of the image; with pieces of
    // one batch a rank they are split, in pieces of 5 and 6.
    EXPECT_EQ(report(out)["shard_run"], *buffer ? 3 : 61) << out;
  }
  // Runs of one batch a rank and step (before rows were dealt) decoded more than 384.
  EXPECT_LE(decoded[""], 256 * 5 / 4) << "parts of rows: only the tiles where the parts meet twice";
  EXPECT_GT(decoded["--shard_buffer 0"], decoded[""]) << "pieces of a batch a rank meet more often";

  // A narrow image, 21 rows of one window: rows split between the ranks would alternate, and both ranks
  // would decode nearly every tile; stacked, they meet once.
  fs::create_directories(dir + "/narrow");
  ImageWriter narrow(dir + "/narrow/strip.tif", 128, 2048, 3, SampleType::kU8, wo);
  narrow.writeRows(pattern(2048, 128, CV_8UC3, 255));
  narrow.close();
  const std::string strip = kTiler + " -i " + dir + "/narrow -m " + model_ +
                            " --window 128 --batch_size 4 --threads 1 --save labels --no_progress";
  auto strip_one = run(strip + " -o " + dir + "/strip_one");
  ASSERT_EQ(strip_one.code, 0) << strip_one.output;
  EXPECT_EQ(tiles(dir + "/strip_one"), 64);
  auto strip_two = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + strip + " -o " + dir + "/strip_two");
  ASSERT_EQ(strip_two.code, 0) << strip_two.output;
  EXPECT_TRUE(slurp(dir + "/strip_one/strip_labels.tif") == slurp(dir + "/strip_two/strip_labels.tif"));
  EXPECT_LE(tiles(dir + "/strip_two"), 64 * 5 / 4) << "stacked rows: the ranks meet once";
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

TEST_F(Pipeline, RgbaInt16TiffIsReadWithItsAlphaDropped) {
  const std::string in = root_ + "/rgba_in", out = root_ + "/rgba_out";
  fs::create_directories(in);
  {
    // tiler's writer makes no i16 files: libtiff directly, RGB plus unassociated alpha, as scanners write.
    cv::Mat px = pattern(100, 120, CV_16SC4, 30000);
    TIFF* t = TIFFOpen((in + "/rgba.tif").c_str(), "w");
    ASSERT_NE(t, nullptr);
    const uint16_t extra[] = {EXTRASAMPLE_UNASSALPHA};
    TIFFSetField(t, TIFFTAG_IMAGEWIDTH, 120);
    TIFFSetField(t, TIFFTAG_IMAGELENGTH, 100);
    TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, 4);
    TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 16);
    TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, SAMPLEFORMAT_INT);
    TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
    TIFFSetField(t, TIFFTAG_EXTRASAMPLES, 1, extra);
    TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
    TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, 16);
    for (int y = 0; y < 100; ++y) ASSERT_EQ(TIFFWriteScanline(t, px.ptr(y), uint32_t(y), 0), 1);
    TIFFClose(t);
  }
  fs::copy_file(root_ + "/images/c_small.png", in + "/c_small.png", fs::copy_options::overwrite_existing);
  auto r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + " -i " + in + " -m " + model_ +
               " -o " + out + " --window 64 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ((*imageEntry(report(out), "rgba.tif"))["status"], "ok");
  EXPECT_TRUE(fs::exists(out + "/rgba_labels.tif"));
}

}  // namespace
}  // namespace tiler

namespace tiler {
namespace {

// A 2400x1800 slide: light glass with one stained disc (radius 300 at 1600,1200), ~9% tissue.
void writeTissueSlide(const std::string& path) {
  cv::Mat img(1800, 2400, CV_8UC3);
  cv::randu(img, cv::Scalar(228, 228, 232), cv::Scalar(240, 240, 245));
  cv::Mat disc = cv::Mat::zeros(1800, 2400, CV_8U);
  cv::circle(disc, {1600, 1200}, 300, 255, cv::FILLED);
  cv::Mat stain(1800, 2400, CV_8UC3);
  cv::randu(stain, cv::Scalar(150, 60, 140), cv::Scalar(200, 110, 190));
  stain.copyTo(img, disc);
  writeImage(path, img, SampleType::kU8);
}

// The pixels of an image file, whatever its tags say.
cv::Mat pixelsOf(const std::string& path) {
  auto reader = ImageReader::open(path);
  return reader->readRegion({0, 0, reader->info().width, reader->info().height});
}

float xResolutionPerCentimetre(const std::string& path) {
  TIFF* t = TIFFOpen(path.c_str(), "r");
  float xres = 0;
  uint16_t unit = 0;
  TIFFGetField(t, TIFFTAG_XRESOLUTION, &xres);
  TIFFGetField(t, TIFFTAG_RESOLUTIONUNIT, &unit);
  TIFFClose(t);
  return unit == RESUNIT_CENTIMETER ? xres : -1;
}

TEST_F(Pipeline, WholeSlideAtMppIsItsLevelPixelForPixel) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = root_ + "/wsi";
  fs::create_directories(dir + "/slides");
  fs::create_directories(dir + "/export");
  test::makeSlide(pattern(768, 1024, CV_8UC3, 255), dir + "/plain.tif", dir + "/slides/aperio.svs", 0.25, 40);
  // Level 1 as OpenSlide's own tool exports it, processed as a plain PNG.
  auto r =
      run("openslide-write-png " + dir + "/slides/aperio.svs 0 0 1 512 384 " + dir + "/export/level1.png");
  ASSERT_EQ(r.code, 0) << r.output;
  auto tiler = [&](const std::string& input, const std::string& out, const std::string& flags,
                   const std::string& save = "labels,probs") {
    auto res = run(kTiler + " -i " + input + " -m " + model_ + " -o " + dir + "/" + out +
                   " --window 128 --batch_size 4 --threads 1 --no_progress --save " + save + " " + flags);
    EXPECT_EQ(res.code, 0) << res.output;
  };
  tiler(dir + "/slides", "mpp", "--mpp 0.5");
  tiler(dir + "/slides", "mag", "--magnification 20");
  tiler(dir + "/slides", "level", "--level 1", "labels,probs,polygons");
  tiler(dir + "/export", "png", "", "labels,probs,polygons");
  // Polygons are in level-0 pixels of the slide: twice the coordinates of the level-1 export's.
  auto polygons = [&](const std::string& path) { return nlohmann::json::parse(slurp(path))["features"]; };
  const auto slide_features = polygons(dir + "/level/aperio_polygons.geojson");
  const auto export_features = polygons(dir + "/png/level1_polygons.geojson");
  ASSERT_EQ(slide_features.size(), export_features.size());
  ASSERT_GT(slide_features.size(), 0u);
  const auto& a = slide_features[0]["geometry"]["coordinates"][0][0];
  const auto& b = export_features[0]["geometry"]["coordinates"][0][0];
  EXPECT_EQ(a[0].get<double>(), 2 * b[0].get<double>());
  EXPECT_EQ(a[1].get<double>(), 2 * b[1].get<double>());
  for (const char* other : {"mag", "level"})
    for (const char* kind : {"probs", "labels"})
      EXPECT_TRUE(slurp(dir + "/mpp/aperio_" + kind + ".tif") ==
                  slurp(dir + "/" + other + "/aperio_" + kind + ".tif"))
          << other << " " << kind;
  EXPECT_EQ(cv::norm(pixelsOf(dir + "/mpp/aperio_probs.tif"), pixelsOf(dir + "/png/level1_probs.tif"),
                     cv::NORM_INF),
            0);
  const auto e = report(dir + "/mpp")["images"][0];
  EXPECT_EQ(e["width"], 512);
  EXPECT_EQ(e["height"], 384);
  EXPECT_EQ(e["level"], 1);
  EXPECT_EQ(e["mpp"], 0.5);
  EXPECT_EQ(e["source_mpp"], 0.25);
  EXPECT_EQ(e["reader"], "openslide");
  EXPECT_EQ(report(dir + "/png")["images"][0]["mpp"], nullptr);
  EXPECT_FLOAT_EQ(xResolutionPerCentimetre(dir + "/mpp/aperio_labels.tif"), 20000.f);  // 0.5 µm/px
}

TEST_F(Pipeline, ResampledSlideTilesExactlyAndIsTheSameOnOneAndTwoRanks) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = root_ + "/wsi_resampled";
  fs::create_directories(dir + "/slides");
  test::makeSlide(pattern(768, 1024, CV_8UC3, 255), dir + "/plain.tif", dir + "/slides/aperio.svs", 0.25, 40);
  const std::string args =
      " -i " + dir + "/slides -m " + model_ +
      " --window 96 --batch_size 3 --threads 1 --save labels,probs --no_progress --mpp 0.375";
  auto one = run(kTiler + args + " -o " + dir + "/one");
  ASSERT_EQ(one.code, 0) << one.output;
  auto two = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + kTiler + args + " -o " + dir + "/two");
  ASSERT_EQ(two.code, 0) << two.output;
  for (const char* kind : {"probs", "labels"})
    EXPECT_TRUE(slurp(dir + "/one/aperio_" + kind + ".tif") == slurp(dir + "/two/aperio_" + kind + ".tif"));
  const auto e = report(dir + "/one")["images"][0];
  EXPECT_EQ(e["width"], 682);  // floor(1024 / 1.5)
  EXPECT_EQ(e["height"], 512);
  EXPECT_EQ(e["level"], 0);
  EXPECT_DOUBLE_EQ(e["mpp"].get<double>(), 0.375);
  const cv::Mat labels = pixelsOf(dir + "/one/aperio_labels.tif");
  EXPECT_EQ(labels.cols, 682);
  EXPECT_NEAR(xResolutionPerCentimetre(dir + "/one/aperio_labels.tif"), 1e4 / 0.375, 0.01);
}

// `dir`/slides/a_good.svs: an Aperio slide of 1024x768 px at 0.25 µm/px, 40x (the bad slides' good
// neighbour).
void makeGoodSlide(const std::string& dir) {
  fs::create_directories(dir + "/slides");
  test::makeSlide(pattern(768, 1024, CV_8UC3, 255), dir + "/plain.tif", dir + "/slides/a_good.svs", 0.25, 40);
}

TEST_F(Pipeline, SlidesThatCannotBeReadAtTheResolutionFailAlone) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = root_ + "/wsi_bad";
  makeGoodSlide(dir);
  fs::copy_file(dir + "/slides/a_good.svs", dir + "/slides/b_cut.svs");
  fs::resize_file(dir + "/slides/b_cut.svs", fs::file_size(dir + "/slides/a_good.svs") / 3);
  std::ofstream(dir + "/slides/c_notes.svs") << "not a slide\n";
  writeImage(dir + "/slides/d_nores.png", pattern(100, 120, CV_8UC3, 255), SampleType::kU8);
  auto r = run(kTiler + " -i " + dir + "/slides -m " + model_ + " -o " + dir +
               "/out --window 128 --threads 1 --no_progress --mpp 0.5");
  EXPECT_EQ(r.code, 2) << r.output;
  const auto images = report(dir + "/out")["images"];
  ASSERT_EQ(images.size(), 4u);
  EXPECT_EQ(images[0]["status"], "ok");
  EXPECT_TRUE(fs::exists(dir + "/out/a_good_labels.tif"));
  for (int i = 1; i < 4; ++i) EXPECT_EQ(images[i]["status"], "error") << images[i];
  EXPECT_NE(images[1]["error"].get<std::string>().find("b_cut.svs'"), std::string::npos) << images[1];
  EXPECT_NE(images[2]["error"].get<std::string>().find("not a whole-slide image"), std::string::npos);
  EXPECT_NE(images[3]["error"].get<std::string>().find("states no resolution"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/out/b_cut_labels.tif"));
}

// `slide`'s last level-0 tile claims 65279x65279 px in its JPEG header: its corners read fine, that tile not.
void spoilLastTile(const std::string& slide) {
  TIFF* tif = TIFFOpen(slide.c_str(), "r");
  ASSERT_NE(tif, nullptr);
  uint64_t* offsets = nullptr;
  ASSERT_TRUE(TIFFGetField(tif, TIFFTAG_TILEOFFSETS, &offsets));
  const uint64_t last = offsets[TIFFNumberOfTiles(tif) - 1];
  TIFFClose(tif);
  std::fstream f(slide, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(64, '\0');
  f.seekg(std::streamoff(last));
  f.read(head.data(), std::streamsize(head.size()));
  const size_t sof = head.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  f.seekp(std::streamoff(last + sof + 5));
  f.write("\xfe\xff\xfe\xff", 4);
}

// A run that dies while a slide is being read leaves a mark beside the outputs; the next run has OpenSlide
// read that slide whole in a probe process before any rank reads it: a slide whose deep tile OpenSlide cannot
// read fails alone, saying so, and a good one is read again; an image's mark goes once it is finished.
TEST_F(Pipeline, ASlideARunDiedReadingIsReadWholeInAProbeFirst) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = root_ + "/wsi_marks";
  makeGoodSlide(dir);
  fs::copy_file(dir + "/slides/a_good.svs", dir + "/slides/b_deep.svs");
  spoilLastTile(dir + "/slides/b_deep.svs");
  const std::string args = kTiler + " -i " + dir + "/slides -m " + model_ + " -o " + dir +
                           "/out --window 128 --batch_size 4 --threads 1 --no_progress";
  auto r = run("TILER_FAULT=rank:0,after_windows:4,kind:crash " + args);
  ASSERT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/out/.a_good.tiler-reading")) << "the run died reading a_good";
  EXPECT_FALSE(fs::exists(dir + "/out/.b_deep.tiler-reading")) << "b_deep was not read yet";
  std::ofstream(dir + "/out/.b_deep.tiler-reading");  // as if it had died in b_deep's last tile
  r = run(args + " --resume");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(
      r.output.find("a_good.svs': a run that ended before finishing it was reading it; OpenSlide reads it "
                    "whole in a probe process first"),
      std::string::npos)
      << r.output;
  const auto images = report(dir + "/out")["images"];
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0]["status"], "ok") << images[0];
  EXPECT_TRUE(fs::exists(dir + "/out/a_good_labels.tif"));
  EXPECT_EQ(images[1]["status"], "error");
  EXPECT_NE(images[1]["error"].get<std::string>().find(
                "b_deep.svs': OpenSlide cannot read all of it (in a probe process): "),
            std::string::npos)
      << images[1];
  EXPECT_FALSE(fs::exists(dir + "/out/.a_good.tiler-reading")) << "finished: its mark is gone";
  EXPECT_TRUE(fs::exists(dir + "/out/.b_deep.tiler-reading")) << "never read to its end: the mark stays";
  // Without a mark the slide is read as usual and fails on that tile (OpenSlide's error, no probe).
  fs::remove(dir + "/out/.b_deep.tiler-reading");
  r = run(args + " --resume");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output.find("in a probe process"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/out/.b_deep.tiler-reading")) << "failed and finished: its owner removed it";
}

TEST_F(Pipeline, TissueMaskSkipsGlassAndKeepsTissueExact) {
  const std::string in = root_ + "/slide_in";
  fs::create_directories(in);
  writeTissueSlide(in + "/slide.tif");
  auto args = [&](const std::string& out, const std::string& extra) {
    return kTiler + " -i " + in + " -m " + model_ + " -o " + out +
           " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress " + extra;
  };
  const std::string full = root_ + "/slide_full", one = root_ + "/slide_masked1",
                    two = root_ + "/slide_masked2";
  ASSERT_EQ(run(args(full, "")).code, 0);
  auto r1 = run(args(one, "--mask auto"));
  ASSERT_EQ(r1.code, 0) << r1.output;
  auto r2 = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + args(two, "--mask auto"));
  ASSERT_EQ(r2.code, 0) << r2.output;
  for (const char* f : {"/slide_labels.tif", "/slide_probs.tif"})
    EXPECT_TRUE(slurp(one + f) == slurp(two + f)) << f << ": 2 ranks = 1 rank";
  auto j = report(one)["images"][0];
  EXPECT_EQ(j["windows"], 475) << "25 x 19";
  EXPECT_EQ(j["windows"].get<int64_t>(),
            j["windows_processed"].get<int64_t>() + j["windows_skipped"].get<int64_t>());
  // The disc's windows: about (600+128)^2 / 96^2 of them, against 475 in the grid.
  EXPECT_GT(j["windows_processed"].get<int64_t>(), 30);
  EXPECT_LT(j["windows_processed"].get<int64_t>(), 90);
  EXPECT_EQ(j["mask"]["method"], "tissue");
  EXPECT_NEAR(j["mask"]["coverage"].get<double>(), M_PI * 300 * 300 / (2400.0 * 1800.0), 0.01);
  EXPECT_EQ(report(one)["windows_total"], j["windows_processed"]);
  // tiler info plans as infer does (the catalog's description): the same windows kept, the same coverage.
  auto info = run(kTiler + " info " + in + "/slide.tif --window 128 --mask auto --mask_preview " + root_ +
                  "/slide_mask.png");
  ASSERT_EQ(info.code, 0) << info.output;
  EXPECT_NE(info.output.find("mask: tissue, coverage 6.5%, " + j["windows_processed"].dump() +
                             " of 475 windows kept at --mask_fraction 0.05"),
            std::string::npos)
      << info.output;
  EXPECT_TRUE(fs::exists(root_ + "/slide_mask.png"));
  cv::Mat masked = ImageReader::open(one + "/slide_probs.tif")->readRegion({0, 0, 2400, 1800});
  cv::Mat unmasked = ImageReader::open(full + "/slide_probs.tif")->readRegion({0, 0, 2400, 1800});
  // Glass far from the disc: no window, zeros. The disc's centre: every covering window kept, exact.
  EXPECT_EQ(cv::countNonZero(masked(cv::Rect(0, 0, 1000, 700)).reshape(1)), 0);
  cv::Mat centre = masked(cv::Rect(1520, 1120, 160, 160)) != unmasked(cv::Rect(1520, 1120, 160, 160));
  EXPECT_EQ(cv::countNonZero(centre.reshape(1)), 0);
  cv::Mat labels = ImageReader::open(one + "/slide_labels.tif")->readRegion({0, 0, 2400, 1800});
  EXPECT_EQ(cv::countNonZero(labels(cv::Rect(0, 0, 1000, 700))), 0);
}

TEST_F(Pipeline, MaskFilesAtLowResolutionAndAnEmptyMask) {
  const std::string in = root_ + "/maskfile_in";
  fs::create_directories(in);
  fs::copy_file(root_ + "/images/a_large.tif", in + "/a_large.tif", fs::copy_options::overwrite_existing);
  // 1/16 of 700x500 (44x32): the left quarter of the image.
  cv::Mat mask = cv::Mat::zeros(32, 44, CV_8U);
  mask.colRange(0, 11).setTo(255);
  writeImage(root_ + "/quarter.png", mask, SampleType::kU8);
  const std::string out = root_ + "/maskfile_out";
  auto r =
      run(kTiler + " -i " + in + " -m " + model_ + " -o " + out + " --window 128 --threads 1 --no_progress " +
          "--mask " + root_ + "/quarter.png --mask_fraction 0.5");
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = report(out)["images"][0];
  EXPECT_EQ(j["windows"], 35);
  EXPECT_EQ(j["windows_processed"], 10) << "the first two of 7 columns, 5 rows";
  // A mask with nothing inside: the outputs are written, all zero.
  writeImage(root_ + "/empty_mask.png", cv::Mat::zeros(10, 10, CV_8U), SampleType::kU8);
  const std::string empty = root_ + "/maskfile_empty";
  auto e = run(kTiler + " -i " + in + " -m " + model_ + " -o " + empty +
               " --window 128 --threads 1 --no_progress " + "--mask " + root_ + "/empty_mask.png");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(report(empty)["images"][0]["windows_processed"], 0);
  cv::Mat labels = ImageReader::open(empty + "/a_large_labels.tif")->readRegion({0, 0, 700, 500});
  EXPECT_EQ(cv::countNonZero(labels), 0);
  // A missing mask fails that image, not the run.
  auto m = run(kTiler + " -i " + in + " -m " + model_ + " -o " + root_ + "/maskfile_missing --window 128 " +
               "--no_progress --mask " + root_ + "/no_such_mask.png");
  EXPECT_EQ(m.code, 2) << m.output;
  EXPECT_NE(m.output.find("no_such_mask.png"), std::string::npos) << m.output;
}

// The Tumor annotations of a QuPath export (tests/data/qupath_annotations.geojson: two polygons, one with a
// hole; a Stroma annotation, a detection and a point besides) and the same region drawn as a raster mask
// file.
TEST_F(Pipeline, AnRoiRunEqualsItsRasterMaskRun) {
  const std::string in = root_ + "/roi_in", rois = root_ + "/roi_dir";
  fs::create_directories(in);
  fs::create_directories(rois);
  fs::copy_file(root_ + "/images/a_large.tif", in + "/a_large.tif", fs::copy_options::overwrite_existing);
  fs::copy_file(std::string(TILER_TEST_SOURCE_DIR) + "/tests/data/qupath_annotations.geojson",
                rois + "/a_large.geojson", fs::copy_options::overwrite_existing);
  cv::Mat mask = cv::Mat::zeros(500, 700, CV_8U);
  mask(cv::Rect(20, 30, 280, 220)).setTo(255);
  mask(cv::Rect(100, 80, 100, 100)).setTo(0);
  mask(cv::Rect(400, 300, 250, 180)).setTo(255);
  writeImage(root_ + "/roi_mask.png", mask, SampleType::kU8);
  auto args = [&](const std::string& out, const std::string& extra) {
    return kTiler + " -i " + in + " -m " + model_ + " -o " + out +
           " --window 64 --batch_size 4 --threads 1 --save labels,probs --mask_fraction 0.3 --no_progress " +
           extra;
  };
  const std::string by_roi = root_ + "/roi_out", by_mask = root_ + "/roi_mask_out";
  auto r = run(args(by_roi, "--roi " + rois + " --roi_class Tumor"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto m = run(args(by_mask, "--mask " + root_ + "/roi_mask.png"));
  ASSERT_EQ(m.code, 0) << m.output;
  auto jr = report(by_roi)["images"][0], jm = report(by_mask)["images"][0];
  EXPECT_EQ(jr["mask"]["method"], "roi");
  EXPECT_EQ(jm["mask"]["method"], "file");
  EXPECT_EQ(jr["mask"]["coverage"], jm["mask"]["coverage"]);
  EXPECT_EQ(jr["windows_processed"], jm["windows_processed"]);
  EXPECT_LT(jr["windows_processed"].get<int64_t>(), jr["windows"].get<int64_t>() / 2);
  for (const char* f : {"/a_large_labels.tif", "/a_large_probs.tif"})
    EXPECT_TRUE(slurp(by_roi + f) == slurp(by_mask + f))
        << f << ": the ROI's outputs are the mask's, byte for byte";
  // A bad ROI fails that image (exit 2) naming the file and the problem; the run goes on.
  std::ofstream(root_ + "/roi_bad.geojson") << R"({"type": "Feature", "properties": {},
    "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]}})";
  auto bad = run(args(root_ + "/roi_bad_out", "--roi " + root_ + "/roi_bad.geojson"));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("roi_bad.geojson': feature 0, ring 0: 3 position(s)"), std::string::npos)
      << bad.output;
  auto none = run(args(root_ + "/roi_none_out", "--roi " + rois + " --roi_class Necrosis"));
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("no feature of class 'Necrosis'"), std::string::npos) << none.output;
}

// --channels on a 16-bit 6-channel TIFF and a 4-band TIFF: the outputs of a pre-sliced copy, byte for byte.
TEST_F(Pipeline, ChosenChannelsEqualAPreSlicedCopy) {
  struct Case {
    const char* name;
    int type;
    double scale;
    SampleType sample;
    std::string list;
    std::vector<int> order;
  };
  for (const Case& c : {Case{"six16", CV_16UC(6), 65535, SampleType::kU16, "4,0,2", {4, 0, 2}},
                        Case{"four8", CV_8UC4, 255, SampleType::kU8, "3,1-2", {3, 1, 2}}}) {
    const std::string whole = root_ + "/ch_" + c.name + "_whole",
                      sliced = root_ + "/ch_" + c.name + "_sliced";
    fs::create_directories(whole);
    fs::create_directories(sliced);
    const cv::Mat all = pattern(190, 260, c.type, c.scale);
    cv::Mat three(all.rows, all.cols, CV_MAKETYPE(all.depth(), 3));
    const int from_to[] = {c.order[0], 0, c.order[1], 1, c.order[2], 2};
    cv::mixChannels(&all, 1, &three, 1, from_to, 3);
    writeImage(whole + "/img.tif", all, c.sample);
    writeImage(sliced + "/img.tif", three, c.sample);
    auto args = [&](const std::string& in, const std::string& out, const std::string& extra) {
      return kTiler + " -i " + in + " -m " + model_ + " -o " + out +
             " --window 64 --batch_size 4 --threads 1 --save labels,probs --no_progress " + extra;
    };
    auto w = run(args(whole, whole + "_out", "--channels " + c.list));
    ASSERT_EQ(w.code, 0) << c.name << ": " << w.output;
    auto s = run(args(sliced, sliced + "_out", ""));
    ASSERT_EQ(s.code, 0) << c.name << ": " << s.output;
    for (const char* f : {"/img_labels.tif", "/img_probs.tif"})
      EXPECT_TRUE(slurp(whole + "_out" + f) == slurp(sliced + "_out" + f)) << c.name << f;
  }
  // Past the image's channels: that image fails, named; malformed: refused at set-up in one line.
  auto past = run(kTiler + " -i " + root_ + "/ch_four8_whole -m " + model_ + " -o " + root_ +
                  "/ch_past --window 64 --no_progress --channels 1,2,4");
  EXPECT_EQ(past.code, 2) << past.output;
  EXPECT_NE(past.output.find("img.tif': --channels names channel 4 but the image has 4 (0-3)"),
            std::string::npos)
      << past.output;
  auto bad = run(kTiler + " -i " + root_ + "/ch_four8_whole -m " + model_ + " -o " + root_ +
                 "/ch_bad --window 64 --no_progress --channels 2-0");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--channels '2-0': range '2-0' runs backwards"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace tiler

namespace tiler {
namespace {

bool have(const std::string& tool) {
  return run("command -v " + tool + " >/dev/null").code == 0;
}

// A pointwise model: class 1 where the red channel is above half, else class 0; windows blend exactly.
std::string thresholdModel(const std::string& dir) {
  torch::jit::Module m("Threshold");
  m.define(
      "def forward(self, x):\n    r = x[:, 0:1]\n    return torch.cat([torch.zeros_like(r), r - 0.5], 1)\n");
  const std::string path = dir + "/threshold.pt";
  m.save(path);
  return path;
}

// Shoelace areas of a GeoJSON Polygon: the outer ring minus its holes.
double polygonArea(const nlohmann::json& rings) {
  double total = 0;
  for (size_t i = 0; i < rings.size(); ++i) {
    double a = 0;
    const auto& ring = rings[i];
    for (size_t k = 0; k + 1 < ring.size(); ++k)
      a += ring[k][0].get<double>() * ring[k + 1][1].get<double>() -
           ring[k + 1][0].get<double>() * ring[k][1].get<double>();
    total += (i == 0 ? 1 : -1) * std::abs(a) / 2;
  }
  return total;
}

// Known shapes: a 60x60 square ring with a 20x20 hole, and two separate squares: 3 regions of class 1.
cv::Mat knownShapes() {
  cv::Mat img = cv::Mat::zeros(300, 400, CV_8UC3);
  img(cv::Rect(30, 40, 60, 60)).setTo(cv::Scalar(255, 0, 0));
  img(cv::Rect(50, 60, 20, 20)).setTo(cv::Scalar(0, 0, 0));
  img(cv::Rect(200, 100, 30, 50)).setTo(cv::Scalar(255, 0, 0));
  img(cv::Rect(300, 250, 70, 40)).setTo(cv::Scalar(255, 0, 0));
  return img;
}

// Every file under `dir`, by its path inside it, with its bytes.
std::map<std::string, std::string> filesUnder(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = slurp(e.path().string());
  return files;
}

// The suite's job with `flags` for its --save (tilerArgs saves labels and probs).
std::string zarrJob(const std::string& root, const std::string& model, const std::string& out,
                    const std::string& flags) {
  return kTiler + " -i " + root + "/images -m " + model + " -o " + out +
         " --window 128 --batch_size 4 --threads 1 --no_progress " + flags;
}

// --save zarr: one writer file and a registry row. The store holds what the TIFF outputs of the same run
// hold, level for level, as zarr and GDAL read them, and the same bytes for any world size.
TEST_F(Pipeline, ZarrStoresHoldTheTiffOutputsAndAreTheSameOnOneAndTwoRanks) {
  const std::string one = root_ + "/out_zarr1", two = root_ + "/out_zarr2";
  const std::string flags = "--save labels,probs,zarr --pyramid --probs_dtype u8";
  auto r = run(zarrJob(root_, model_, one, flags));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + zarrJob(root_, model_, two, flags));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = report(one);
  for (const char* stem : {"a_large", "b_mixed", "c_small", "d_gray16", "e_float"}) {
    const std::string store = std::string(stem) + ".ome.zarr";
    ASSERT_TRUE(fs::is_directory(one + "/" + store)) << store;
    const auto files = filesUnder(one + "/" + store);
    EXPECT_GT(files.size(), 6u) << store;
    EXPECT_TRUE(files == filesUnder(two + "/" + store)) << store << ": 1 and 2 ranks differ";
  }
  EXPECT_TRUE(partialFiles(one).empty());
  EXPECT_EQ((*imageEntry(j, "a_large.tif"))["outputs"]["zarr"], one + "/a_large.ome.zarr");
  if (run("/usr/bin/python3 -c 'import zarr, numpy; from osgeo import gdal'").code != 0)
    GTEST_SKIP() << "python3-zarr or python3-gdal missing: the stores were not read by zarr and GDAL";
  // Each level of each TIFF (GDAL: the page, then its overviews) equals the store's array of that level.
  auto py =
      run("cd " + one +
          " && /usr/bin/python3 -c \"\n"
          "import zarr, numpy as np\n"
          "from osgeo import gdal\n"
          "for stem in ['a_large', 'b_mixed', 'c_small', 'd_gray16', 'e_float']:\n"
          "    g = zarr.open_group(stem + '.ome.zarr', 'r')\n"
          "    levels = len(g.attrs['multiscales'][0]['datasets'])\n"
          "    for kind, array in (('probs', ''), ('labels', 'labels/classes/')):\n"
          "        ds = gdal.Open(stem + '_' + kind + '.tif')\n"
          "        bands = [ds.GetRasterBand(b + 1) for b in range(ds.RasterCount)]\n"
          "        assert bands[0].GetOverviewCount() + 1 == levels, (stem, levels)\n"
          "        for k in range(levels):\n"
          "            tif = [b if k == 0 else b.GetOverview(k - 1) for b in bands]\n"
          "            z = g[array + str(k)][:]\n"
          "            assert z.shape == (len(tif), tif[0].YSize, tif[0].XSize), (stem, kind, k, z.shape)\n"
          "            for c, b in enumerate(tif):\n"
          "                assert np.array_equal(z[c], b.ReadAsArray()), (stem, kind, k, c)\n"
          "print('stores equal')\n\"");
  EXPECT_EQ(py.code, 0) << py.output;
  EXPECT_NE(py.output.find("stores equal"), std::string::npos) << py.output;
  if (have("gdalinfo")) {
    auto info = run("gdalinfo " + one + "/a_large.ome.zarr");
    EXPECT_EQ(info.code, 0) << info.output;
    EXPECT_NE(info.output.find("Driver: Zarr"), std::string::npos) << info.output;
  }
}

// A store appears whole or not at all: a failure while compressing it leaves nothing; a link at its name is
// refused (the link's target untouched); --resume skips finished stores and sweeps a dead run's partial one.
TEST_F(Pipeline, AZarrStoreIsAllOrNothing) {
  const std::string out = root_ + "/out_zarr_faults", victim = root_ + "/zarr_victim";
  auto r = run("TILER_FAULT=rank:0,after_windows:6,kind:throw,stage:write " +
               zarrJob(root_, model_, out, "--save zarr"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_FALSE(fs::exists(out + "/a_large.ome.zarr"));
  EXPECT_FALSE(fs::exists(out + "/a_large.ome.zarr.partial"));
  EXPECT_TRUE(fs::is_directory(out + "/b_mixed.ome.zarr"));
  // The next run redoes the failed image only; a dead run's partial store goes.
  fs::create_directories(out + "/c_small.ome.zarr.partial/0");
  r = run(zarrJob(root_, model_, out, "--save zarr --resume"));
  EXPECT_EQ(r.code, 0) << r.output;
  auto j = report(out);
  EXPECT_EQ((*imageEntry(j, "a_large.tif"))["status"], "ok");
  EXPECT_EQ((*imageEntry(j, "b_mixed.png"))["status"], "skipped");
  EXPECT_FALSE(fs::exists(out + "/c_small.ome.zarr.partial"));
  // A link planted at a store's name is never written through, nor replaced.
  fs::create_directories(victim);
  std::ofstream(victim + "/keep") << "mine";
  removeTree(out + "/b_mixed.ome.zarr");
  fs::create_directory_symlink(victim, out + "/b_mixed.ome.zarr");
  r = run(zarrJob(root_, model_, out, "--save zarr --overwrite"));
  EXPECT_EQ(r.code, 2) << r.output;
  j = report(out);
  EXPECT_NE((*imageEntry(j, "b_mixed.png"))["error"].get<std::string>().find("symbolic link"),
            std::string::npos)
      << j.dump();
  EXPECT_TRUE(fs::is_symlink(out + "/b_mixed.ome.zarr"));
  EXPECT_EQ(filesUnder(victim), (std::map<std::string, std::string>{{"keep", "mine"}}));
  EXPECT_EQ((*imageEntry(j, "a_large.tif"))["status"], "ok") << "--overwrite replaces a store of its own";
}

TEST_F(Pipeline, PolygonsOutlineEachRegionExactlyWithItsHoles) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string in = root_ + "/shapes_in", out = root_ + "/shapes_out";
  fs::create_directories(in);
  writeImage(in + "/shapes.png", knownShapes(), SampleType::kU8);
  auto r = run(kTiler + " -i " + in + " -m " + thresholdModel(root_) + " -o " + out +
               " --window 64 --threads 1 --no_progress --save polygons --classes background,tumour:#ff0000");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(fs::exists(out + "/shapes_labels.tif")) << "labels were not asked for";
  EXPECT_EQ(report(out)["images"][0]["outputs"]["polygons"], out + "/shapes_polygons.geojson");
  auto j = nlohmann::json::parse(slurp(out + "/shapes_polygons.geojson"));
  EXPECT_EQ(j["type"], "FeatureCollection");
  EXPECT_FALSE(j.contains("crs")) << "pixel coordinates";
  ASSERT_EQ(j["features"].size(), 3u);
  std::vector<double> areas;
  int holes = 0;
  for (const auto& f : j["features"]) {
    EXPECT_EQ(f["properties"]["class"], 1);
    EXPECT_EQ(f["properties"]["name"], "tumour");
    EXPECT_EQ(f["properties"]["classification"]["name"], "tumour");
    EXPECT_EQ(f["properties"]["classification"]["color"], nlohmann::json({255, 0, 0}));
    areas.push_back(polygonArea(f["geometry"]["coordinates"]));
    holes += int(f["geometry"]["coordinates"].size()) - 1;
  }
  std::sort(areas.begin(), areas.end());
  EXPECT_EQ(areas, (std::vector<double>{1500, 2800, 3200}))
      << "areas are pixel counts (the ring: 3600 - 400)";
  EXPECT_EQ(holes, 1);
  if (have("ogrinfo")) {
    auto info = run("ogrinfo -so -al " + out + "/shapes_polygons.geojson");
    EXPECT_NE(info.output.find("Feature Count: 3"), std::string::npos) << info.output;
  }
}

TEST_F(Pipeline, GeoreferencedPolygonsAreInTheInputsCrs) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  TILER_SKIP_WITHOUT_TOOL("gdalinfo");
  if (!have("gdal_translate")) GTEST_SKIP() << "gdal-bin is not installed";
  const std::string in = root_ + "/geo_in", out = root_ + "/geo_out";
  fs::create_directories(in);
  writeImage(root_ + "/shapes_plain.tif", knownShapes(), SampleType::kU8);
  // UTM 33N, 10 m pixels, upper-left corner at (500000, 6000000).
  auto t = run("gdal_translate -q -a_srs EPSG:32633 -a_ullr 500000 6000000 504000 5997000 " + root_ +
               "/shapes_plain.tif " + in + "/scene.tif");
  ASSERT_EQ(t.code, 0) << t.output;
  auto r = run(kTiler + " -i " + in + " -m " + thresholdModel(root_) + " -o " + out +
               " --window 64 --threads 1 --no_progress --save labels,polygons");
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = nlohmann::json::parse(slurp(out + "/scene_polygons.geojson"));
  EXPECT_EQ(j["crs"]["properties"]["name"], "urn:ogc:def:crs:EPSG::32633");
  ASSERT_EQ(j["features"].size(), 3u);
  for (const auto& f : j["features"])
    for (const auto& p : f["geometry"]["coordinates"][0]) {
      EXPECT_GE(p[0].get<double>(), 500000);
      EXPECT_LE(p[0].get<double>(), 504000);
      EXPECT_GE(p[1].get<double>(), 5997000);
      EXPECT_LE(p[1].get<double>(), 6000000);
    }
  std::vector<double> areas;
  for (const auto& f : j["features"]) areas.push_back(polygonArea(f["geometry"]["coordinates"]));
  std::sort(areas.begin(), areas.end());
  EXPECT_EQ(areas.front(), 1500 * 100.0) << "m^2: 1500 pixels of 10 x 10 m";
  auto info = run("gdalinfo " + out + "/scene_labels.tif");
  EXPECT_NE(info.output.find("32633"), std::string::npos) << "the labels keep the CRS";
  // At 20 m (µm/px is metres x 10^6): resampled 2x, the transform's pixel size doubles, the origin stays.
  r = run(kTiler + " -i " + in + " -m " + thresholdModel(root_) + " -o " + out +
          "_20m --window 64 --threads 1 --no_progress --save labels,polygons --mpp 2e7");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto e = report(out + "_20m")["images"][0];
  EXPECT_EQ(e["source_mpp"].get<double>(), 1e7);
  EXPECT_EQ(e["mpp"].get<double>(), 2e7);
  EXPECT_EQ(e["width"], 200);
  info = run("gdalinfo " + out + "_20m/scene_labels.tif");
  EXPECT_NE(info.output.find("Pixel Size = (20.000000000000000,-20.000000000000000)"), std::string::npos)
      << info.output;
  EXPECT_NE(info.output.find("Origin = (500000.000000000000000,6000000.000000000000000)"), std::string::npos)
      << info.output;
}

TEST_F(Pipeline, PyramidsAndPalettesOpenInGdalVipsAndOpenSlide) {
  const std::string out = root_ + "/pyramid_out";
  auto r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + model_ + " -o " + out +
               " --window 128 --threads 1 --no_progress --save labels,probs --pyramid --classes glass,blob");
  ASSERT_EQ(r.code, 0) << r.output;
  // 700x500 with 256 px tiles: 350x250, then 175x125 fits one tile: 3 pages.
  for (const char* f : {"/a_large_labels.tif", "/a_large_probs.tif"}) {
    TIFF* t = TIFFOpen((out + f).c_str(), "r");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(TIFFNumberOfDirectories(t), 3) << f;
    TIFFClose(t);
  }
  // Level 0 is unchanged by the pyramid.
  cv::Mat with = ImageReader::open(out + "/a_large_probs.tif")->readRegion({0, 0, 700, 500});
  cv::Mat without = ImageReader::open(reference() + "/a_large_probs.tif")->readRegion({0, 0, 700, 500});
  EXPECT_EQ(cv::countNonZero(cv::Mat(with.reshape(1) != without.reshape(1))), 0);
  if (have("gdalinfo")) {
    auto info = run("gdalinfo " + out + "/a_large_labels.tif");
    EXPECT_NE(info.output.find("Overviews: 350x250, 175x125"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("Color Table"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("\"classes\":[\"glass\",\"blob\"]"), std::string::npos) << info.output;
  } else {
    std::cout << "gdal-bin missing: gdalinfo check skipped\n";
  }
  if (have("vipsheader")) {
    auto v = run("vipsheader -f n-pages " + out + "/a_large_probs.tif");
    EXPECT_EQ(v.output, "3\n") << v.output;
  } else {
    std::cout << "libvips-tools missing: vipsheader check skipped\n";
  }
  if (have("openslide-show-properties")) {
    auto o = run("openslide-show-properties " + out + "/a_large_labels.tif");
    EXPECT_NE(o.output.find("openslide.level-count: '3'"), std::string::npos) << o.output;
    EXPECT_NE(o.output.find("openslide.level[1].width: '350'"), std::string::npos) << o.output;
  } else {
    std::cout << "openslide-tools missing: openslide check skipped\n";
  }
}

// Two runs into one output directory: the second used to delete the first's live partial files, and the first
// then renamed what was left (or the other run's results) under the final names with exit 0.
TEST_F(Pipeline, ASecondRunIntoALockedOutputDirectoryStopsBeforeTouchingIt) {
  const std::string out = root_ + "/out_locked";
  fs::create_directories(out);
  std::ofstream(out + "/a_large_labels.tif.partial") << "another run's live file";
  {
    DirectoryLock held(out);  // this test process plays the first run
    ASSERT_TRUE(held.locked()) << held.error();
    auto r = run(tilerArgs(out));
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("another tiler run (pid " + std::to_string(getpid()) + ")"), std::string::npos)
        << r.output;
    EXPECT_EQ(slurp(out + "/a_large_labels.tif.partial"), "another run's live file");
    EXPECT_FALSE(fs::exists(out + "/report.json"));
  }
  // Once the holder is gone the directory is free (its stale partial files are cleared as before).
  auto r = run(tilerArgs(out));
  EXPECT_EQ(r.code, 0) << r.output;
  expectSameOutputs(reference(), out);
  EXPECT_FALSE(fs::exists(out + "/.tiler.lock"));
}

TEST_F(Pipeline, TwoRunsAtOnceNeverShareAnOutputDirectory) {
  const std::string out = root_ + "/out_two_at_once";
  // --overwrite: a second run that starts after the first has finished redoes the job.
  const auto codes =
      test::runConcurrently({"(" + tilerArgs(out, "--overwrite") + " >" + root_ + "/two_a.log 2>&1)",
                             "(" + tilerArgs(out, "--overwrite") + " >" + root_ + "/two_b.log 2>&1)"});
  const std::string logs = slurp(root_ + "/two_a.log") + slurp(root_ + "/two_b.log");
  // Whichever locked first finished whole; the other stopped at once, or ran after the first had left.
  EXPECT_TRUE((codes[0] == 0 && codes[1] == 0) || (codes[0] == 0) != (codes[1] == 0)) << logs;
  if (codes[0] != 0 || codes[1] != 0) {
    EXPECT_NE(logs.find("another tiler run (pid "), std::string::npos) << logs;
  }
  expectSameOutputs(reference(), out);
  EXPECT_TRUE(partialFiles(out).empty());
}

TEST_F(Pipeline, PlantedLinksAreNeverWrittenThrough) {
  const std::string out = root_ + "/out_links";
  fs::create_directories(out);
  const std::string victim = root_ + "/victim.txt";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, out + "/report.json.partial");
  fs::create_symlink(victim, out + "/c_small_labels.tif.partial");
  auto r = run(tilerArgs(out));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(out + "/report.json"));
  expectSameOutputs(reference(), out);
  // --resume counts plain files only: a link where an output belongs is redone, and replaced, not followed.
  fs::remove(out + "/c_small_probs.tif");
  fs::create_symlink(victim, out + "/c_small_probs.tif");
  r = run(tilerArgs(out, "--resume"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ((*imageEntry(report(out), "c_small.png"))["status"], "ok");
  EXPECT_EQ((*imageEntry(report(out), "a_large.tif"))["status"], "skipped");
  EXPECT_FALSE(fs::is_symlink(out + "/c_small_probs.tif"));
  EXPECT_EQ(slurp(victim), "precious");
  expectSameOutputs(reference(), out);
}

// Side outputs go through the check the outputs do: `--report v/x.png` turned the input into JSON (exit 0),
// `--report v/m.pt` replaced the model, `--report o/.tiler.lock` left no report; info's --mask_preview and
// overlay's PNG overwrote their own inputs. Now each is refused at set-up, exit 1, naming both files; a FIFO
// or (a link to) a character device is written as it is, never replaced.
TEST_F(Pipeline, SideOutputsNeverReplaceAnInputTheModelAnOutputOrTheLock) {
  const std::string v = root_ + "/side", out = v + "/o";
  fs::create_directories(v);
  fs::copy_file(root_ + "/images/c_small.png", v + "/x.png");
  fs::copy_file(model_, v + "/m.pt");
  const std::string image = slurp(v + "/x.png"), model = slurp(v + "/m.pt");
  const std::string base = kTiler + " -i " + v + "/x.png -m " + v + "/m.pt -o " + out +
                           " --window 64 --threads 1 --no_progress --report ";
  struct Case {
    std::string report, message;
  };
  const std::vector<Case> cases = {
      {v + "/x.png", "--report '" + v + "/x.png' is the input '" + v + "/x.png', which this run reads"},
      {v + "/o/../x.png", "is the input '" + v + "/x.png'"},
      {v + "/m.pt", "is the model '" + v + "/m.pt'"},
      {out + "/x_labels.tif", "is the labels output '" + out + "/x_labels.tif', which this run also writes"},
      {out + "/.tiler.lock", "is the output directory's lock"},
      {v, "'" + v + "' is a directory"},
  };
  for (const auto& c : cases) {
    auto r = run(base + c.report);
    EXPECT_EQ(r.code, 1) << c.report << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.report << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out + "/x_labels.tif")) << "refused before any work: " << c.report;
  }
  EXPECT_EQ(slurp(v + "/x.png"), image);
  EXPECT_EQ(slurp(v + "/m.pt"), model);
  EXPECT_FALSE(fs::exists(out + "/.tiler.lock"));
  // A FIFO a program reads gets the report and stays a FIFO.
  const std::string fifo = v + "/report.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  auto r = run(base + fifo);
  EXPECT_EQ(r.code, 0) << r.output;
  std::string sent;
  char buffer[4096];
  for (ssize_t n; (n = read(reader, buffer, sizeof buffer)) > 0;) sent.append(buffer, size_t(n));
  close(reader);
  const auto j = nlohmann::json::parse(sent, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << sent;
  EXPECT_EQ(j["images"][0]["status"], "ok") << sent;
  struct stat st {};
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // A link to /dev/null (the test's own link: a broken rule replaces it, never the device) is written
  // through.
  fs::create_symlink("/dev/null", v + "/null");
  r = run(base + v + "/null --overwrite");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::is_symlink(v + "/null"));
  ASSERT_EQ(stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // tiler info's mask preview and tiler overlay's PNG: never one of their inputs.
  auto info = run(kTiler + " info --mask auto --mask_preview " + v + "/x.png " + v + "/x.png");
  EXPECT_EQ(info.code, 1) << info.output;
  EXPECT_NE(info.output.find("--mask_preview '" + v + "/x.png' is the image '" + v + "/x.png'"),
            std::string::npos)
      << info.output;
  info = run(kTiler + " info --mask auto --mask_preview " + v + "/null " + v + "/x.png");
  EXPECT_EQ(info.code, 0) << info.output;
  EXPECT_TRUE(fs::is_symlink(v + "/null"));
  for (const std::string& target : {v + "/x.png", out + "/x_labels.tif"}) {
    const std::string before = slurp(target);
    auto overlay = run(kTiler + " overlay " + v + "/x.png " + out + "/x_labels.tif " + target);
    EXPECT_EQ(overlay.code, 1) << overlay.output;
    EXPECT_NE(overlay.output.find("the overlay '" + target + "' is the "), std::string::npos)
        << overlay.output;
    EXPECT_EQ(slurp(target), before);
  }
  auto overlay = run(kTiler + " overlay " + v + "/x.png " + out + "/x_labels.tif " + v + "/overlay.png");
  EXPECT_EQ(overlay.code, 0) << overlay.output;
}

TEST_F(Pipeline, NonsenseFlagsFailInOneLineBeforeAnyWork) {
  const std::string out = root_ + "/out_flags";
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {"--save ''", "--save takes labels, probs, polygons and zarr (segment)"},
      {"--save labels,", "--save takes labels, probs, polygons and zarr (segment)"},
      {"--save labels,features", "--save labels,features mixes the outputs of two tasks (segment and embed)"},
      {"--task instance",
       "--task must be auto, segment, classify, embed, detect, instances or regress; got 'instance'"},
      {"--threads -3", "must be > 0; got -3"},
      {"--replicas 0", "must be > 0; got 0"},
      {"--stitch gpu", "--stitch must be auto, host or device; got 'gpu'"},
      {"--scale nan", "must be >= 0; got nan"},
      {"--mean 0.5,inf,0.5", "must be a finite number; got inf"},
      {"--timeout inf", "must be > 0; got inf"},
      {"--timeout 1e10",
       "--timeout must be a number of seconds > 0 and at most 2147483 (24.8 days); got 1e+10"},
      {"--timeout 1e308",
       "--timeout must be a number of seconds > 0 and at most 2147483 (24.8 days); got 1e+308"},
      {"--mpp -1", "must be > 0; got -1"},
      {"--level -2", "must be >= 0; got -2"},
      {"--compression deflate:13", "--compression deflate takes a level from 1 to 12; got 'deflate:13'"},
      {"--compression zstd:", "--compression zstd takes a level from 1 to 22; got 'zstd:'"},
      {"--compression lzw:5", "--compression lzw takes no level; got 'lzw:5'"},
      {"--compression brotli",
       "--compression must be deflate[:LEVEL], zstd[:LEVEL], lzw or none; got 'brotli'"},
  };
  // Without the suite's --save and --threads, which the cases set themselves.
  const std::string base = kTiler + " -i " + root_ + "/images/c_small.png -m " + model_ + " -o " + out +
                           " --window 64 --no_progress ";
  for (const auto& c : cases) {
    auto r = run(base + c.flags);
    EXPECT_EQ(r.code, 1) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.flags << "\n" << r.output;
    EXPECT_LT(r.output.size(), 400u) << "one short message, no bound in 300 digits: " << r.output;
    EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out + "/report.json")) << c.flags;
  }
  // A --config key that names no flag is the error a mistyped flag is.
  std::ofstream(root_ + "/typo.toml") << "batch_sise = 4\n";
  auto r = run(base + "--config " + root_ + "/typo.toml");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("batch_sise"), std::string::npos) << r.output;
  std::ofstream(root_ + "/good.toml") << "batch_size = 2\n";
  r = run(base + "--threads 1 --config " + root_ + "/good.toml");
  EXPECT_EQ(r.code, 0) << r.output;
}

// zstd's context is sized by its level alone (815 MB at 22): four compressing threads took 2.86 GB for a
// 300 px image. The pool is cut to what fits kCompressorBudgetBytes, and says so.
TEST_F(Pipeline, HighZstdLevelsCapTheCompressingThreadsToTheCodecBudget) {
  auto peak = [&](const std::string& name, const std::string& compression) {
    const std::string out = root_ + "/out_" + name;
    auto r =
        run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + model_ + " -o " + out +
            " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress --write_threads 4 "
            "--compression " +
            compression);
    EXPECT_EQ(r.code, 0) << r.output;
    return std::make_pair(report(out)["per_rank"][0]["peak_rss_mb"].get<double>(), r.output);
  };
  const auto [light, light_log] = peak("zstd1", "zstd:1");
  const auto [heavy, heavy_log] = peak("zstd22", "zstd:22");
  EXPECT_EQ(light_log.find("compressing threads"), std::string::npos) << light_log;
  EXPECT_NE(heavy_log.find("--compression zstd:22: 1 compressing threads instead of 4"), std::string::npos)
      << heavy_log;
  EXPECT_LT(heavy - light, double(kCompressorBudgetBytes >> 20) + 100) << light << " MB at zstd:1";
}

TEST_F(Pipeline, ABatchLargerThanTheJobIsCappedAtItsWindows) {
  // One window, --batch_size 100000: LibTorch was asked for 78 GB and printed a 24-frame backtrace.
  const std::string out = root_ + "/out_huge_batch";
  auto r = run(kTiler + " -i " + root_ + "/images/c_small.png -m " + model_ + " -o " + out +
               " --window 64 --batch_size 100000 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(report(out)["windows_total"], 1);
  EXPECT_TRUE(fs::exists(out + "/c_small_labels.tif"));
  // The default layout times a window's forward before the plan caps the batch: at a batch of 64 at most
  // (it asked for 100000 windows of 256 px, 78 GB). Thread counts past what can be busy are capped, said.
  r = run(kTiler + " -i " + root_ + "/images/c_small.png -m " + model_ + " -o " + out +
          " --window 256 --batch_size 100000 --read_threads 100000 --write_threads 100000 --no_progress " +
          "--overwrite");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--read_threads 100000: capped at"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--write_threads 100000: capped at"), std::string::npos) << r.output;
  EXPECT_LT(report(out)["read_threads"].get<int>(), 100000);
  EXPECT_LT(report(out)["per_rank"][0]["peak_rss_mb"].get<double>(), 2000.0);
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

// A detector of 8x8 cells: every cell of a window is a box row (x1, y1, x2, y2, score, class), its score the
// cell's mean where that is over a half (else 0: padding), class 1 where it is over 0.9.
const char* kCellDetector = R"JIT(
def forward(self, x):
    m = torch.avg_pool2d(x.mean([1], True), [8, 8], [8, 8])[:, 0]
    b, h, w = m.size(0), m.size(1), m.size(2)
    ys = (torch.arange(h).float() * 8).view(1, h, 1).expand(b, h, w)
    xs = (torch.arange(w).float() * 8).view(1, 1, w).expand(b, h, w)
    score = torch.where(m > 0.5, m, torch.zeros_like(m))
    cls = (m > 0.9).float()
    return torch.stack([xs, ys, xs + 8, ys + 8, score, cls], 3).reshape(b, h * w, 6)
)JIT";

std::string saveDetector(const std::string& path, const std::string& forward) {
  torch::jit::Module m("Detector");
  m.define(forward);
  m.save(path);
  return path;
}

// Boxes from the CSV of a detect run: "class x1 y1 x2 y2", one each.
std::multiset<std::string> csvBoxes(const std::string& csv) {
  std::multiset<std::string> boxes;
  std::istringstream in(slurp(csv));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "id,class,score,x1,y1,x2,y2");
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string v; std::getline(fields, v, ',');) f.push_back(v);
    EXPECT_EQ(f.size(), 7u) << line;
    if (f.size() == 7) boxes.insert(f[1] + " " + f[3] + " " + f[4] + " " + f[5] + " " + f[6]);
  }
  return boxes;
}

// Squares of 8x8 px on the 8 px lattice, bright (class 1) and grey (class 0), some on the windows' core
// boundaries, some in several windows' overlap, some at the image's edges: each is found once, by the window
// whose core holds its centre, on 1, 2 and 3 ranks alike, in every output.
TEST_F(Pipeline, DetectionsAreEachObjectOnceWhateverTheWorldSize) {
  const int W = 200, H = 152;
  cv::Mat img(H, W, CV_8UC3, cv::Scalar::all(0));
  std::multiset<std::string> want;
  const int cells[][3] = {{0, 0, 255},   {5, 2, 160},   {6, 6, 255},   {7, 6, 255},
                          {12, 1, 160},  {13, 12, 255}, {18, 7, 160},  {24, 3, 255},
                          {24, 18, 160}, {0, 18, 255},  {11, 11, 255}, {19, 12, 160}};
  for (const auto& [cx, cy, v] : cells) {
    img(cv::Rect(cx * 8, cy * 8, 8, 8)).setTo(cv::Scalar::all(v));
    want.insert(std::string(v == 255 ? "class_1" : "class_0") + " " + std::to_string(cx * 8) + " " +
                std::to_string(cy * 8) + " " + std::to_string(cx * 8 + 8) + " " + std::to_string(cy * 8 + 8));
  }
  const std::string dir = root_ + "/detect", model = saveDetector(root_ + "/cells.pt", kCellDetector);
  fs::create_directories(dir);
  writeImage(dir + "/squares.tif", img, SampleType::kU8);
  const std::string args = " -i " + dir + " -m " + model + " --task detect --window 64 --overlap 0.25 " +
                           "--batch_size 4 --threads 1 --save objects,objects_csv,coco --no_progress -o ";
  auto r = run(kTiler + args + root_ + "/out_detect1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(csvBoxes(root_ + "/out_detect1/squares_objects.csv"), want);
  const auto e = *imageEntry(report(root_ + "/out_detect1"), "squares.tif");
  EXPECT_EQ(e["objects"], int64_t(std::size(cells))) << e;
  EXPECT_EQ(e["objects_at_window_edge"], 0) << e;
  const auto coco = nlohmann::json::parse(slurp(root_ + "/out_detect1/squares_coco.json"));
  EXPECT_EQ(coco["annotations"].size(), std::size(cells));
  EXPECT_EQ(coco["images"][0]["width"], W);
  EXPECT_EQ(coco["categories"].size(), 2u);
  const auto geojson = nlohmann::json::parse(slurp(root_ + "/out_detect1/squares_objects.geojson"));
  ASSERT_EQ(geojson["features"].size(), std::size(cells));
  EXPECT_EQ(geojson["features"][0]["properties"]["objectType"], "detection");
  if (run("command -v ogrinfo").code == 0) {
    auto ogr = run("ogrinfo -so -al " + root_ + "/out_detect1/squares_objects.geojson");
    EXPECT_NE(ogr.output.find("Feature Count: " + std::to_string(std::size(cells))), std::string::npos)
        << ogr.output;
  }
  for (int ranks : {2, 3}) {
    const std::string out = root_ + "/out_detect" + std::to_string(ranks);
    r = run(kCtrun + " --nproc_per_node " + std::to_string(ranks) + " --master_port 0 " + kTiler + args +
            out);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* file : {"squares_objects.geojson", "squares_objects.csv", "squares_coco.json"})
      EXPECT_TRUE(slurp(out + "/" + file) == slurp(root_ + "/out_detect1/" + file))
          << ranks << " ranks: " << file;
  }
}

// A georeferenced scene's objects are placed in its CRS in the GeoJSON (QGIS reads them there); the CSV and
// COCO stay in level-0 pixels.
TEST_F(Pipeline, DetectionsOfAGeoreferencedSceneAreInItsCrs) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  if (run("command -v gdal_translate && command -v ogrinfo").code != 0) GTEST_SKIP() << "no gdal-bin";
  const std::string dir = root_ + "/detect_geo";
  fs::create_directories(dir);
  cv::Mat img(152, 200, CV_8UC3, cv::Scalar::all(0));
  img(cv::Rect(16, 24, 8, 8)).setTo(cv::Scalar::all(255));
  writeImage(dir + "/plain.tif", img, SampleType::kU8);
  // 2 m pixels in UTM zone 33N, the top-left corner at (500000, 4600000).
  auto r = run("gdal_translate -q -a_srs EPSG:32633 -a_ullr 500000 4600000 500400 4599696 " + dir +
               "/plain.tif " + dir + "/scene.tif && rm " + dir + "/plain.tif");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(kTiler + " -i " + dir + " -m " + saveDetector(root_ + "/cells_geo.pt", kCellDetector) + " -o " +
          root_ +
          "/out_detect_geo --task detect --window 64 --save objects,objects_csv --threads 1 --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto geojson = nlohmann::json::parse(slurp(root_ + "/out_detect_geo/scene_objects.geojson"));
  EXPECT_EQ(geojson["crs"]["properties"]["name"], "urn:ogc:def:crs:EPSG::32633");
  ASSERT_EQ(geojson["features"].size(), 1u);
  EXPECT_EQ(geojson["features"][0]["geometry"]["coordinates"][0],
            nlohmann::json::parse("[[500032,4599952],[500048,4599952],[500048,4599936],[500032,4599936],"
                                  "[500032,4599952]]"));
  EXPECT_EQ(slurp(root_ + "/out_detect_geo/scene_objects.csv"),
            "id,class,score,x1,y1,x2,y2\n1,class_1,1,16,24,24,32\n");
  const auto ogr = run("ogrinfo -so -al " + root_ + "/out_detect_geo/scene_objects.geojson");
  EXPECT_NE(ogr.output.find("UTM zone 33N"), std::string::npos) << ogr.output;
}

// The bundled detector (samples/models/detector.pt) over discs of known centres and radii, some in two or
// four windows' overlap, some at the image's edge: every disc once, where it is, as big as it is.
TEST_F(Pipeline, TheBundledDetectorFindsEachDiscOnce) {
  const int W = 300, H = 260;
  const std::vector<std::array<double, 3>> discs = {{40.3, 30.6, 10}, {96.5, 100.2, 14}, {160.1, 96.4, 8},
                                                    {130, 200.5, 20}, {250.7, 40.2, 12}, {290.4, 250.6, 7},
                                                    {8.2, 240.5, 6},  {200.6, 170.3, 16}};
  cv::Mat img(H, W, CV_8UC3, cv::Scalar::all(40));
  for (const auto& [x, y, r] : discs)
    for (int py = 0; py < H; ++py)
      for (int px = 0; px < W; ++px)
        if (std::hypot(px + 0.5 - x, py + 0.5 - y) <= r) img.at<cv::Vec3b>(py, px) = cv::Vec3b(220, 200, 180);
  const std::string dir = root_ + "/discs";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", img, SampleType::kU8);
  auto r =
      run(kTiler + " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR + "/samples/models/detector.pt -o " + root_ +
          "/out_discs --task detect --window 128 --overlap 0.5 --batch_size 4 --threads 1 "
          "--save objects_csv --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  std::istringstream csv(slurp(root_ + "/out_discs/discs_objects.csv"));
  std::string line;
  std::getline(csv, line);
  std::vector<int> found(discs.size(), 0);
  int rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    std::vector<double> f;
    std::stringstream fields(line.substr(line.find(',', line.find(',') + 1) + 1));  // score onwards
    for (std::string v; std::getline(fields, v, ',');) f.push_back(std::stod(v));
    ASSERT_EQ(f.size(), 5u) << line;
    const double cx = (f[1] + f[3]) / 2, cy = (f[2] + f[4]) / 2, half = (f[3] - f[1]) / 2;
    for (size_t k = 0; k < discs.size(); ++k)
      if (std::hypot(cx - discs[k][0], cy - discs[k][1]) < 2.0) {
        ++found[k];
        EXPECT_NEAR(half, discs[k][2], 1.5) << line;
      }
  }
  EXPECT_EQ(rows, int(discs.size()));
  for (size_t k = 0; k < discs.size(); ++k) EXPECT_EQ(found[k], 1) << "disc " << k;
}

// What a detector must not give: each is a clear error, of the model (exit 1) or of the image (exit 2).
TEST_F(Pipeline, DetectionsThatMakeNoSenseAreClearErrors) {
  const std::string dir = root_ + "/detect_bad";
  fs::create_directories(dir);
  writeImage(dir + "/grey.tif", cv::Mat(96, 96, CV_8UC3, cv::Scalar::all(200)), SampleType::kU8);
  const auto tiler = [&](const std::string& name, const std::string& forward, const std::string& extra = "") {
    return run(kTiler + " -i " + dir + " -m " + saveDetector(root_ + "/" + name + ".pt", forward) + " -o " +
               root_ + "/out_" + name + " --task detect --window 64 --threads 1 --no_progress" + extra);
  };
  const std::string body = R"JIT(
def forward(self, x):
    b = x.size(0)
    w = float(x.size(3))
    h = float(x.size(2))
)JIT";
  auto r =
      tiler("det_swapped",
            body + "    return torch.tensor([w, 0.0, 0.0, h, 1.0, 0.0]).view(1, 1, 6).expand(b, 1, 6)\n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("x2 < x1 or y2 < y1"), std::string::npos) << r.output;
  r = tiler(
      "det_nan",
      body + "    return torch.tensor([0.0, 0.0, w, h, float('nan'), 0.0]).view(1, 1, 6).expand(b, 1, 6)\n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("grey.tif': window 0 (column 0, row 0), box 0 of 1: its score is not a number"),
            std::string::npos)
      << r.output;
  r = tiler("det_five", body + "    return torch.zeros(b, 3, 5)\n");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--task detect needs boxes [batch, N, 6]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the output is [1, 3, 5]"), std::string::npos) << r.output;
  // --save objects says the task; the output shape alone never does.
  r = run(kTiler + " -i " + dir + " -m " + root_ + "/det_five.pt -o " + root_ +
          "/out_det_saved --save objects --window 64 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--task detect needs boxes [batch, N, 6]"), std::string::npos) << r.output;
  r = tiler("det_nms", body + "    return torch.zeros(b, 3, 6)\n", " --nms 1.5");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--nms is an IoU in [0, 1) (0: none), not 1.5"), std::string::npos) << r.output;
  r = run(kTiler + " -i " + dir + " -m " + model_ + " -o " + root_ + "/out_seg_nms --nms 0.5 --no_progress");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--nms is for --task detect's boxes"), std::string::npos) << r.output;
  r = tiler("det_tta", body + "    return torch.zeros(b, 3, 6)\n", " --tta flip");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--tta is for maps and vectors"), std::string::npos) << r.output;
  // A box as large as the window: every window keeps its own, cut where the window ends inside the image.
  r = tiler("det_whole",
            body + "    return torch.tensor([0.0, 0.0, w, h, 1.0, 0.0]).view(1, 1, 6).expand(b, 1, 6)\n");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("touch a window edge inside the image"), std::string::npos) << r.output;
  const auto e = *imageEntry(report(root_ + "/out_det_whole"), "grey.tif");
  EXPECT_GT(e["objects_at_window_edge"].get<int64_t>(), 0) << e;
  EXPECT_EQ(e["objects"], e["windows"]) << e;
  for (const char* name : {"out_det_swapped", "out_det_nan"})
    EXPECT_FALSE(fs::exists(root_ + "/" + name + "/grey_objects.geojson"))
        << name << ": nothing half-written";
}

// What a detector may give and what tiler then says: no rows at all is an answer (nothing found); a row count
// that changes is shown as the model gave it; NaN in padding rows is no value of the image; a classifier of
// more classes than a heatmap holds is refused before any image.
TEST_F(Pipeline, DetectorsWithoutRowsVaryingRowsOrNaNPaddingAreTakenAsTheyAre) {
  const std::string dir = root_ + "/detect_shapes";
  fs::create_directories(dir);
  writeImage(dir + "/grey.tif", cv::Mat(96, 96, CV_8UC3, cv::Scalar::all(200)), SampleType::kU8);
  const auto tiler = [&](const std::string& name, const std::string& forward, const std::string& extra) {
    return run(kTiler + " -i " + dir + " -m " + saveDetector(root_ + "/" + name + ".pt", forward) + " -o " +
               root_ + "/out_" + name + " --window 64 --batch_size 4 --threads 1 --no_progress " + extra);
  };
  auto r = tiler("det_none", "def forward(self, x):\n    return torch.zeros(x.size(0), 0, 6)\n",
                 "--task detect --save objects,coco");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(imageEntry(report(root_ + "/out_det_none"), "grey.tif")->value("objects", -1), 0);
  EXPECT_EQ(nlohmann::json::parse(slurp(root_ + "/out_det_none/grey_objects.geojson"))["features"].size(),
            0u);
  r = tiler("det_vary", "def forward(self, x):\n    return torch.zeros(x.size(0), 3 * x.size(0), 6)\n",
            "--task detect");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the model's output is [4, 12, 6] for 4 windows, not [4, 3, 6]"), std::string::npos)
      << r.output;
  r = tiler("det_nan_padding", R"JIT(
def forward(self, x):
    b = x.size(0)
    nan = float('nan')
    rows = torch.tensor([[nan, nan, nan, nan, 0.0, nan], [0.0, 0.0, 8.0, 8.0, 1.0, 0.0]])
    return rows.view(1, 2, 6).expand(b, 2, 6)
)JIT",
            "--task detect --save objects_csv");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto e = *imageEntry(report(root_ + "/out_det_nan_padding"), "grey.tif");
  EXPECT_EQ(e.value("non_finite_values", int64_t(0)), 0) << e;
  EXPECT_EQ(e["objects"], 1) << e;
  r = tiler("classes_600", "def forward(self, x):\n    return torch.zeros(x.size(0), 600)\n",
            "--task classify --save csv,heatmap");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--save heatmap holds at most 512 classes"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/out_classes_600/grey.csv")) << "refused before any image";
}

// Discs of known centres and radii on a dark ground (some across the windows' borders, two that touch and
// make one object, some cut by the image's edge), and what the bundled instance model must find: the
// 8-connected parts of the pixels it calls bright, computed here over the whole image.
struct DiscScene {
  cv::Mat image;  // 8-bit RGB
  cv::Mat parts;  // int32: 0, or the whole image's part 1..n
  int n = 0;
};
DiscScene discScene() {
  const int W = 300, H = 260;
  const std::vector<std::array<double, 3>> discs = {
      {40.3, 30.6, 10},  {96.5, 100.2, 14}, {160.1, 96.4, 8},   {130, 200.5, 20}, {250.7, 40.2, 12},
      {290.4, 250.6, 7}, {8.2, 240.5, 6},   {200.6, 170.3, 16}, {226, 170, 11},   {64, 64, 5}};
  DiscScene s;
  s.image = cv::Mat(H, W, CV_8UC3, cv::Scalar::all(40));
  for (const auto& [x, y, r] : discs)
    for (int py = 0; py < H; ++py)
      for (int px = 0; px < W; ++px)
        if (std::hypot(px + 0.5 - x, py + 0.5 - y) <= r)
          s.image.at<cv::Vec3b>(py, px) = cv::Vec3b(220, 200, 180);
  cv::Mat grey;
  cv::cvtColor(s.image, grey, cv::COLOR_RGB2GRAY);
  s.n = cv::connectedComponents(grey > 100, s.parts, 8, CV_32S) - 1;
  return s;
}

// Every pixel of `got` (a uint32 instance TIFF) is an object exactly where `want` has a part, one object for
// each part.
void expectSameObjects(const std::string& tiff, const cv::Mat& want, int parts) {
  cv::Mat got = ImageReader::open(tiff)->readRegion({0, 0, want.cols, want.rows});
  ASSERT_EQ(got.type(), CV_32S);
  std::map<int, int> to_part, to_object;
  for (int y = 0; y < want.rows; ++y)
    for (int x = 0; x < want.cols; ++x) {
      const int g = got.at<int32_t>(y, x), w = want.at<int32_t>(y, x);
      ASSERT_EQ(g == 0, w == 0) << "pixel " << x << ", " << y;
      if (g == 0) continue;
      ASSERT_EQ(to_part.emplace(g, w).first->second, w) << "object " << g << " at " << x << ", " << y;
      ASSERT_EQ(to_object.emplace(w, g).first->second, g) << "part " << w << " at " << x << ", " << y;
    }
  EXPECT_EQ(int(to_part.size()), parts);
}

// The bundled instance model over the discs: every object once, exactly the whole image's parts (the TIFF
// pixel for pixel; the GeoJSON's outlines of their pixel counts), on 1, 2 and 3 ranks to the byte.
TEST_F(Pipeline, InstancesAreTheWholeImagesObjectsWhateverTheWorldSize) {
  const DiscScene scene = discScene();
  const std::string dir = root_ + "/instances";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", scene.image, SampleType::kU8);
  const std::string args =
      " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
      "/samples/models/instances.pt --task instances --window 128 --overlap 0.5 "
      "--batch_size 4 --threads 1 --save objects,objects_csv,instances --no_progress -o ";
  auto r = run(kTiler + args + root_ + "/out_instances1");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string out = root_ + "/out_instances1";
  expectSameObjects(out + "/discs_instances.tif", scene.parts, scene.n);
  const auto e = *imageEntry(report(out), "discs.tif");
  EXPECT_EQ(e["objects"], scene.n) << e;
  EXPECT_EQ(e["objects_at_window_edge"], 0) << e;
  const auto geojson = nlohmann::json::parse(slurp(out + "/discs_objects.geojson"));
  ASSERT_EQ(int(geojson["features"].size()), scene.n);
  std::multiset<double> want_areas, got_areas;
  for (int k = 1; k <= scene.n; ++k) want_areas.insert(cv::countNonZero(scene.parts == k));
  for (const auto& f : geojson["features"]) {
    got_areas.insert(f["properties"]["measurements"]["area"].get<double>());
    EXPECT_EQ(f["properties"]["objectType"], "detection");
    EXPECT_EQ(f["geometry"]["type"], "Polygon") << f["id"];
  }
  EXPECT_EQ(got_areas, want_areas);
  if (run("command -v ogrinfo").code == 0) {
    auto ogr = run("ogrinfo -so -al " + out + "/discs_objects.geojson");
    EXPECT_NE(ogr.output.find("Feature Count: " + std::to_string(scene.n)), std::string::npos) << ogr.output;
    // OGR's own area of every outline: the pixel counts, to the pixel.
    ogr = run("ogrinfo -q -dialect SQLite -sql \"SELECT SUM(ST_Area(geometry)) AS a FROM discs_objects\" " +
              out + "/discs_objects.geojson");
    EXPECT_NE(ogr.output.find("a (Real) = " + std::to_string(cv::countNonZero(scene.parts))),
              std::string::npos)
        << ogr.output;
  }
  for (int ranks : {2, 3}) {
    const std::string other = root_ + "/out_instances" + std::to_string(ranks);
    r = run(kCtrun + " --nproc_per_node " + std::to_string(ranks) + " --master_port 0 " + kTiler + args +
            other);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* file : {"discs_objects.geojson", "discs_objects.csv", "discs_instances.tif"})
      EXPECT_TRUE(slurp(other + "/" + file) == slurp(out + "/" + file)) << ranks << " ranks: " << file;
  }
}

// A mask over the left half (x < 150): the windows of columns 0 and 1 (128 px at a stride of 64) run, those
// of columns 2 to 4 do not, so exactly the parts whose centroid lies in columns 0 and 1's cores (x < 160) are
// found.
TEST_F(Pipeline, MaskedInstancesAreThoseOfTheWindowsThatRan) {
  const DiscScene scene = discScene();
  const std::string dir = root_ + "/instances_masked", out = root_ + "/out_instances_masked";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", scene.image, SampleType::kU8);
  cv::Mat half(scene.image.rows, scene.image.cols, CV_8U, cv::Scalar(0));
  half.colRange(0, half.cols / 2).setTo(255);
  cv::imwrite(root_ + "/left_half.png", half);
  auto r =
      run(kTiler + " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
          "/samples/models/instances.pt --task instances --window 128 --overlap 0.5 --threads 1 --mask " +
          root_ + "/left_half.png --mask_fraction 0.5 --save instances --no_progress -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  cv::Mat stats, centroids, want;
  cv::Mat grey;
  cv::cvtColor(scene.image, grey, cv::COLOR_RGB2GRAY);
  const int n = cv::connectedComponentsWithStats(grey > 100, want, stats, centroids, 8, CV_32S) - 1;
  int kept = 0;
  for (int k = 1; k <= n; ++k) {
    if (centroids.at<double>(k, 0) + 0.5 < 160) {
      ++kept;
    } else {
      want.setTo(0, want == k);
    }
  }
  ASSERT_GT(kept, 0);
  ASSERT_LT(kept, n);
  expectSameObjects(out + "/discs_instances.tif", want, kept);
  EXPECT_EQ(imageEntry(report(out), "discs.tif")->at("objects"), kept);
}

// At a coarser resolution (--mpp): the objects of the image as processed, each at its level-0 place.
TEST_F(Pipeline, InstancesAtACoarserResolutionAreInLevel0Pixels) {
  const DiscScene scene = discScene();
  const std::string dir = root_ + "/instances_mpp", out = root_ + "/out_instances_mpp";
  fs::create_directories(dir);
  writeImage(dir + "/discs.tif", scene.image, SampleType::kU8);
  auto r = run(kTiler + " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
               "/samples/models/instances.pt --task instances --window 64 --overlap 0.5 --input_mpp 0.25 "
               "--mpp 0.5 --threads 1 --save objects_csv,instances --no_progress -o " +
               out);
  ASSERT_EQ(r.code, 0) << r.output;
  // The TIFF is the processed image's size; the CSV's centroids are the level-0 parts' centroids.
  cv::Mat tiff = ImageReader::open(out + "/discs_instances.tif")->readRegion({0, 0, 150, 130});
  EXPECT_EQ(tiff.size(), cv::Size(150, 130));
  cv::Mat stats, centroids, labels;
  cv::Mat grey;
  cv::cvtColor(scene.image, grey, cv::COLOR_RGB2GRAY);
  cv::connectedComponentsWithStats(grey > 100, labels, stats, centroids, 8, CV_32S);
  std::istringstream csv(slurp(out + "/discs_objects.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "id,class,score,area,centroid_x,centroid_y,x1,y1,x2,y2");
  std::vector<int> found(size_t(scene.n + 1), 0);
  while (std::getline(csv, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string v; std::getline(fields, v, ',');) f.push_back(v);
    ASSERT_GE(f.size(), 6u) << line;
    const double cx = std::stod(f[4]), cy = std::stod(f[5]), area = std::stod(f[3]);
    for (int k = 1; k <= scene.n; ++k)
      if (std::hypot(cx - centroids.at<double>(k, 0) - 0.5, cy - centroids.at<double>(k, 1) - 0.5) < 1.0) {
        ++found[size_t(k)];
        EXPECT_NEAR(area, stats.at<int>(k, cv::CC_STAT_AREA), 0.1 * stats.at<int>(k, cv::CC_STAT_AREA) + 8)
            << line;
      }
  }
  for (int k = 1; k <= scene.n; ++k) EXPECT_EQ(found[size_t(k)], 1) << "part " << k;
}

// What an instance model must not give: each is a clear error, of the model (exit 1) or of the image (exit
// 2), and nothing is half-written.
TEST_F(Pipeline, InstanceMapsThatMakeNoSenseAreClearErrors) {
  const std::string dir = root_ + "/instances_bad";
  fs::create_directories(dir);
  writeImage(dir + "/grey.tif", cv::Mat(96, 96, CV_8UC3, cv::Scalar::all(200)), SampleType::kU8);
  const auto tiler = [&](const std::string& name, const std::string& forward, const std::string& extra = "") {
    return run(kTiler + " -i " + dir + " -m " + saveDetector(root_ + "/" + name + ".pt", forward) + " -o " +
               root_ + "/out_" + name + " --task instances --window 64 --threads 1 --no_progress" + extra);
  };
  auto r = tiler("inst_half", "def forward(self, x):\n    return x.mean([1], True) * 0.5\n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("grey.tif': window 0 (column 0, row 0): pixel (0, 0) of the instance map is 0.39"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/out_inst_half/grey_objects.geojson"));
  EXPECT_TRUE(fs::is_empty(root_ + "/out_inst_half/") ||
              !fs::exists(root_ + "/out_inst_half/grey_objects.geojson.partial"));
  r = tiler("inst_huge", "def forward(self, x):\n    return x.mean([1], True) * 0.0 + 4294967296.0\n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("of the instance map is 4294967296, not an object id"), std::string::npos)
      << r.output;
  r = tiler("inst_vector", "def forward(self, x):\n    return x.mean([2, 3])\n");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--task instances needs an instance map [batch, 1 + K, h, w]"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("the output is [1, 3]"), std::string::npos) << r.output;
  const std::string ids = "def forward(self, x):\n    return (x.mean([1], True) > 0.5).float()\n";
  r = tiler("inst_tta", ids, " --tta flip");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--tta is for maps and vectors, not --task instances' ids"), std::string::npos)
      << r.output;
  r = tiler("inst_act", ids, " --activation sigmoid");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("would turn --task instances' ids into fractions"), std::string::npos) << r.output;
  r = tiler("inst_classes", ids, " --classes a,b");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--classes names 2 class(es), the model gives 0 class channel(s)"),
            std::string::npos)
      << r.output;
  // --save instances says the task. The one object fills every window: each window sees it cut by its
  // edges inside the image, so none keeps it, and the run says so.
  r = run(kTiler + " -i " + dir + " -m " + root_ + "/inst_tta.pt -o " + root_ +
          "/out_inst_saved --save instances --window 64 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("were cut by a window edge inside the image"), std::string::npos) << r.output;
  const auto e = *imageEntry(report(root_ + "/out_inst_saved"), "grey.tif");
  EXPECT_EQ(e["objects"], 0) << e;
  EXPECT_GT(e["objects_at_window_edge"].get<int64_t>(), 0) << e;
  r = run(kTiler + " -i " + dir + " -m " + root_ + "/inst_tta.pt -o " + root_ +
          "/out_inst_coco --task instances --save coco --window 64 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--save coco is an output of --task detect, not of --task instances"),
            std::string::npos)
      << r.output;
}

// Ids are read as the model gives them: int64 ids past float32's 2^24 stay apart (16777216 and 16777217 are
// one float), and 2^31 - 1 is an id.
TEST_F(Pipeline, InstanceIdsPastFloatsRangeStayApart) {
  const std::string dir = root_ + "/instances_int", out = root_ + "/out_instances_int";
  fs::create_directories(dir);
  writeImage(dir + "/grey.tif", cv::Mat(96, 96, CV_8UC3, cv::Scalar::all(200)), SampleType::kU8);
  // Three 8x4 objects side by side in every window's middle.
  const std::string model = saveDetector(root_ + "/int_ids.pt",
                                         "def forward(self, x):\n"
                                         "    ids = (x[:, :1] * 0).long()\n"
                                         "    ids[:, :, 24:28, 28:36] = 2147483647\n"
                                         "    ids[:, :, 28:32, 28:36] = 16777216\n"
                                         "    ids[:, :, 32:36, 28:36] = 16777217\n"
                                         "    return ids\n");
  auto r = run(kTiler + " -i " + dir + " -m " + model + " -o " + out +
               " --task instances --window 64 --threads 1 --save objects_csv --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto e = *imageEntry(report(out), "grey.tif");
  EXPECT_EQ(e["objects"], 12) << e;  // 3 in each of the 2 x 2 windows
  std::istringstream csv(slurp(out + "/grey_objects.csv"));
  std::string line;
  std::getline(csv, line);
  while (std::getline(csv, line))
    EXPECT_NE(line.find(",,,32,"), std::string::npos) << line;  // 32 pixels each
}

// An instance model whose maps have another scale than its windows runs on MONAI's grid by default (the
// lattice lays windows out in input pixels: every image failed with "a lattice grid is for per-window
// models"); asking for the lattice with it, or for what only a stitched map takes, stops at set-up (exit 1),
// before any image.
TEST_F(Pipeline, InstanceModelsAtAnotherScaleAndMapFlagsAreSettledAtSetUp) {
  const std::string dir = root_ + "/instances_scaled";
  fs::create_directories(dir);
  cv::Mat disc(96, 96, CV_8UC3, cv::Scalar::all(0));
  cv::circle(disc, {48, 48}, 10, cv::Scalar::all(255), -1);
  writeImage(dir + "/disc.tif", disc, SampleType::kU8);
  const std::string ids = "(x.mean([1], True) > 0.5).float()";
  const std::string doubled =
      saveDetector(root_ + "/inst_x2.pt", "def forward(self, x):\n    return " + ids +
                                              ".repeat_interleave(2, 2).repeat_interleave(2, 3)\n");
  const std::string halved = saveDetector(root_ + "/inst_half_scale.pt",
                                          "def forward(self, x):\n    return " + ids + "[:, :, ::2, ::2]\n");
  const auto tiler = [&](const std::string& model, const std::string& out, const std::string& extra = "") {
    return run(kTiler + " -i " + dir + " -m " + model + " -o " + root_ + "/" + out +
               " --task instances --window 64 --threads 1 --no_progress" + extra);
  };
  const std::vector<std::pair<std::string, std::string>> scaled = {{doubled, "out_inst_x2"},
                                                                   {halved, "out_inst_half_scale"}};
  for (const auto& [model, out] : scaled) {
    auto r = tiler(model, out);
    EXPECT_EQ(r.code, 0) << r.output;
    const nlohmann::json written = report(root_ + "/" + out);
    const auto* e = imageEntry(written, "disc.tif");
    ASSERT_NE(e, nullptr) << r.output;
    EXPECT_EQ((*e)["objects"], 1) << *e;
    r = tiler(model, out + "_lattice", " --edge lattice");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("--edge lattice needs maps of the window's size; '" + model + "' gives maps at"),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(root_ + "/" + out + "_lattice/disc_objects.geojson"));
  }
  for (const std::string flag : {"--blend crop", "--format png", "--probs_dtype u8", "--stitch device"}) {
    auto r = tiler(doubled, "out_inst_flag", " " + flag);
    EXPECT_EQ(r.code, 1) << flag << "\n" << r.output;
    const std::string name = flag.substr(0, flag.find(' '));
    EXPECT_NE(r.output.find(name + " is for a stitched map (--task segment); --task instances finds objects"),
              std::string::npos)
        << r.output;
  }
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

// Per-window models: a tiny encoder ([B, 8]: 3x3 stride-2 convolution, relu, mean over the window) and a
// classifier (its features through a linear head, [B, 3]), saved under `root`.
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

TEST_F(Pipeline, EmbedWritesTheGridsFeaturesByteIdenticalForOneToThreeRanks) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  const std::string encoder = perWindowModel(root_, "encoder", "    return f\n");
  const std::string args = " -i " + root_ + "/images -m " + encoder +
                           " --window 64 --batch_size 4 --threads 1 --no_progress --encoder_name tiny"
                           " --save features,features_pt -o ";
  const std::string ref = root_ + "/out_embed1";
  auto r = run(kTiler + args + ref);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rep = report(ref);
  EXPECT_EQ(rep["task"], "embed") << "a [B, D] output without an activation is an encoder";
  EXPECT_EQ(rep["feature_dim"], 8);
  // No overlap by default: a_large.tif (700 x 500) in 64 px windows is 11 x 8 on TRIDENT's and CLAM's patch
  // lattice: the last column starts at 640 and reaches past the edge (padded), so that x / 64 names a cell.
  const WindowGrid grid(700, 500, GridSpec{64, 64, 0.0, 0.0, /*lattice=*/true});
  EXPECT_EQ(grid.count(), 88);
  EXPECT_EQ(grid.imageWindow(10).x, 640);
  const std::string h5 = ref + "/a_large.h5";
  const auto coords = test::h5dumpValues(h5, "coords");
  ASSERT_EQ(coords.size(), size_t(2 * grid.count()));
  for (int64_t w = 0; w < grid.count(); ++w) {
    EXPECT_EQ(coords[size_t(2 * w)], grid.imageWindow(w).x) << w;
    EXPECT_EQ(coords[size_t(2 * w + 1)], grid.imageWindow(w).y) << w;
  }
  // The features are the model's forward of each window (window 13: column 2, row 1), values / 255.
  cv::Mat pixels;
  cv::cvtColor(cv::imread(root_ + "/images/a_large.tif", cv::IMREAD_UNCHANGED), pixels, cv::COLOR_BGR2RGB);
  const Rect w13 = grid.imageWindow(13);
  cv::Mat window;
  pixels(cv::Rect(int(w13.x), int(w13.y), 64, 64)).convertTo(window, CV_32FC3, 1.0 / 255);
  auto x = torch::from_blob(window.data, {1, 64, 64, 3}).permute({0, 3, 1, 2}).contiguous();
  auto module = torch::jit::load(encoder);
  const auto expected = module.forward({x}).toTensor();
  const auto row = test::h5dumpValues(h5, "features", "-s 13,0 -c 1,8");
  ASSERT_EQ(row.size(), 8u);
  for (int d = 0; d < 8; ++d) EXPECT_NEAR(row[size_t(d)], expected[0][d].item<float>(), 1e-5) << d;
  // CLAM's pt_files/<slide>.pt beside it: the same rows as one tensor.
  const std::string pt = slurp(ref + "/a_large.pt");
  const auto tensor = torch::jit::pickle_load(std::vector<char>(pt.begin(), pt.end())).toTensor();
  ASSERT_EQ(tensor.sizes(), (std::vector<int64_t>{88, 8}));
  for (int d = 0; d < 8; ++d)
    EXPECT_NEAR(tensor[13][d].item<float>(), expected[0][d].item<float>(), 1e-5) << d;
  auto attrs = run("h5dump -a /coords/encoder -a /coords/patch_size " + h5);
  EXPECT_NE(attrs.output.find("\"tiny\""), std::string::npos) << attrs.output;
  EXPECT_NE(attrs.output.find("(0): 64"), std::string::npos) << attrs.output;
  // CLAM's and TRIDENT's reader, where Python has h5py.
  if (run("/usr/bin/python3 -c 'import h5py'").code == 0) {
    auto py = run("/usr/bin/python3 -c \"import h5py; f = h5py.File('" + h5 +
                  "', 'r'); print(f['features'][:].shape, f['features'].dtype, f['coords'][:].shape, "
                  "f['coords'].dtype, f['coords'].attrs['name'])\"");
    EXPECT_NE(py.output.find("(88, 8) float32 (88, 2) int64 a_large"), std::string::npos) << py.output;
  }
  for (int n : {2, 3}) {
    const std::string out = root_ + "/out_embed" + std::to_string(n);
    r = run(kCtrun + " --nproc_per_node " + std::to_string(n) + " --master_port 0 " + kTiler + args + out);
    ASSERT_EQ(r.code, 0) << r.output;
    int files = 0;
    for (const auto& e : fs::directory_iterator(ref)) {
      if (e.path().extension() != ".h5" && e.path().extension() != ".pt") continue;
      ++files;
      EXPECT_TRUE(slurp(e.path().string()) == slurp(out + "/" + e.path().filename().string()))
          << e.path().filename() << " with " << n << " ranks";
    }
    EXPECT_EQ(files, 10);
  }
  // --edge shift: MONAI's grid, the last column shifted back to end at the edge.
  const std::string shifted = root_ + "/out_embed_shift";
  r = run(kTiler + args + shifted + " --edge shift");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(test::h5dumpValues(shifted + "/a_large.h5", "coords")[2 * 10], 700 - 64);
  r = run(kTiler + args + root_ + "/out_embed_bad_edge --edge diagonal");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--edge must be auto, lattice or shift"), std::string::npos) << r.output;
  // The model is never an output: slide.png's features_pt would be the model itself, slide.pt.
  const std::string same = root_ + "/embed_model_dir";
  fs::create_directories(same);
  fs::copy_file(root_ + "/images/c_small.png", same + "/slide.png");
  fs::copy_file(encoder, same + "/slide.pt");
  const std::string model = slurp(same + "/slide.pt");
  r = run(kTiler + " -i " + same + "/slide.png -m " + same +
          "/slide.pt --window 64 --threads 1 --no_progress --save features_pt --overwrite -o " + same);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("is read by this run"), std::string::npos) << r.output;
  EXPECT_TRUE(slurp(same + "/slide.pt") == model) << "the model was overwritten";
}

TEST_F(Pipeline, ClassifyWritesCsvTilesAndHeatmapThatGdalReads) {
  const std::string classifier =
      perWindowModel(root_, "classifier", "    return torch.matmul(f, self.head.t())\n");
  const std::string out = root_ + "/out_classify";
  auto r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + classifier + " -o " + out +
               " --window 64 --batch_size 4 --threads 1 --no_progress --activation softmax "
               "--classes stroma,tumor:#ff0000,fat --save csv,tiles,heatmap");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(report(out)["task"], "classify") << "softmax over a [B, K] output: a classifier";
  EXPECT_EQ(report(out)["feature_dim"], 3);
  std::istringstream csv(slurp(out + "/a_large.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "minx,miny,width,height,prob_stroma,prob_tumor,prob_fat");
  int rows = 0;
  while (std::getline(csv, line)) {
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream in(line);
    double x, y, w, h, p0, p1, p2;
    in >> x >> y >> w >> h >> p0 >> p1 >> p2;
    EXPECT_NEAR(p0 + p1 + p2, 1.0, 1e-5) << line;
    EXPECT_EQ(w, 64);
    ++rows;
  }
  EXPECT_EQ(rows, 88);
  const auto tiles = nlohmann::json::parse(slurp(out + "/a_large_tiles.geojson"));
  ASSERT_EQ(tiles["features"].size(), 88u);
  EXPECT_EQ(tiles["features"][0]["properties"]["objectType"], "tile");
  if (have("ogrinfo")) {
    for (const char* file : {"a_large.csv", "a_large_tiles.geojson"}) {
      auto info = run("ogrinfo -ro -so -al " + out + "/" + file);
      EXPECT_NE(info.output.find("Feature Count: 88"), std::string::npos) << file << "\n" << info.output;
    }
  }
  if (have("gdalinfo")) {
    auto info = run("gdalinfo " + out + "/a_large_heatmap.tif");
    EXPECT_NE(info.output.find("Size is 11, 8"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("Band 3 Block"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("NoData Value=nan"), std::string::npos) << info.output;
    // A GeoTIFF's heatmap is georeferenced: a pixel spans a stride (64 px of 10 m), from the same origin.
    const std::string geo = root_ + "/geo_in";
    fs::create_directories(geo);
    auto t = run("gdal_translate -q -a_srs EPSG:32633 -a_ullr 500000 6000000 507000 5995000 " + root_ +
                 "/images/a_large.tif " + geo + "/scene.tif");
    ASSERT_EQ(t.code, 0) << t.output;
    r = run(kTiler + " -i " + geo + " -m " + classifier + " -o " + out +
            "_geo --window 64 --threads 1 --no_progress --task classify --save heatmap");
    ASSERT_EQ(r.code, 0) << r.output;
    info = run("gdalinfo " + out + "_geo/scene_heatmap.tif");
    EXPECT_NE(info.output.find("Pixel Size = (640.000000000000000,-640.000000000000000)"), std::string::npos)
        << info.output;
    EXPECT_NE(info.output.find("Origin = (500000.000000000000000,6000000.000000000000000)"),
              std::string::npos)
        << info.output;
    EXPECT_NE(info.output.find("32633"), std::string::npos) << info.output;
  }
}

TEST_F(Pipeline, EmbedUnderAMaskAndAtAnotherResolution) {
  TILER_SKIP_WITHOUT_FEATURE("hdf5");
  TILER_SKIP_WITHOUT_TOOL("h5dump");
  const std::string encoder = perWindowModel(root_, "encoder_mask", "    return f\n");
  // The mask keeps the left 128 columns of a_large.tif (700 x 500): 2 of 11 window columns, 8 rows.
  cv::Mat mask(500, 700, CV_8UC1, cv::Scalar(0));
  mask(cv::Rect(0, 0, 128, 500)).setTo(255);
  cv::imwrite(root_ + "/mask.png", mask);
  const std::string out = root_ + "/out_embed_mask";
  auto r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + encoder + " -o " + out + " --mask " +
               root_ + "/mask.png --window 64 --threads 1 --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  auto coords = test::h5dumpValues(out + "/a_large.h5", "coords");
  ASSERT_EQ(coords.size(), 2u * 16) << "the masked windows are absent";
  for (size_t k = 0; k < 16; ++k) EXPECT_LT(coords[2 * k], 128) << k;
  // At twice the source's um/px: windows of 64 processing pixels are 128 level-0 pixels apart.
  const std::string half = root_ + "/out_embed_mpp";
  r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + encoder + " -o " + half +
          " --input_mpp 0.25 --mpp 0.5 --window 64 --threads 1 --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  coords = test::h5dumpValues(half + "/a_large.h5", "coords");
  const WindowGrid grid(350, 250, GridSpec{64, 64, 0.0, 0.0, /*lattice=*/true});
  ASSERT_EQ(coords.size(), size_t(2 * grid.count()));
  EXPECT_EQ(coords[2], 128);
  EXPECT_EQ(coords[2 * 5], 2 * 320) << "the last column, on the lattice past the edge";
  auto attrs = run("h5dump -a /coords/patch_size_level0 -a /coords/mpp " + half + "/a_large.h5");
  EXPECT_NE(attrs.output.find("(0): 128"), std::string::npos) << attrs.output;
  EXPECT_NE(attrs.output.find("(0): 0.5"), std::string::npos) << attrs.output;
}

// A build without GDAL or HDF5 stops a job whose --save needs one before any work, in one line that says how
// to build it in; without OpenSlide a whole-slide file fails alone and the rest of the batch goes on. CI's
// build with the optional features off runs this; a build with all of them skips it.
TEST_F(Pipeline, AFeatureThisBuildLacksStopsWhatNeedsIt) {
  if (test::featureBuilt("gdal") && test::featureBuilt("hdf5") && test::featureBuilt("openslide"))
    GTEST_SKIP() << "this build has every optional feature";
  const std::string base = " -i " + root_ + "/images/c_small.png --window 64 --threads 1 --no_progress -o ";
  if (!test::featureBuilt("gdal")) {
    const std::string out = root_ + "/out_no_gdal";
    auto r = run(kTiler + base + out + " -m " + model_ + " --save labels,polygons");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("--save polygons needs gdal, which this tiler was built without"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("-DTILER_WITH_GDAL=ON"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out + "/c_small_labels.tif")) << "stopped before any work";
  }
  if (!test::featureBuilt("hdf5")) {
    const std::string out = root_ + "/out_no_hdf5";
    const std::string encoder = perWindowModel(root_, "encoder_nohdf5", "    return f\n");
    auto r = run(kTiler + base + out + " -m " + encoder + " --task embed");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("--save features needs hdf5"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out + "/c_small.h5"));
    r = run(kTiler + base + out + " -m " + encoder + " --task embed --save features_pt");
    EXPECT_EQ(r.code, 0) << "the tensor file needs no HDF5: " << r.output;
    EXPECT_TRUE(fs::exists(out + "/c_small.pt"));
  }
  if (!test::featureBuilt("openslide")) {
    const std::string in = root_ + "/in_no_openslide", out = root_ + "/out_no_openslide";
    fs::create_directories(in);
    fs::copy_file(root_ + "/images/c_small.png", in + "/c_small.png");
    test::writeAbsurdTiff(in + "/slide.svs", 3, 1000);
    auto r = run(kTiler + " -i " + in + " --window 64 --threads 1 --no_progress -o " + out + " -m " + model_);
    EXPECT_EQ(r.code, 2) << "some images failed: " << r.output;
    EXPECT_NE(r.output.find("slide.svs' (a whole-slide format) needs openslide"), std::string::npos)
        << r.output;
    EXPECT_TRUE(fs::exists(out + "/c_small_labels.tif")) << "the rest of the batch goes on";
  }
}

// The bundled three-head model (samples/models/heads.pt: np, hv, tp, HoVerNet's maps) with --heads: each
// head's files, <stem>_<head>_..., are the bytes of a run of that head alone (--output_key) with the same
// settings, on 1, 2 and 3 ranks.
TEST_F(Pipeline, ThreeHeadsWriteWhatEachHeadAloneWritesOnOneToThreeRanks) {
  const std::string common = " -i " + root_ + "/images/a_large.tif -i " + root_ + "/images/d_gray16.tif -m " +
                             TILER_TEST_SOURCE_DIR + "/samples/models/heads.pt" +
                             " --window 128 --batch_size 4 --threads 1 --no_progress -o ";
  const std::string heads =
      " --save labels,probs --heads np:segment,hv,tp --head_opt np.activation=softmax --head_opt "
      "tp.activation=sigmoid "
      "--head_opt hv.save=probs --head_opt tp.classes=a,b,c --head_opt tp.probs_dtype=u8";
  const std::pair<std::string, std::string> alone[] = {
      {"np", " --output_key np --activation softmax --save labels,probs"},
      {"hv", " --output_key hv --save probs"},
      {"tp", " --output_key tp --activation sigmoid --classes a,b,c --probs_dtype u8 --save labels,probs"}};
  std::map<std::string, std::string> expected;  // a head's file name -> its bytes alone
  for (const auto& [head, flags] : alone) {
    const std::string out = root_ + "/heads_" + head;
    auto r = run(kTiler + common + out + flags);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const auto& e : fs::directory_iterator(out)) {
      const std::string name = e.path().filename().string();
      if (e.path().extension() != ".tif") continue;
      for (const std::string stem : {"a_large", "d_gray16"})
        if (name.rfind(stem + "_", 0) == 0)
          expected[stem + "_" + head + name.substr(stem.size())] = slurp(e.path().string());
    }
  }
  EXPECT_EQ(expected.size(), 10u) << "np and tp: labels and probs, hv: probs; two images";
  for (int n : {1, 2, 3}) {
    const std::string out = root_ + "/heads_all" + std::to_string(n);
    const std::string launch =
        n == 1 ? kTiler : kCtrun + " --nproc_per_node " + std::to_string(n) + " --master_port 0 " + kTiler;
    auto r = run(launch + common + out + heads);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const auto& [name, bytes] : expected)
      EXPECT_TRUE(slurp(out + "/" + name) == bytes) << name << " on " << n << " rank(s)";
    int files = 0;
    for (const auto& e : fs::directory_iterator(out)) files += e.path().extension() == ".tif";
    EXPECT_EQ(files, 10) << n;
    EXPECT_EQ(report(out)["task"], "np:segment,hv:segment,tp:segment");
  }
  // Settings that cannot hold for several heads are refused before any work, in one line.
  auto r = run(kTiler + common + root_ + "/heads_key" + heads + " --output_key np");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--output_key picks one output, --heads several"), std::string::npos) << r.output;
  r = run(kTiler + common + root_ + "/heads_opt --heads np --head_opt tp.activation=none");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("no head 'tp' in --heads"), std::string::npos) << r.output;
}

// --task regress (heads.pt's hv head: a regression in [-1, 1]) writes the bytes of segment's float32 probs
// without an activation, alone or as a head hv:regress; what would misread its values is refused at set-up.
TEST_F(Pipeline, ARegressionMapIsWrittenAsSegmentsFloatProbsAndRefusesLabels) {
  const std::string common = " -i " + root_ + "/images/c_small.png -m " + TILER_TEST_SOURCE_DIR +
                             "/samples/models/heads.pt --window 64 --threads 1 --no_progress -o " + root_;
  auto r = run(kTiler + common +
               "/hv_segment --output_key hv --task segment --activation none --save probs "
               "--probs_dtype f32");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string expected = slurp(root_ + "/hv_segment/c_small_probs.tif");
  r = run(kTiler + common + "/hv_regress --output_key hv --task regress");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(slurp(root_ + "/hv_regress/c_small_probs.tif") == expected);
  EXPECT_EQ(report(root_ + "/hv_regress")["task"], "regress");
  r = run(kTiler + common + "/hv_head --heads hv:regress");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(slurp(root_ + "/hv_head/c_small_hv_probs.tif") == expected);
  EXPECT_EQ(report(root_ + "/hv_head")["task"], "hv:regress");
  const std::pair<std::string, std::string> refused[] = {
      {" --save labels", "--save labels is an output of --task segment, not of --task regress"},
      {" --probs_dtype u8", "--task regress's values are not in [0, 1]"},
      {" --activation softmax", "--task regress takes a regression map as the model gave it"}};
  for (const auto& [flags, message] : refused) {
    r = run(kTiler + common + "/hv_refused --output_key hv --task regress" + flags);
    EXPECT_EQ(r.code, 1) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

// A segment head and an embed head of one encoder: a stitched map takes MONAI's grid and a vector the patch
// lattice, so the pair is refused in one line naming both; a detect head (records) likewise.
TEST_F(Pipeline, HeadsOfAMapAndAVectorAreRefusedNamingWhy) {
  torch::jit::Module m("Mixed");
  torch::manual_seed(4);
  m.register_parameter("w", torch::randn({4, 3, 1, 1}), false);
  m.define(R"JIT(
def forward(self, x):
    f = torch.conv2d(x, self.w)
    return (f[:, 0:2], torch.mean(f, [2, 3]))
)JIT");
  const std::string model = root_ + "/mixed_heads.pt";
  m.save(model);
  const std::string args = kTiler + " -i " + root_ + "/images/c_small.png -m " + model +
                           " --window 64 --threads 1 --no_progress -o " + root_ + "/mixed_out";
  auto r = run(args + " --heads 0:segment,1:embed");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--heads mixes a stitched map and one vector a window (head '0': --task segment, "
                          "head '1': --task embed)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/mixed_out/c_small_0_labels.tif"));
  // Each head alone runs.
  r = run(args + " --output_key 1 --task embed --save features_pt");
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(Pipeline, AnOutputThatIsNeitherMapNorVectorFailsNamingItsShapeAndTheTasks) {
  const std::string base = " -i " + root_ + "/images/c_small.png --window 64 --threads 1 --no_progress -o ";
  struct Case {
    std::string forward, flags, message;
  };
  const std::vector<Case> cases = {
      {"    return torch.mean(f, [1])\n", "", "output [1] has 1 dimension(s)"},
      {"    return torch.stack([f, f], 2)\n", "", "output [1, 8, 2] has 3 dimension(s)"},
      {"    return f\n", "--task segment", "--task segment needs NCHW maps, but the output [1, 8]"},
      {"    return f\n", "--save labels", "--save labels is an output of --task segment"},
      {"    return f\n", "--task embed --classes a,b", "--classes names classes"},
      {"    return f[:, :0]\n", "--task embed", "output [1, 0] is empty"},
  };
  int k = 0;
  for (const auto& c : cases) {
    const std::string model = perWindowModel(root_, "bad" + std::to_string(k), c.forward);
    const std::string out = root_ + "/out_bad" + std::to_string(k++);
    auto r = run(kTiler + base + out + " -m " + model + " " + c.flags);
    EXPECT_EQ(r.code, 1) << c.forward << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.forward << c.flags << "\n" << r.output;
    if (c.flags.empty() && c.message.find("empty") == std::string::npos) {
      EXPECT_NE(r.output.find("--task classify | embed"), std::string::npos) << r.output;
    }
    EXPECT_FALSE(fs::exists(out + "/report.json"));
  }
  // A directory where the model belongs says what a model directory must hold (a model card's package).
  auto r = run(kTiler + base + root_ + "/out_bad_dir -m " + root_);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(
      r.output.find("is a directory without rdf.yaml or bioimageio.yaml (bioimage.io), or config.json and "
                    "torchscript_model.pt (WSInfer)"),
      std::string::npos)
      << r.output;
  // --task and --save that disagree are refused before the model loads.
  r = run(kTiler + base + root_ + "/out_bad_save --task embed --save csv -m /nonexistent.pt");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--save csv is an output of --task classify, not of --task embed"),
            std::string::npos)
      << r.output;
  // A feature size that changes between batches fails the images of that batch, clearly.
  const std::string varying = perWindowModel(root_, "varying", "    return f.repeat(1, x.size(0))\n");
  const std::string out = root_ + "/out_varying";
  r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + varying + " -o " + out +
          " --window 64 --batch_size 4 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 2) << r.output;
  const std::string error = (*imageEntry(report(out), "a_large.tif"))["error"];
  EXPECT_NE(error.find("the model's output is [4, 32] for 4 windows, not [4, 8]"), std::string::npos)
      << error;
  EXPECT_FALSE(fs::exists(out + "/a_large.h5"));
  EXPECT_FALSE(fs::exists(out + "/a_large.h5.partial"));
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

}  // namespace
}  // namespace tiler

// Remote inputs: URLs served by tests/range_server.py (HTTP with Range), read by byte ranges through GDAL.
namespace tiler {
namespace {

std::string remoteArgs(const std::string& inputs, const std::string& model, const std::string& out) {
  return kTiler + " -i " + inputs + " -m " + model + " -o " + out +
         " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress ";
}

void writeList(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream list(path);
  list << "# inputs of a remote run\n\n";
  for (const auto& line : lines) list << line << "\n";
}

// A tiled TIFF and an SVS named in a list of URLs write the bytes their local files write; the SVS, which
// OpenSlide reads here, is read by libtiff there, at OpenSlide's µm/px.
TEST_F(Pipeline, RemoteInputsInAListOfUrlsWriteTheLocalFilesBytes) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = root_ + "/remote_src";
  fs::create_directories(dir);
  test::writeNoiseTiff(dir + "/tiled.tif", 640);
  cv::Mat rgb = pattern(500, 600, CV_8UC3, 255);
  test::makeSlide(rgb, dir + "/plain.tif", dir + "/slide.svs");
  test::RangeServer server(dir);
  writeList(root_ + "/local.txt", {dir + "/tiled.tif", dir + "/slide.svs"});
  writeList(root_ + "/urls.txt", {server.url("tiled.tif"), server.url("slide.svs?token=a/b")});
  const std::string local = root_ + "/remote_local_out", remote = root_ + "/remote_out";
  auto l = run(remoteArgs(root_ + "/local.txt", model_, local));
  ASSERT_EQ(l.code, 0) << l.output;
  auto r = run(remoteArgs(root_ + "/urls.txt", model_, remote));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* f : {"/tiled_labels.tif", "/tiled_probs.tif", "/slide_labels.tif", "/slide_probs.tif"}) {
    ASSERT_TRUE(fs::exists(remote + f)) << f;
    EXPECT_TRUE(slurp(local + f) == slurp(remote + f)) << f << ": remote outputs are the local ones";
  }
  const nlohmann::json images = report(remote)["images"];
  ASSERT_EQ(images.size(), 2u);
  for (const auto& e : images) {
    EXPECT_EQ(e["reader"], "tiff") << e;
    EXPECT_GT(e["remote_bytes_read"].get<int64_t>(), 0) << e;
  }
  EXPECT_EQ(images[0]["input"], server.url("slide.svs?token=a/b"));
  EXPECT_EQ(images[0]["mpp"], 0.25) << "the SVS's µm/px from its Aperio description";
  EXPECT_FALSE(report(local)["images"][0].contains("remote_bytes_read"))
      << "local inputs read no bytes remotely";
}

// A mask that keeps a corner: its windows' tiles (and the header) are all that comes over the network, on
// one rank or two (the report sums what each rank fetched; two ranks both read the tiles their windows
// share).
TEST_F(Pipeline, ACornerOfARemoteImageFetchesLittleOfTheFile) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = root_ + "/remote_corner";
  fs::create_directories(dir);
  test::writeNoiseTiff(dir + "/big.tif", 2048);
  const auto file_size = int64_t(fs::file_size(dir + "/big.tif"));
  cv::Mat mask = cv::Mat::zeros(2048, 2048, CV_8U);
  mask(cv::Rect(0, 0, 256, 256)).setTo(255);
  writeImage(root_ + "/corner_mask.png", mask, SampleType::kU8);
  for (const int ranks : {1, 2}) {
    test::RangeServer server(dir);
    const std::string out = root_ + "/remote_corner_out" + std::to_string(ranks);
    auto r = run(kCtrun + " --nproc_per_node " + std::to_string(ranks) + " --master_port 0 " +
                 remoteArgs(server.url("big.tif"), model_, out) + " --mask " + root_ + "/corner_mask.png");
    ASSERT_EQ(r.code, 0) << r.output;
    const nlohmann::json e = report(out)["images"][0];
    EXPECT_LT(e["windows_processed"].get<int64_t>(), e["windows"].get<int64_t>() / 10) << e;
    const int64_t fetched = e["remote_bytes_read"].get<int64_t>();
    EXPECT_GT(fetched, 256 * 256 * 3) << e;
    EXPECT_LT(fetched, file_size / 6) << ranks << " rank(s) fetched " << fetched << " of " << file_size;
    EXPECT_EQ(fetched, server.bytesSent()) << "the report counts what the server sent";
  }
}

// A server that loses the connection mid-read fails that image alone, naming the URL and what happened; the
// batch's other image is written, the exit code says some failed, and --resume against a good server redoes
// the failed one to the local file's bytes.
TEST_F(Pipeline, ALostConnectionFailsThatImageAloneAndResumeRedoesIt) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = root_ + "/remote_drop";
  fs::create_directories(dir);
  test::writeNoiseTiff(dir + "/small.tif", 256);
  test::writeNoiseTiff(dir + "/cut.tif", 1024);
  test::RangeServer good(dir), cutting(dir, long(fs::file_size(dir + "/cut.tif") / 3));
  const std::string out = root_ + "/remote_drop_out", local = root_ + "/remote_drop_local";
  writeList(root_ + "/drop.txt", {good.url("small.tif"), cutting.url("cut.tif")});
  auto r = run(remoteArgs(root_ + "/drop.txt", model_, out));
  EXPECT_EQ(r.code, kExitSomeFailed) << r.output;
  const nlohmann::json images = report(out)["images"];
  ASSERT_EQ(images.size(), 2u);
  const auto& cut = images[0]["input"] == cutting.url("cut.tif") ? images[0] : images[1];
  const auto& small = images[0]["input"] == cutting.url("cut.tif") ? images[1] : images[0];
  EXPECT_EQ(small["status"], "ok") << small;
  EXPECT_EQ(cut["status"], "error") << cut;
  const std::string error = cut["error"].get<std::string>();
  EXPECT_NE(error.find("'" + cutting.url("cut.tif") + "': TIFFReadTile failed at tile"), std::string::npos)
      << error;
  EXPECT_NE(error.find("the connection was lost or the transfer cut short"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(out + "/cut_labels.tif")) << "nothing of the failed image is final";

  writeList(root_ + "/drop_again.txt", {good.url("small.tif"), good.url("cut.tif")});
  auto again = run(remoteArgs(root_ + "/drop_again.txt", model_, out) + " --resume");
  ASSERT_EQ(again.code, 0) << again.output;
  const nlohmann::json resumed = report(out)["images"];
  for (const auto& e : resumed)
    EXPECT_EQ(e["status"], e["input"] == good.url("small.tif") ? "skipped" : "ok") << e;
  auto l = run(remoteArgs(dir + "/cut.tif", model_, local));
  ASSERT_EQ(l.code, 0) << l.output;
  for (const char* f : {"/cut_labels.tif", "/cut_probs.tif"})
    EXPECT_TRUE(slurp(local + f) == slurp(out + f)) << f << ": the resumed image is the local file's";
}

// A busy server (503) is asked again after GDAL's back-off (tiler's default: 4 retries from 1 s, doubling)
// unless the user set GDAL_HTTP_MAX_RETRY, whose value then holds.
TEST_F(Pipeline, ABusyServerIsAskedAgainUnlessTheUserSetsNoRetries) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = root_ + "/remote_busy";
  fs::create_directories(dir);
  test::writeNoiseTiff(dir + "/busy.tif", 256);
  test::RangeServer busy(dir, -1, 1);
  auto retried = run(kTiler + " info " + busy.url("busy.tif"));
  EXPECT_EQ(retried.code, 0) << retried.output;
  EXPECT_NE(retried.output.find("256x256, 3 channel(s)"), std::string::npos) << retried.output;
  EXPECT_GT(retried.seconds, 1.0) << "the retry waited GDAL_HTTP_RETRY_DELAY";
  test::RangeServer busy_again(dir, -1, 1);
  auto refused = run("GDAL_HTTP_MAX_RETRY=0 " + kTiler + " info " + busy_again.url("busy.tif"));
  EXPECT_NE(refused.code, 0) << refused.output;
  EXPECT_NE(
      refused.output.find("'" + busy_again.url("busy.tif") + "': cannot open it: HTTP response code: 503"),
      std::string::npos)
      << refused.output;
}

}  // namespace
}  // namespace tiler
