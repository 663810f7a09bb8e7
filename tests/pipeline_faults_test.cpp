// End-to-end tests of `tiler infer` when something fails: bad inputs and flags, set-up errors, the failure
// matrix (a rank failing in each stage, with and without a launcher), hung ranks and timeouts, a full disk,
// side outputs and planted links, a feature this build lacks.
#include "pipeline_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <opencv2/imgproc.hpp>

#include "slide_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

namespace tiler::e2e {
namespace {

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

// TILER_FAULT's write failure on an objects store: from the 2nd window a_discs's store can grow no more, as
// on a full disk; a_discs fails with SQLite's "disk is full" and none of its files is left under a final
// name; b_discs goes on, its files as a clean run's.
TEST_F(Pipeline, AFullDiskFailsTheObjectsStoresImageAlone) {
  const std::string dir = root_ + "/store_full";
  fs::create_directories(dir);
  cv::Mat image(512, 512, CV_8UC3, cv::Scalar::all(40));
  for (int y = 8; y < 512; y += 16)
    for (int x = 8; x < 512; x += 16) cv::circle(image, {x, y}, 4, cv::Scalar(220, 200, 180), cv::FILLED);
  writeImage(dir + "/a_discs.tif", image, SampleType::kU8);
  writeImage(dir + "/b_discs.tif", image(cv::Rect(0, 0, 256, 256)).clone(), SampleType::kU8);
  const std::string args = kTiler + " -i " + dir + " -m " + TILER_TEST_SOURCE_DIR +
                           "/samples/models/instances.pt --task instances --window 128 --overlap 0.5 "
                           "--threads 1 --save objects,objects_store --no_progress -o ";
  const std::string out = root_ + "/out_store_full", clean = root_ + "/out_store_clean";
  auto r = run("TILER_FAULT=rank:0,after_windows:2,kind:throw,stage:write " + args + out);
  EXPECT_EQ(r.code, 2) << r.output;
  ASSERT_EQ(run(args + clean).code, 0);
  const auto j = report(out);
  const auto& failed = *imageEntry(j, "a_discs.tif");
  EXPECT_EQ(failed["status"], "error");
  EXPECT_NE(failed["error"].get<std::string>().find("a_discs_objects.db.partial"), std::string::npos)
      << failed;
  EXPECT_NE(failed["error"].get<std::string>().find("disk is full"), std::string::npos) << failed;
  EXPECT_FALSE(fs::exists(out + "/a_discs_objects.db"));
  EXPECT_FALSE(fs::exists(out + "/a_discs_objects.geojson"));
  EXPECT_TRUE(partialFiles(out).empty());
  EXPECT_EQ((*imageEntry(j, "b_discs.tif"))["status"], "ok");
  for (const char* file : {"b_discs_objects.db", "b_discs_objects.geojson"})
    EXPECT_TRUE(slurp(out + "/" + file) == slurp(clean + "/" + file)) << file;
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
  // Each refusal names the flag, the value given and what it takes (the words a user searches for), not a
  // sentence.
  struct Case {
    std::string flags;
    std::vector<std::string> names;
  };
  const std::vector<Case> cases = {
      {"--save ''", {"--save", "labels", "(segment)"}},
      {"--save labels,", {"--save", "labels", "(segment)"}},
      {"--save labels,features", {"--save labels,features", "segment", "embed"}},
      {"--task instance", {"--task", "'instance'", "instances"}},
      {"--threads -3", {"> 0", "-3"}},
      {"--replicas 0", {"> 0", "0"}},
      {"--stitch gpu", {"--stitch", "'gpu'", "device"}},
      {"--scale nan", {">= 0", "nan"}},
      {"--mean 0.5,inf,0.5", {"finite", "inf"}},
      {"--timeout inf", {"> 0", "inf"}},
      {"--timeout 1e10", {"--timeout", "2147483", "1e+10"}},
      {"--timeout 1e308", {"--timeout", "2147483", "1e+308"}},
      {"--mpp -1", {"> 0", "-1"}},
      {"--level -2", {">= 0", "-2"}},
      {"--compression deflate:13", {"--compression deflate", "1 to 12", "'deflate:13'"}},
      {"--compression zstd:", {"--compression zstd", "1 to 22", "'zstd:'"}},
      {"--compression lzw:5", {"--compression lzw", "no level", "'lzw:5'"}},
      {"--compression brotli", {"--compression", "zstd", "'brotli'"}},
  };
  // Without the suite's --save and --threads, which the cases set themselves.
  const std::string base = kTiler + " -i " + root_ + "/images/c_small.png -m " + model_ + " -o " + out +
                           " --window 64 --no_progress ";
  for (const auto& c : cases) {
    auto r = run(base + c.flags);
    EXPECT_EQ(r.code, 1) << c.flags << "\n" << r.output;
    for (const std::string& name : c.names)
      EXPECT_NE(r.output.find(name), std::string::npos) << c.flags << ": " << name << "\n" << r.output;
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

}  // namespace
}  // namespace tiler::e2e
