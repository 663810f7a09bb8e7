// tasks_test: the task registry (a row per task, what --task auto asks, the choices a refusal lists) and
// --heads' parsing.
#include "tiler/tasks/registry.hpp"

#include <gtest/gtest.h>

#include "tiler/core/error.hpp"
#include "tiler/tasks/heads.hpp"

namespace tiler {
namespace {

TEST(Tasks, EveryTaskHasOneRowWithItsOutputKinds) {
  std::vector<ModelTask> seen;
  for (const Task* task : allTasks()) {
    seen.push_back(task->id());
    EXPECT_EQ(&taskOf(task->id()), task);
    EXPECT_EQ(parseTask(task->name()), task->id());
    EXPECT_FALSE(task->outputKinds().empty()) << task->name();
    for (const std::string& kind : task->defaultKinds()) EXPECT_TRUE(taskWrites(task->id(), kind)) << kind;
  }
  EXPECT_EQ(seen, (std::vector<ModelTask>{ModelTask::kSegment, ModelTask::kClassify, ModelTask::kEmbed,
                                          ModelTask::kDetect, ModelTask::kInstances}));
  EXPECT_THROW(taskOf(ModelTask::kAuto), ConfigError);
  // What a window sends its owner: records for the object tasks alone.
  for (const Task* task : allTasks())
    EXPECT_EQ(task->recordMaker(TaskOutputs{}) != nullptr,
              task->id() == ModelTask::kDetect || task->id() == ModelTask::kInstances)
        << task->name();
  EXPECT_EQ(taskOf(ModelTask::kInstances).predictionType(), torch::kFloat64);
  EXPECT_TRUE(taskOf(ModelTask::kSegment).stitches());
}

TEST(Tasks, AutoAsksTheRowsInOrderAndRefusalsListEveryTasksShape) {
  const Activation none = Activation::kNone;
  EXPECT_EQ(resolveTask(ModelTask::kAuto, {1, 2, 8, 8}, none, false, "m"), ModelTask::kSegment);
  EXPECT_EQ(resolveTask(ModelTask::kAuto, {1, 5}, Activation::kSoftmax, false, "m"), ModelTask::kClassify);
  EXPECT_EQ(resolveTask(ModelTask::kAuto, {1, 5}, none, false, "m"), ModelTask::kEmbed);
  // Boxes and instance maps are never guessed from a shape.
  EXPECT_THROW(resolveTask(ModelTask::kAuto, {1, 5, 6}, none, false, "m"), ModelError);
  EXPECT_FALSE(taskOf(ModelTask::kDetect).claimedByShape());
  EXPECT_EQ(taskChoicesText(),
            "tiler takes NCHW maps (--task segment), one vector per window, [batch, D] (--task classify | "
            "embed), boxes, [batch, N, 6] (--task detect) or instance maps, [batch, 1 + K, h, w] (--task "
            "instances)");
  try {
    resolveTask(ModelTask::kEmbed, {1, 2, 8, 8}, none, false, "m.pt");
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(
        e.message().find("'m.pt': --task embed needs one vector per window, but the output [1, 2, 8, 8] "
                         "is a map; tiler takes NCHW maps"),
        std::string::npos)
        << e.message();
  }
}

TEST(Tasks, HeadsAndTheirOwnFlagsAreParsed) {
  const auto heads = parseHeads("np:segment,hv,0:embed", {"hv.activation=none", "np.classes=bg,nucleus",
                                                          "np.save=labels,probs", "np.probs_dtype=u8"});
  ASSERT_EQ(heads.size(), 3u);
  EXPECT_EQ(heads[0].name, "np");
  EXPECT_EQ(heads[0].task, ModelTask::kSegment);
  EXPECT_EQ(heads[0].classes, "bg,nucleus");
  EXPECT_EQ(heads[0].save, "labels,probs");
  EXPECT_EQ(heads[0].probs_dtype, "u8");
  EXPECT_FALSE(heads[1].task.has_value()) << "--task's";
  EXPECT_EQ(heads[1].activation, "none");
  EXPECT_EQ(heads[2].name, "0");
  EXPECT_EQ(heads[2].task, ModelTask::kEmbed);
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
