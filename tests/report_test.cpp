// The report: statuses as users read them, the exit code they imply, atomic writes.
#include "tiler/dist/report.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

WindowCatalog catalogWith(const std::vector<std::string>& statuses) {
  WindowCatalog c;
  for (size_t i = 0; i < statuses.size(); ++i) {
    CatalogImage img;
    img.input = "in" + std::to_string(i) + ".tif";
    img.status = statuses[i];
    img.info.width = img.info.height = 10;
    img.grid = WindowGrid(10, 10, GridSpec{8, 8, 0.25, 0.25});
    img.outputs["labels"] = "out/" + std::to_string(i) + "_labels.tif";
    if (statuses[i] == "error") img.error = "'" + img.input + "': broken";
    c.add(img, statuses[i] == "done" || statuses[i] == "ok");
  }
  return c;
}

TEST(Report, StatusesAndExitCode) {
  RunSummary run;
  run.world_size = 2;
  auto j = inferReport(run, catalogWith({"done", "skipped", "error", "ok"}), {RankStats{4, 1, 2, 3, 5}});
  ASSERT_EQ(j["images"].size(), 4u);
  EXPECT_EQ(j["images"][0]["status"], "ok");
  EXPECT_EQ(j["images"][1]["status"], "skipped");
  EXPECT_EQ(j["images"][2]["status"], "error");
  EXPECT_EQ(j["images"][2]["error"], "'in2.tif': broken");
  EXPECT_FALSE(j["images"][2].contains("outputs")) << "a failed image names no outputs";
  EXPECT_EQ(j["images"][3]["status"], "error") << "planned but never committed";
  EXPECT_NE(j["images"][3]["error"].get<std::string>().find("in3.tif"), std::string::npos);
  EXPECT_EQ(j["windows_total"], 8);
  EXPECT_EQ(j["per_rank"][0]["forward_seconds"], 2.0);
  EXPECT_EQ(j["per_rank"][0]["tiles_decoded"], 0);
  EXPECT_EQ(j["per_rank"][0]["bytes_written"], 0);
  EXPECT_EQ(j["per_rank"][0]["images_owned"], 0);
  EXPECT_EQ(j["shard_run"], 1);
  EXPECT_EQ(j["startup_seconds"], 0.0);
  RankStats slow;
  slow.startup_seconds = 2.5;
  EXPECT_EQ(inferReport(run, catalogWith({"done"}), {RankStats{}, slow})["startup_seconds"], 2.5)
      << "the slowest rank's start";
  EXPECT_EQ(exitCodeOf(j), kExitSomeFailed);
  EXPECT_EQ(exitCodeOf(inferReport(run, catalogWith({"done", "skipped"}), {})), kExitOk);
}

TEST(Report, RankStatsRoundTrip) {
  RankStats s{7, 0.5, 1.5, 2.5, 100, 4097, 3.25, int64_t(1) << 40, 3, 1.75};
  RankStats back = RankStats::unpack(s.pack());
  EXPECT_EQ(back.startup_seconds, 1.75);
  EXPECT_EQ(back.windows, 7);
  EXPECT_EQ(back.gather_seconds, 2.5);
  EXPECT_EQ(back.tiles_decoded, 4097);
  EXPECT_EQ(back.write_seconds, 3.25);
  EXPECT_EQ(back.bytes_written, int64_t(1) << 40);
  EXPECT_EQ(back.images_owned, 3);
  EXPECT_THROW(RankStats::unpack({1, 2}), Error);
  s.wall_seconds = 9, s.libtorch_seconds = 0.5, s.model_load_seconds = 0.25, s.probe_seconds = 0.125;
  s.setup_seconds = 0.875, s.wait_read_seconds = 1, s.wait_forward_seconds = 3, s.submit_seconds = 0.5;
  s.other_seconds = 0.25, s.drain_seconds = 2, s.normalize_seconds = 0.0625;
  back = RankStats::unpack(s.pack());
  EXPECT_EQ(back.wall_seconds, 9);
  EXPECT_EQ(back.setup_seconds, 0.875);
  EXPECT_EQ(back.drain_seconds, 2);
  EXPECT_EQ(back.normalize_seconds, 0.0625);
  // The critical path: start-up's four parts, the step's five and the drain, each once.
  const nlohmann::json stages = stageSeconds(back);
  EXPECT_EQ(stages["critical_path"].size(), 10u);
  EXPECT_EQ(stages["critical_path"]["gather"], 2.5);
  EXPECT_EQ(stages["critical_path_sum"], 0.5 + 0.25 + 0.125 + 0.875 + 1 + 3 + 2.5 + 0.5 + 0.25 + 2);
  EXPECT_EQ(stages["wall"], 9);
  EXPECT_EQ(stages["overlapped"]["forward"], 1.5);
  EXPECT_EQ(stages["overlapped"]["normalize"], 0.0625);
  EXPECT_FALSE(stages["critical_path"].contains("forward")) << "busy seconds of other threads are apart";
}

TEST(Report, JitOptimizeAndTimedLayouts) {
  RunSummary run;
  run.jit_optimize = false;
  run.jit_optimize_fallback = "why";
  run.layouts_timed = {{"1x2", 0.02}, {"2x1", 0.015}};
  auto j = inferReport(run, catalogWith({"done"}), {RankStats{}});
  EXPECT_EQ(j["jit_optimize"], false);
  EXPECT_EQ(j["jit_optimize_fallback"], "why");
  EXPECT_EQ(j["layouts_timed"]["2x1"], 0.015);
  EXPECT_TRUE(j["per_rank"][0].contains("stages"));
  run = RunSummary{};
  j = inferReport(run, catalogWith({"done"}), {RankStats{}});
  EXPECT_FALSE(j.contains("layouts_timed")) << "no layouts timed: none reported";
  EXPECT_FALSE(j.contains("jit_optimize_fallback"));
}

TEST(Report, JsonIsWrittenAtomically) {
  const std::string dir = test::scratchDir("report");
  writeJsonAtomically(dir + "/r.json", nlohmann::json{{"a", 1}});
  EXPECT_EQ(nlohmann::json::parse(test::slurp(dir + "/r.json"))["a"], 1);
  EXPECT_FALSE(fs::exists(dir + "/r.json.partial"));
  EXPECT_THROW(writeJsonAtomically("/proc/no/such/dir/r.json", nlohmann::json{}), std::exception);
  removeTree(dir);
}

// An input whose name is not UTF-8 (bytes ff fe) must not cost the report: JSON holds only UTF-8, so such
// bytes are written as \xNN and the name still says which file it was.
TEST(Report, NamesThatAreNotUtf8AreEscapedNotFatal) {
  const std::string dir = test::scratchDir("report_utf8");
  auto catalog = catalogWith({"error", "done"});
  catalog.image(0).input = "bad\xff\xfe.tif";
  catalog.image(0).error = "'bad\xff\xfe.tif': broken";
  catalog.image(1).outputs["labels"] = "out/caf\xc3\xa9\xe9_labels.tif";
  writeJsonAtomically(dir + "/r.json", inferReport(RunSummary{}, catalog, {}));
  const auto j = nlohmann::json::parse(test::slurp(dir + "/r.json"));
  EXPECT_EQ(j["images"][0]["input"], "bad\\xff\\xfe.tif");
  EXPECT_EQ(j["images"][0]["error"], "'bad\\xff\\xfe.tif': broken");
  EXPECT_EQ(j["images"][1]["outputs"]["labels"], "out/caf\xc3\xa9\\xe9_labels.tif") << "valid UTF-8 kept";
  removeTree(dir);
}

}  // namespace
}  // namespace tiler
