// tasks_test: the task registry (a row per task, what --task auto asks, the choices a refusal lists) and
// --heads' parsing.
#include "tiler/tasks/registry.hpp"

#include <gtest/gtest.h>

#include "tiler/core/error.hpp"
#include "tiler/tasks/heads.hpp"

namespace tiler {
namespace {

// A task is its row: --task's word finds it, "auto" is none, and it names the --save kinds it writes.
TEST(Tasks, EveryTaskHasOneRowWithItsOutputKinds) {
  std::vector<std::string> seen;
  for (const Task* task : allTasks()) {
    seen.push_back(task->name());
    EXPECT_EQ(findTask(task->name()), task);
    EXPECT_STREQ(taskName(task), task->name());
    EXPECT_FALSE(task->outputKinds().empty()) << task->name();
    EXPECT_FALSE(task->defaultKinds().empty()) << task->name();
    for (const std::string& kind : task->outputKinds()) EXPECT_NE(findOutputKind(kind), nullptr) << kind;
    for (const std::string& kind : task->defaultKinds()) EXPECT_TRUE(task->writes(kind)) << kind;
  }
  EXPECT_EQ(seen,
            (std::vector<std::string>{"segment", "classify", "embed", "detect", "instances", "regress"}));
  EXPECT_EQ(findTask("auto"), nullptr);
  EXPECT_STREQ(taskName(nullptr), "auto");
  EXPECT_EQ(taskWordsText(), "auto | segment | classify | embed | detect | instances | regress");
  for (const char* bad : {"instance", "", "Segment"}) {
    try {
      findTask(bad);
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.message(),
                std::string("--task must be auto, segment, classify, embed, detect, instances or regress; "
                            "got '") +
                    bad + "'");
    }
  }
  // What a window sends its owner: records for the object tasks alone.
  for (const Task* task : allTasks())
    EXPECT_EQ(task->recordMaker(TaskOutputs{}) != nullptr,
              task == findTask("detect") || task == findTask("instances"))
        << task->name();
  EXPECT_EQ(findTask("instances")->predictionType(), torch::kFloat64);
  EXPECT_TRUE(findTask("segment")->stitches());
  EXPECT_TRUE(findTask("detect")->givesBoxes());
  EXPECT_FALSE(findTask("instances")->givesBoxes());
}

// Which task writes a --save kind, and its defaults, are the tasks' own.
TEST(Tasks, EachTaskNamesItsOutputKindsAndDefaults) {
  EXPECT_EQ(findTask("detect")->defaultKinds(), std::vector<std::string>{"objects"});
  EXPECT_EQ(findTask("instances")->defaultKinds(), std::vector<std::string>{"objects"});
  EXPECT_EQ(findTask("segment")->defaultKinds(), std::vector<std::string>{"labels"});
  EXPECT_EQ(findTask("embed")->defaultKinds(), std::vector<std::string>{"features"});
  EXPECT_EQ(findTask("classify")->defaultKinds(), (std::vector<std::string>{"csv", "tiles"}));
  EXPECT_EQ(taskOfOutputKind("coco"), findTask("detect"));
  // objects and objects_csv are both object tasks' outputs: detect unless --task instances says so.
  EXPECT_EQ(taskOfOutputKind("objects"), findTask("detect"));
  EXPECT_TRUE(findTask("instances")->writes("objects_csv"));
  EXPECT_FALSE(findTask("instances")->writes("coco"));
  EXPECT_EQ(taskOfOutputKind("instances"), findTask("instances"));
  EXPECT_EQ(taskOfOutputKind("heatmap"), findTask("classify"));
  EXPECT_EQ(taskOfOutputKind("probs"), findTask("segment"));
  EXPECT_EQ(taskOfOutputKind("zarr"), findTask("segment"));
  EXPECT_EQ(taskOfOutputKind("features"), findTask("embed"));
  EXPECT_EQ(taskOfOutputKind("feature"), nullptr);
  // A head's kind is its kind's.
  EXPECT_TRUE(findTask("segment")->writes("np/probs"));
  EXPECT_FALSE(findTask("segment")->writes("np/nothing"));
  // Every row of the output table is some task's.
  for (const OutputKind& kind : outputKinds()) EXPECT_NE(taskOfOutputKind(kind.name), nullptr) << kind.name;
}

// --save's help and refusals are made from the tasks' rows: a new task or kind shows in both.
TEST(Tasks, SaveHelpAndRefusalsListEveryTasksKinds) {
  EXPECT_EQ(saveKindsText(),
            "labels, probs, polygons and zarr (segment), probs and zarr (regress), features and features_pt "
            "(embed), csv, tiles and heatmap (classify), objects, objects_csv and coco (detect), or objects, "
            "objects_csv and instances (instances)");
  EXPECT_EQ(saveHelpText(),
            "comma-separated: labels, probs, polygons, zarr (segment; default labels), probs, zarr (regress; "
            "default probs), features, features_pt (embed; default features), csv, tiles, heatmap (classify; "
            "default csv,tiles), objects, objects_csv, "
            "coco (detect; default objects), objects, objects_csv, instances (instances; default objects)");
}

TEST(Tasks, AutoAsksTheRowsInOrderAndRefusalsListEveryTasksShape) {
  const Activation none = Activation::kNone;
  const Task* automatic = nullptr;
  EXPECT_EQ(&resolveTask(automatic, {1, 2, 8, 8}, none, false, "m"), findTask("segment"));
  EXPECT_EQ(&resolveTask(automatic, {1, 5}, Activation::kSoftmax, false, "m"), findTask("classify"));
  EXPECT_EQ(&resolveTask(automatic, {1, 5}, none, false, "m"), findTask("embed"));
  // Boxes and instance maps are never guessed from a shape.
  EXPECT_THROW(resolveTask(automatic, {1, 5, 6}, none, false, "m"), ModelError);
  EXPECT_FALSE(findTask("detect")->claimedByShape());
  EXPECT_EQ(taskChoicesText(),
            "tiler takes NCHW maps (--task segment), one vector per window, [batch, D] (--task classify | "
            "embed), boxes, [batch, N, 6] (--task detect), instance maps, [batch, 1 + K, h, w] (--task "
            "instances) or regression maps, NCHW (--task regress)");
  try {
    resolveTask(findTask("embed"), {1, 2, 8, 8}, none, false, "m.pt");
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(
        e.message().find("'m.pt': --task embed needs one vector per window, but the output [1, 2, 8, 8] "
                         "is a map; tiler takes NCHW maps"),
        std::string::npos)
        << e.message();
  }
}

// regress: a map stitched as segment's, written as its values (probs, zarr); never what auto picks, and
// refused in one line for what would misread its values (u8, an activation, classes, labels).
TEST(Tasks, RegressWritesValuesAndRefusesWhatWouldMisreadThem) {
  const Task* regress = findTask("regress");
  ASSERT_NE(regress, nullptr);
  EXPECT_EQ(regress->defaultKinds(), std::vector<std::string>{"probs"});
  EXPECT_TRUE(regress->writes("zarr"));
  EXPECT_FALSE(regress->writes("labels"));
  EXPECT_FALSE(regress->writes("polygons"));
  EXPECT_TRUE(regress->stitches());
  EXPECT_FALSE(regress->perWindow());
  EXPECT_EQ(taskOfOutputKind("probs"), findTask("segment")) << "--save probs alone says segment";
  for (bool activated : {false, true})
    EXPECT_EQ(
        &resolveTask(nullptr, {1, 2, 8, 8}, activated ? Activation::kSigmoid : Activation::kNone, false, "m"),
        findTask("segment"));
  EXPECT_EQ(&resolveTask(regress, {1, 2, 8, 8}, Activation::kNone, false, "m"), regress);
  EXPECT_THROW(resolveTask(regress, {1, 2}, Activation::kNone, false, "m"), ModelError);
  ModelProbe probe;
  probe.task = regress;
  probe.output_channels = 2;
  TaskFlags flags;
  flags.model = "hv.pt";
  flags.kinds = {"probs", "zarr"};
  GridSpec spec;
  regress->settle(probe, flags, spec);  // f32, no activation: taken
  flags.probs_type = SampleType::kF16;
  regress->settle(probe, flags, spec);
  const auto refusal = [&](TaskFlags bad) {
    try {
      regress->settle(probe, bad, spec);
    } catch (const ConfigError& e) {
      return e.message();
    }
    return std::string("no error");
  };
  TaskFlags u8 = flags;
  u8.probs_type = SampleType::kU8;
  EXPECT_EQ(
      refusal(u8),
      "--probs_dtype u8 stores values in [0, 1] as round(v x 255), but --task regress's values are not in "
      "[0, 1]: save f32 or f16");
  TaskFlags sigmoid = flags;
  sigmoid.activation = Activation::kSigmoid;
  sigmoid.activation_name = "sigmoid";
  EXPECT_EQ(
      refusal(sigmoid),
      "--activation sigmoid is for class scores; --task regress takes a regression map as the model gave it");
  TaskFlags labels = flags;
  labels.kinds = {"labels"};
  EXPECT_NE(refusal(labels).find("(--task regress)"), std::string::npos) << refusal(labels);
  TaskFlags classes = flags;
  classes.classes = parseClasses("h,v");
  EXPECT_NE(refusal(classes).find("--task regress's maps are values"), std::string::npos);
}

TEST(Tasks, HeadsAndTheirOwnFlagsAreParsed) {
  const auto heads = parseHeads("np:segment,hv,0:embed", {"hv.activation=none", "np.classes=bg,nucleus",
                                                          "np.save=labels,probs", "np.probs_dtype=u8"});
  ASSERT_EQ(heads.size(), 3u);
  EXPECT_EQ(heads[0].name, "np");
  EXPECT_EQ(heads[0].task, findTask("segment"));
  EXPECT_EQ(heads[0].classes, "bg,nucleus");
  EXPECT_EQ(heads[0].save, "labels,probs");
  EXPECT_EQ(heads[0].probs_dtype, "u8");
  EXPECT_FALSE(heads[1].task.has_value()) << "--task's";
  EXPECT_EQ(heads[1].activation, "none");
  EXPECT_EQ(heads[2].name, "0");
  EXPECT_EQ(heads[2].task, findTask("embed"));
  EXPECT_TRUE(parseHeads("", {}).empty());
  const std::pair<std::string, std::vector<std::string>> bad[] = {
      {"np,", {}},
      {"np,np", {}},
      {":segment", {}},
      {"np:boxes", {}},
      {"a/b", {}},
      {"", {"np.activation=none"}},
      {"np", {"hv.activation=none"}},
      {"np", {"np.colour=red"}},
      {"np", {"np.activation"}},
      {"np", {"np.save=labels", "np.save=probs"}}};
  for (const auto& [names, options] : bad) EXPECT_THROW(parseHeads(names, options), ConfigError) << names;
  // The tasks a head can be are the registry's whose windows send their predictions.
  try {
    parseHeads("np:boxes", {});
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.message(),
              "--task must be auto, segment, classify, embed, detect, instances or regress; got 'boxes'");
  }
  try {
    parseHeads("np,", {});
  } catch (const ConfigError& e) {
    EXPECT_EQ(
        e.message(),
        "--heads takes NAME[:TASK],... (NAME: a dict key or a tuple index; TASK: segment, classify, embed "
        "or regress); got 'np,'");
  }
  try {
    parseHeads("np", {"np.colour=red"});
  } catch (const ConfigError& e) {
    EXPECT_NE(
        e.message().find("no setting 'colour' (a head takes activation, classes, save and probs_dtype)"),
        std::string::npos)
        << e.message();
  }
}

}  // namespace
}  // namespace tiler
