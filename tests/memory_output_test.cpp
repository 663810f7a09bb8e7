// writers/memory_output: an output directory in memory; the writers that keep what they write there.
#include "tiler/writers/memory_output.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "tiler/core/error.hpp"
#include "tiler/writers/map_writers.hpp"
#include "tiler/writers/output_file.hpp"

using namespace tiler;

namespace {

// A memory directory for one test, dropped with what is left.
struct MemoryDir {
  std::string name = registerMemoryOutput();
  ~MemoryDir() { unregisterMemoryOutput(name); }
};

}  // namespace

TEST(MemoryOutput, ATextFileKeepsItsBytesAtCommitAndWritesNoFile) {
  MemoryDir dir;
  const std::string path = dir.name + "/a_objects.geojson";
  ASSERT_TRUE(isMemoryOutput(path));
  {
    TextFile file(path);
    file.write("{\"type\": ");
    file.write(std::string("\"FeatureCollection\"}\n\0x", 24));
    file.finish();
    EXPECT_FALSE(takeMemoryText(path)) << "kept before its commit";
    std::vector<std::string> renamed;
    file.commit(renamed);
    EXPECT_EQ(renamed, std::vector<std::string>{path});
  }
  EXPECT_EQ(takeMemoryText(path), std::string("{\"type\": \"FeatureCollection\"}\n\0x", 33));
  EXPECT_FALSE(takeMemoryText(path)) << "taken once";
  EXPECT_FALSE(std::filesystem::exists(dir.name));
  {
    TextFile dropped(dir.name + "/b.csv");
    dropped.write("id\n");
    dropped.finish();
  }
  EXPECT_FALSE(takeMemoryText(dir.name + "/b.csv")) << "an uncommitted file keeps nothing";
}

TEST(MemoryOutput, MapWritersKeepLabelsAndProbabilitiesAsTheirFilesHoldThem) {
  MemoryDir dir;
  MapOutput map;
  map.width = 3, map.height = 2, map.classes = 2;
  auto labels = makeMapWriter("labels", dir.name + "/a_labels.tif", map);
  auto probs = makeMapWriter("probs", dir.name + "/a_probs.tif", map);
  ASSERT_TRUE(labels && probs);
  EXPECT_TRUE(labels->needsLabels() && !labels->needsProbs());
  EXPECT_TRUE(probs->needsProbs() && !probs->needsLabels());
  // Two bands of one row each: labels 0..5, probabilities (p, 1 - p) interleaved.
  for (int row = 0; row < 2; ++row) {
    cv::Mat l(1, 3, CV_8U), p(1, 3, CV_32FC2);
    for (int x = 0; x < 3; ++x) {
      l.at<uint8_t>(0, x) = uint8_t(row * 3 + x);
      p.at<cv::Vec2f>(0, x) = {float(row * 3 + x) / 10, 1 - float(row * 3 + x) / 10};
    }
    labels->write({&l, nullptr});
    probs->write({nullptr, &p});
  }
  EXPECT_TRUE(commitWriters({labels.get(), probs.get()}).size() == 2);
  auto kept_labels = takeMemoryArray(dir.name + "/a_labels.tif");
  auto kept_probs = takeMemoryArray(dir.name + "/a_probs.tif");
  ASSERT_TRUE(kept_labels && kept_probs);
  EXPECT_EQ(kept_labels->type, SampleType::kU8);
  EXPECT_EQ(kept_labels->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(kept_probs->type, SampleType::kF32);
  EXPECT_EQ(kept_probs->shape, (std::vector<int64_t>{2, 2, 3}));
  const auto* p = reinterpret_cast<const float*>(kept_probs->data.get());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(kept_labels->data[size_t(i)], i);
    EXPECT_FLOAT_EQ(p[i], float(i) / 10);          // plane 0
    EXPECT_FLOAT_EQ(p[6 + i], 1 - float(i) / 10);  // plane 1
  }
}

TEST(MemoryOutput, AMapWriterRefusesAnUnfinishedMapAndAnotherKind) {
  MemoryDir dir;
  MapOutput map;
  map.width = 2, map.height = 2;
  auto labels = makeMapWriter("labels", dir.name + "/a_labels.tif", map);
  cv::Mat row = cv::Mat::zeros(1, 2, CV_8U);
  labels->write({&row, nullptr});
  try {
    labels->finish();
    FAIL() << "finished with 1 of 2 rows";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2 rows"), std::string::npos) << e.what();
  }
  try {
    makeMapWriter("zarr", dir.name + "/a.ome.zarr", map);
    FAIL() << "zarr in memory";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--save zarr"), std::string::npos) << e.what();
  }
}

TEST(MemoryOutput, KindsKeptAndTheDirectoryReleased) {
  for (const char* kind : {"labels", "probs", "np/labels", "objects", "objects_csv", "csv", "tiles", "coco"})
    EXPECT_EQ(memoryKindRefusal(kind), "") << kind;
  for (const char* kind :
       {"polygons", "zarr", "features", "features_pt", "heatmap", "instances", "objects_store"})
    EXPECT_NE(memoryKindRefusal(kind).find(std::string("--save ") + kind), std::string::npos) << kind;
  EXPECT_FALSE(isMemoryOutput("out/memory:out-1"));
  EXPECT_FALSE(isMemoryOutput("memory:0/image")) << "an input in memory is no output directory";
  std::string name;
  {
    MemoryDir dir;
    name = dir.name;
    keepMemoryText(name + "/report.json", "{}");
  }
  EXPECT_FALSE(takeMemoryText(name + "/report.json")) << "dropped with its directory";
  EXPECT_THROW(keepMemoryText(name + "/report.json", "{}"), IoError);
}
