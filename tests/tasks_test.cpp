// tasks_test: the task registry (a row per task, what --task auto asks, the choices a refusal lists) and
// --heads' parsing.
#include "tiler/tasks/registry.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/tasks/heads.hpp"

namespace tiler {
namespace {

// Whether `word` stands in `text` as a word of its own (not inside another).
bool hasWord(const std::string& text, const std::string& word) {
  const auto letter = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
    if ((at == 0 || !letter(text[at - 1])) &&
        (at + word.size() == text.size() || !letter(text[at + word.size()])))
      return true;
  return false;
}

// A task is its row: --task's word finds it, "auto" is none, and it names the --save kinds it writes.
TEST(Tasks, EveryTaskHasOneRowWithItsOutputKinds) {
  std::vector<std::string> seen;
  for (const Task* task : allTasks()) {
    seen.push_back(task->name());
    EXPECT_EQ(findTask(task->name()), task);
    EXPECT_STREQ(taskName(task), task->name());
    EXPECT_FALSE(task->outputKinds().empty()) << task->name();
    EXPECT_FALSE(task->defaultKinds().empty()) << task->name();
    for (const std::string& kind : task->outputKinds()) EXPECT_NE(findOutputFormat(kind), nullptr) << kind;
    for (const std::string& kind : task->defaultKinds()) EXPECT_TRUE(task->writes(kind)) << kind;
  }
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), seen.size()) << "a name once";
  EXPECT_EQ(findTask("auto"), nullptr);
  EXPECT_STREQ(taskName(nullptr), "auto");
  EXPECT_EQ(taskWordsText().rfind("auto | ", 0), 0u);
  for (const std::string& name : seen) EXPECT_TRUE(hasWord(taskWordsText(), name)) << name;
  for (const char* bad : {"instance", "", "Segment"}) {
    try {
      findTask(bad);
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.message().rfind("--task must be auto", 0), 0u) << e.message();
      EXPECT_NE(e.message().find(std::string("got '") + bad + "'"), std::string::npos) << e.message();
      for (const std::string& name : seen) EXPECT_TRUE(hasWord(e.message(), name)) << e.message();
    }
  }
  // What a window sends its owner: records for the object tasks alone.
  for (const Task* task : allTasks())
    EXPECT_EQ(task->sendsRecords(), task == findTask("detect") || task == findTask("instances"))
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
  // Every format is some task's: what it consumes, some task produces.
  for (const OutputFormat& format : outputFormats())
    EXPECT_NE(taskOfOutputKind(format.naming.name), nullptr) << format.naming.name;
}

// --save's help and refusals are made from the tasks' rows: a new task or kind shows in both, each kind
// beside its task, and the help names each task's defaults.
TEST(Tasks, SaveHelpAndRefusalsListEveryTasksKinds) {
  for (const Task* task : allTasks()) {
    const std::string name = std::string("(") + task->name();
    const size_t in_kinds = saveKindsText().find(name + ")"), in_help = saveHelpText().find(name + ";");
    ASSERT_NE(in_kinds, std::string::npos) << task->name();
    ASSERT_NE(in_help, std::string::npos) << task->name();
    for (const std::string& kind : task->outputKinds()) {
      EXPECT_LT(saveKindsText().rfind(kind, in_kinds), in_kinds) << kind;
      EXPECT_LT(saveHelpText().rfind(kind, in_help), in_help) << kind;
    }
    std::string defaults;
    for (const std::string& kind : task->defaultKinds()) defaults += (defaults.empty() ? "" : ",") + kind;
    EXPECT_NE(saveHelpText().find(name + "; default " + defaults + ")"), std::string::npos) << task->name();
  }
}

// docs/cli.md's table of outputs is the formats' rows as tasks write them (refresh it:
// TILER_WRITE_DOCS=1 tasks_test --gtest_filter=Tasks.TheDocsOutputTable*).
TEST(Tasks, TheDocsOutputTableIsTheFormatsRows) {
  const std::string path = std::string(TILER_TEST_SOURCE_DIR) + "/docs/cli.md";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string doc = text.str();
  const std::string begin = "<!-- outputs table: made by outputsTableMarkdown() -->\n", end = "<!-- end -->";
  const size_t from = doc.find(begin), to = doc.find(end, from);
  ASSERT_NE(from, std::string::npos) << path;
  ASSERT_NE(to, std::string::npos) << path;
  const std::string table = outputsTableMarkdown();
  if (std::getenv("TILER_WRITE_DOCS") != nullptr) {
    doc.replace(from + begin.size(), to - from - begin.size(), table);
    std::ofstream(path) << doc;
    return;
  }
  EXPECT_EQ(doc.substr(from + begin.size(), to - from - begin.size()), table);
  for (const OutputFormat& format : outputFormats())
    EXPECT_NE(table.find(std::string("`") + format.naming.name + "`"), std::string::npos)
        << format.naming.name;
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
  EXPECT_EQ(taskChoicesText().rfind("tiler takes ", 0), 0u);
  for (const Task* task : allTasks())
    EXPECT_NE(taskChoicesText().find(task->shapeWords()), std::string::npos) << task->name();
  try {
    resolveTask(findTask("embed"), {1, 2, 8, 8}, none, false, "m.pt");
    FAIL();
  } catch (const ModelError& e) {
    for (const char* part : {"'m.pt'", "--task embed", "[1, 2, 8, 8]", "; tiler takes "})
      EXPECT_NE(e.message().find(part), std::string::npos) << e.message();
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
  flags.settings = parseTaskSettings({}, flags);
  GridSpec spec;
  regress->settle(probe, flags, spec);  // f32, no activation: taken
  flags.settings = parseTaskSettings({{"probs_dtype", "f16"}}, flags);
  regress->settle(probe, flags, spec);
  const auto refusal = [&](TaskFlags bad) {
    try {
      settleTask(*regress, probe, bad, spec);
    } catch (const ConfigError& e) {
      return e.message();
    }
    return std::string("no error");
  };
  TaskFlags u8 = flags;
  u8.settings = parseTaskSettings({{"probs_dtype", "u8"}}, u8);
  EXPECT_NE(refusal(u8).find("--probs_dtype u8"), std::string::npos) << refusal(u8);
  EXPECT_NE(refusal(u8).find("f32 or f16"), std::string::npos) << refusal(u8);
  TaskFlags sigmoid = flags;
  sigmoid.activation = Activation::kSigmoid;
  sigmoid.activation_name = "sigmoid";
  EXPECT_NE(refusal(sigmoid).find("--activation sigmoid"), std::string::npos) << refusal(sigmoid);
  TaskFlags labels = flags;
  labels.kinds = {"labels"};
  EXPECT_NE(refusal(labels).find("(--task regress)"), std::string::npos) << refusal(labels);
  TaskFlags classes = flags;
  classes.classes = parseClasses("h,v");
  EXPECT_NE(refusal(classes).find("--task regress's maps are values"), std::string::npos);
}

// A task declares the flags it owns and parses them into its settings; the command line's flags and
// --head_opt's keys come from the declarations.
TEST(Tasks, EachTaskOwnsItsFlags) {
  std::set<std::string> names;
  for (const TaskFlag& flag : taskFlagDeclarations()) {
    EXPECT_TRUE(names.insert(flag.name).second) << flag.name << " declared once";
    EXPECT_FALSE(std::string(flag.help).empty()) << flag.name;
    EXPECT_EQ(hasWord(headSettingWords(), flag.name), flag.head) << flag.name;
  }
  for (const char* name : {"blend", "sigma_scale", "simplify", "probs_dtype", "nms", "encoder_name"})
    EXPECT_EQ(names.count(name), 1u) << name;
  for (const char* key : {"activation", "classes", "save"}) EXPECT_TRUE(hasWord(headSettingWords(), key));
  // Defaults parse; each task's settings are its own.
  TaskFlags job;
  job.activation = Activation::kSigmoid;
  job.settings = parseTaskSettings({}, job);
  EXPECT_EQ(job.settings.size(), allTasks().size());
  const auto& segment = settingsOf<SegmentSettings>(*findTask("segment"), job);
  EXPECT_EQ(segment.stitch.mode, BlendMode::kGaussian);
  EXPECT_EQ(segment.map.probs_type, SampleType::kF32);
  EXPECT_EQ(segment.label_threshold, 0.5f) << "sigmoid probabilities";
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"probs_dtype", "f64"}, {"blend", "soft"}, {"nms", "0.5x"}, {"sigma_scale", "0"}}) {
    try {
      parseTaskSettings({{flag, value}}, job);
      FAIL() << flag << "=" << value;
    } catch (const ConfigError& e) {
      EXPECT_NE(e.message().find("--" + flag), std::string::npos) << e.message();
    }
  }
  EXPECT_EQ(givenMapFlags({{"blend", "crop"}, {"probs_dtype", "f32"}, {"nms", "0.5"}}),
            std::vector<std::string>{"--blend"});
  // A flag the other tasks refuse, given: --nms is detect's alone.
  ModelProbe probe;
  probe.output_channels = 2;
  TaskFlags nms = job;
  nms.model = "seg.pt";
  nms.activation = Activation::kNone;
  nms.settings = parseTaskSettings({{"nms", "0.5"}}, nms);
  GridSpec spec;
  try {
    findTask("segment")->settle(probe, nms, spec);
    FAIL() << "--nms taken by segment";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("--nms"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("detect"), std::string::npos) << e.message();
  }
  nms.settings = parseTaskSettings({{"nms", "0"}}, nms);
  findTask("segment")->settle(probe, nms, spec);
}

TEST(Tasks, HeadsAndTheirOwnFlagsAreParsed) {
  const auto heads = parseHeads("np:segment,hv,0:embed", {"hv.activation=none", "np.classes=bg,nucleus",
                                                          "np.save=labels,probs", "np.probs_dtype=u8"});
  ASSERT_EQ(heads.size(), 3u);
  EXPECT_EQ(heads[0].name, "np");
  EXPECT_EQ(heads[0].task, findTask("segment"));
  EXPECT_EQ(heads[0].setting("classes"), "bg,nucleus");
  EXPECT_EQ(heads[0].setting("save"), "labels,probs");
  EXPECT_EQ(heads[0].setting("probs_dtype"), "u8");
  EXPECT_FALSE(heads[0].setting("activation")) << "--activation's";
  EXPECT_FALSE(heads[1].task.has_value()) << "--task's";
  EXPECT_EQ(heads[1].setting("activation"), "none");
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
  // The tasks a head can be are the registry's whose windows send their predictions; --head_opt's keys are
  // the settings a head has.
  for (const Task* task : allTasks())
    EXPECT_EQ(hasWord(headTaskWords(), task->name()), !task->sendsRecords()) << task->name();
  try {
    parseHeads("np:boxes", {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.message().rfind("--task must be", 0), 0u) << e.message();
    EXPECT_NE(e.message().find("'boxes'"), std::string::npos) << e.message();
  }
  try {
    parseHeads("np,", {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find(headTaskWords()), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("'np,'"), std::string::npos) << e.message();
  }
  try {
    parseHeads("np", {"np.colour=red"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("no setting 'colour'"), std::string::npos) << e.message();
    for (const char* key : {"activation", "classes", "save", "probs_dtype"})
      EXPECT_TRUE(hasWord(e.message(), key)) << e.message();
  }
  const auto heads_set =
      parseHeads("np", {"np.activation=softmax", "np.classes=a,b", "np.save=probs", "np.probs_dtype=u8"});
  EXPECT_EQ(heads_set[0].setting("activation"), "softmax");
  EXPECT_EQ(heads_set[0].setting("probs_dtype"), "u8");
}

}  // namespace
}  // namespace tiler
