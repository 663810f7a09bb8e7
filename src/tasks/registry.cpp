#include "tiler/tasks/registry.hpp"

#include <algorithm>

#include "tiler/core/error.hpp"

namespace tiler {

// Each task's row, defined in its own file (tasks/<name>.cpp, no header: only its row names it).
const Task& segmentTask();
const Task& classifyTask();
const Task& embedTask();
const Task& detectTask();
const Task& instancesTask();
const Task& regressTask();

const std::vector<const Task*>& allTasks() {
  // A new task: its file in tasks/ and its row here. The order is --task auto's: the first that claims a
  // model's output shape takes it.
  static const std::vector<const Task*> tasks = {&segmentTask(), &classifyTask(),  &embedTask(),
                                                 &detectTask(),  &instancesTask(), &regressTask()};
  return tasks;
}

const std::vector<TaskFlag>& taskFlagDeclarations() {
  static const std::vector<TaskFlag> flags = [] {
    std::vector<TaskFlag> all;
    for (const Task* t : allTasks())
      for (const TaskFlag& flag : t->flags())
        if (std::none_of(all.begin(), all.end(),
                         [&flag](const TaskFlag& f) { return std::string(f.name) == flag.name; }))
          all.push_back(flag);
    return all;
  }();
  return flags;
}

TaskSettingsList parseTaskSettings(const FlagValues& values, const TaskFlags& job) {
  TaskSettingsList settings;
  for (const Task* t : allTasks()) settings.emplace_back(t, t->parseSettings(values, job));
  return settings;
}

std::vector<std::string> givenMapFlags(const FlagValues& values) {
  std::vector<std::string> given;
  for (const TaskFlag& flag : taskFlagDeclarations()) {
    const auto value = values.find(flag.name);
    if (flag.map && value != values.end() && value->second != flag.default_value)
      given.push_back(std::string("--") + flag.name);
  }
  return given;
}

const Task* findTask(const std::string& name) {
  if (name == "auto") return nullptr;
  std::string words = "auto";
  for (const Task* t : allTasks()) {
    if (name == t->name()) return t;
    words += std::string(t == allTasks().back() ? " or " : ", ") + t->name();
  }
  TILER_THROW(ConfigError, "--task must be " << words << "; got '" << name << "'");
}

const char* taskName(const Task* task) {
  return task != nullptr ? task->name() : "auto";
}

std::string taskWordsText() {
  std::string text = "auto";
  for (const Task* t : allTasks()) text += std::string(" | ") + t->name();
  return text;
}

const Task* taskOfOutputKind(const std::string& kind) {
  for (const Task* t : allTasks())
    if (t->writes(kind)) return t;
  return nullptr;
}

const Task& resolveTask(const Task* requested, const std::vector<int64_t>& sizes, Activation activation,
                        bool classes_named, const std::string& path) {
  if (requested != nullptr) {
    const std::string refused = requested->refuses(sizes);
    TILER_CHECK(refused.empty(), ModelError, "'" << path << "': " << refused << "; " << taskChoicesText());
    return *requested;
  }
  for (const Task* t : allTasks())
    if (t->claims(sizes, activation != Activation::kNone, classes_named)) return *t;
  TILER_THROW(ModelError, "'" << path << "': " << dimensionsRefusal(sizes) << "; " << taskChoicesText());
}

void settleTask(const Task& task, const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec) {
  for (const std::string& kind : flags.kinds)
    TILER_CHECK(task.writes(kind), ConfigError,
                "--save " << flags.save.value_or(kind) << " is an output of --task "
                          << taskName(taskOfOutputKind(kind)) << ", but '" << flags.model << "' gives "
                          << (task.perWindow() ? "one vector of " + std::to_string(probe.output_channels) +
                                                     " values per window"
                                               : std::string("NCHW maps"))
                          << " (--task " << task.name() << ")");
  task.settle(probe, flags, spec);
}

std::string taskChoicesText() {
  // Tasks that take the same shape share its words ("(--task classify | embed)").
  std::vector<std::string> words;
  for (const Task* t : allTasks())
    if (words.empty() || words.back() != t->shapeWords()) words.push_back(t->shapeWords());
  std::string text = "tiler takes ";
  for (size_t i = 0; i < words.size(); ++i)
    text += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return text;
}

namespace {

// A head's consumer: its task's, over a view of the image whose outputs are the head's kinds under their
// plain names; what the view counts (non-finite values, objects) is added to the image when it finalizes.
class HeadConsumer : public ImageConsumer {
 public:
  HeadConsumer(CatalogImage& image, const Task& task, const TaskOutputs& outputs, const WriterOptions& writer)
      : image_(image),
        view_(headView(image, outputs.flags.head)),
        inner_(task.makeConsumer(view_, outputs, writer)) {}
  void aggregate(const std::vector<WindowResult>& windows) override { inner_->aggregate(windows); }
  bool done() const override { return inner_->done(); }
  bool injectTileFault() override { return inner_->injectTileFault(); }
  std::vector<std::string> finalize() override {
    std::vector<std::string> paths = inner_->finalize();
    image_.non_finite_values += view_.non_finite_values;
    if (view_.objects >= 0) image_.objects = std::max<int64_t>(image_.objects, 0) + view_.objects;
    image_.objects_at_window_edge += view_.objects_at_window_edge;
    return paths;
  }

 private:
  static CatalogImage headView(const CatalogImage& image, const std::string& head) {
    CatalogImage view = image;
    view.outputs.clear();
    for (const auto& [kind, path] : image.outputs)
      if (kind.rfind(head + "/", 0) == 0) view.outputs[kind.substr(head.size() + 1)] = path;
    view.non_finite_values = view.objects_at_window_edge = 0;
    view.objects = -1;
    return view;
  }

  CatalogImage& image_;  // the catalog's, which outlives the stage
  CatalogImage view_;
  std::unique_ptr<ImageConsumer> inner_;
};

}  // namespace

namespace {

// "a, b and c" (`last_separator` " and "), or with ", " throughout: "a, b, c".
std::string listed(const std::vector<std::string>& names, const char* last_separator) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += names[i] + (i + 2 < names.size() ? ", " : i + 1 < names.size() ? last_separator : "");
  return text;
}

// The tasks as --save's texts list them: in the formats' order of their first kinds (the registry's
// order among tasks whose first kinds are the same).
std::vector<const Task*> tasksByOutputs() {
  const auto first = [](const Task* t) {
    return findOutputFormat(t->outputKinds().front()) - outputFormats().data();
  };
  std::vector<const Task*> tasks = allTasks();
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&first](const Task* a, const Task* b) { return first(a) < first(b); });
  return tasks;
}

}  // namespace

std::string saveKindsText() {
  const std::vector<const Task*> tasks = tasksByOutputs();
  std::string text;
  for (size_t t = 0; t < tasks.size(); ++t) {
    text += listed(tasks[t]->outputKinds(), " and ") + " (" + tasks[t]->name() + ")";
    text += t + 2 < tasks.size() ? ", " : t + 1 < tasks.size() ? ", or " : "";
  }
  return text;
}

std::string saveHelpText() {
  const std::vector<const Task*> tasks = tasksByOutputs();
  std::string text = "comma-separated: ";
  for (size_t t = 0; t < tasks.size(); ++t) {
    text += listed(tasks[t]->outputKinds(), ", ") + " (" + tasks[t]->name() + "; default " +
            listed(tasks[t]->defaultKinds(), ",") + ")";
    if (t + 1 < tasks.size()) text += ", ";
  }
  return text;
}

std::string outputsTableMarkdown() {
  std::string text =
      "| `--save` | written as | by `--task` | takes | needs | what it is |\n"
      "|---|---|---|---|---|---|\n";
  for (const OutputFormat& format : outputFormats()) {
    const std::string kind = format.naming.name;
    std::vector<std::string> writers;
    for (const Task* t : allTasks()) {
      if (!t->writes(kind)) continue;
      const std::vector<std::string> by_default = t->defaultKinds();
      const bool is_default = std::find(by_default.begin(), by_default.end(), kind) != by_default.end();
      writers.push_back(std::string(t->name()) + (is_default ? " (default)" : ""));
    }
    std::string pattern = format.naming.pattern;
    if (format.naming.directory) pattern += "/";
    text += "| `" + kind + "` | `" + pattern + "` | " + listed(writers, ", ") + " | " +
            consumesWords(format.consumes) + " | " + (*format.feature ? format.feature : "") + " | " +
            format.summary +
            (*format.after ? std::string("; made after `") + format.after + "`, whose file it reads" : "") +
            (*format.limits ? std::string("; ") + format.limits : "") + " |\n";
  }
  return text;
}

ConsumerFactory consumersFor(const Task& task, TaskOutputs outputs) {
  const Task* t = &task;
  // The stage holds the factory, and the consumers it makes hold its options: they live as long as it.
  auto held = std::make_shared<const TaskOutputs>(std::move(outputs));
  return [t, held](CatalogImage& image, const WriterOptions& writer) -> std::unique_ptr<ImageConsumer> {
    if (!held->flags.head.empty()) return std::make_unique<HeadConsumer>(image, *t, *held, writer);
    return t->makeConsumer(image, *held, writer);
  };
}

}  // namespace tiler
