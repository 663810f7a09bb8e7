// End-to-end tests of `tiler infer` over an output directory that holds a run already: --resume and
// --overwrite, a crashed rank restarted and resumed, the reading marks a dead run leaves, the directory's
// lock.
#include "pipeline_util.hpp"

#include <tiffio.h>
#include <unistd.h>

#include <fstream>

#include "ended_naming.hpp"
#include "slide_util.hpp"
#include "tiler/core/platform.hpp"

namespace tiler::e2e {
namespace {

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
  EXPECT_TRUE(test::endedNaming(r, 2, {"a_good.svs'", "was reading it", "OpenSlide", "probe process"}));
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

}  // namespace
}  // namespace tiler::e2e
