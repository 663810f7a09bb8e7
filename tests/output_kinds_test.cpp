// output_kinds: the one table of --save's kinds.
#include "tiler/core/output_kinds.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tiler/core/error.hpp"

using namespace tiler;

TEST(OutputKinds, TasksAndTheirOutputKinds) {
  EXPECT_EQ(parseTask("embed"), ModelTask::kEmbed);
  EXPECT_EQ(parseTask("auto"), ModelTask::kAuto);
  EXPECT_EQ(parseTask("detect"), ModelTask::kDetect);
  EXPECT_EQ(parseTask("instances"), ModelTask::kInstances);
  EXPECT_THROW(parseTask("instance"), ConfigError);
  EXPECT_EQ(defaultOutputKinds(ModelTask::kDetect), std::vector<std::string>{"objects"});
  EXPECT_EQ(defaultOutputKinds(ModelTask::kInstances), std::vector<std::string>{"objects"});
  EXPECT_EQ(taskOfOutputKind("coco"), ModelTask::kDetect);
  // objects and objects_csv are both object tasks' outputs: detect unless --task instances says so.
  EXPECT_EQ(taskOfOutputKind("objects"), ModelTask::kDetect);
  EXPECT_TRUE(taskWrites(ModelTask::kInstances, "objects_csv"));
  EXPECT_FALSE(taskWrites(ModelTask::kInstances, "coco"));
  EXPECT_EQ(taskOfOutputKind("instances"), ModelTask::kInstances);
  EXPECT_EQ(outputFileName("instances", "a", "png"), "a_instances.tif");
  EXPECT_THROW(parseTask(""), ConfigError);
  EXPECT_EQ(defaultOutputKinds(ModelTask::kSegment), std::vector<std::string>{"labels"});
  EXPECT_EQ(defaultOutputKinds(ModelTask::kEmbed), std::vector<std::string>{"features"});
  EXPECT_EQ(defaultOutputKinds(ModelTask::kClassify), (std::vector<std::string>{"csv", "tiles"}));
  EXPECT_EQ(taskOfOutputKind("heatmap"), ModelTask::kClassify);
  EXPECT_EQ(taskOfOutputKind("probs"), ModelTask::kSegment);
  EXPECT_EQ(taskOfOutputKind("features"), ModelTask::kEmbed);
  EXPECT_EQ(taskOfOutputKind("feature"), ModelTask::kAuto);
  EXPECT_EQ(outputFileName("features", "a", "tif"), "a.h5");
  EXPECT_EQ(outputFileName("features_pt", "a", "tif"), "a.pt");
  EXPECT_EQ(outputFileName("tiles", "a", "tif"), "a_tiles.geojson");
  EXPECT_EQ(outputFileName("heatmap", "a", "png"), "a_heatmap.tif");
}

// Every row is whole: a name once, a file name once, its defaults among its tasks, each task a default.
TEST(OutputKinds, TheTableIsConsistent) {
  std::set<std::string> names, patterns;
  for (const OutputKind& kind : outputKinds()) {
    EXPECT_TRUE(names.insert(kind.name).second) << kind.name;
    EXPECT_TRUE(patterns.insert(kind.pattern).second) << kind.name;
    EXPECT_FALSE(kind.tasks.empty()) << kind.name;
    for (ModelTask task : kind.default_for) EXPECT_TRUE(taskWrites(task, kind.name)) << kind.name;
  }
  for (const char* task : {"segment", "classify", "embed", "detect", "instances"})
    EXPECT_FALSE(defaultOutputKinds(parseTask(task)).empty()) << task;
  EXPECT_EQ(findOutputKind("nothing"), nullptr);
  EXPECT_THROW(outputFileName("nothing", "a", "tif"), ConfigError);
}

TEST(OutputKinds, AStoreIsADirectoryKindOfSegment) {
  const OutputKind* zarr = findOutputKind("zarr");
  ASSERT_NE(zarr, nullptr);
  EXPECT_TRUE(zarr->directory);
  EXPECT_EQ(outputFileName("zarr", "slide", "png"), "slide.ome.zarr");
  EXPECT_EQ(taskOfOutputKind("zarr"), ModelTask::kSegment);
  EXPECT_FALSE(findOutputKind("labels")->directory);
  EXPECT_EQ(std::string(findOutputKind("polygons")->feature), "gdal");
  EXPECT_EQ(std::string(findOutputKind("features")->feature), "hdf5");
}

// The stale-partial sweep reads what each writer leaves from its row: scratch files and TIFF levels, a
// scratch's levels too (polygons' own labels TIFF under --pyramid).
TEST(OutputKinds, PartialPathsComeFromTheRow) {
  const auto has = [](const std::vector<std::string>& paths, const std::string& path) {
    return std::find(paths.begin(), paths.end(), path) != paths.end();
  };
  const auto polygons = partialPaths(*findOutputKind("polygons"), "o/s_polygons.geojson");
  EXPECT_EQ(polygons.front(), "o/s_polygons.geojson.partial");
  EXPECT_TRUE(has(polygons, "o/s_polygons.geojson.labels.tif.partial"));
  EXPECT_TRUE(has(polygons, "o/s_polygons.geojson.labels.tif.level1.partial"));
  EXPECT_TRUE(
      has(polygons, "o/s_polygons.geojson.labels.tif.level" + std::to_string(kMaxTiffLevels) + ".partial"));
  const auto pt = partialPaths(*findOutputKind("features_pt"), "o/s.pt");
  EXPECT_EQ(pt, (std::vector<std::string>{"o/s.pt.partial", "o/s.pt.rows.partial"}));
  EXPECT_TRUE(has(partialPaths(*findOutputKind("probs"), "o/s_probs.tif"), "o/s_probs.tif.level3.partial"));
  EXPECT_EQ(partialPaths(*findOutputKind("zarr"), "o/s.ome.zarr"),
            std::vector<std::string>{"o/s.ome.zarr.partial"});
  EXPECT_EQ(partialPaths(*findOutputKind("csv"), "o/s.csv"), std::vector<std::string>{"o/s.csv.partial"});
}

// --save's help and refusals are made from the table: a new row shows in both.
TEST(OutputKinds, HelpAndRefusalsListEveryKind) {
  EXPECT_EQ(
      saveKindsText(),
      "labels, probs, polygons and zarr (segment), features and features_pt (embed), csv, tiles and "
      "heatmap (classify), objects, objects_csv and coco (detect), or objects, objects_csv and instances "
      "(instances)");
  EXPECT_EQ(
      saveHelpText(),
      "comma-separated: labels, probs, polygons, zarr (segment; default labels), features, features_pt "
      "(embed; default features), csv, tiles, heatmap (classify; default csv,tiles), objects, objects_csv, "
      "coco (detect; default objects), objects, objects_csv, instances (instances; default objects)");
}

// A head of a model with several outputs writes its kinds under <stem>_<head>_...; its kind is its row's.
TEST(OutputKinds, AHeadsKindsAreNamedAfterTheStemAndTheHead) {
  EXPECT_EQ(headKind("np", "labels"), "np/labels");
  EXPECT_EQ(headKind("", "labels"), "labels");
  EXPECT_EQ(outputFileName(headKind("np", "labels"), "slide", "tif"), "slide_np_labels.tif");
  EXPECT_EQ(outputFileName(headKind("hv", "zarr"), "slide", "tif"), "slide_hv.ome.zarr");
  EXPECT_EQ(outputFileName(headKind("0", "features"), "slide", "tif"), "slide_0.h5");
  ASSERT_NE(findOutputKind("np/zarr"), nullptr);
  EXPECT_TRUE(findOutputKind("np/zarr")->directory);
  EXPECT_TRUE(taskWrites(ModelTask::kSegment, "np/probs"));
  EXPECT_EQ(findOutputKind("np/nothing"), nullptr);
}
