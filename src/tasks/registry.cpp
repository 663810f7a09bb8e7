#include "tiler/tasks/registry.hpp"

#include "tiler/error.hpp"
#include "tiler/tasks/classify.hpp"
#include "tiler/tasks/detect.hpp"
#include "tiler/tasks/embed.hpp"
#include "tiler/tasks/instances.hpp"
#include "tiler/tasks/segment.hpp"

namespace tiler {

const std::vector<const Task*>& allTasks() {
  // A new task: its file in tasks/ and its row here.
  static const std::vector<const Task*> tasks = {&segmentTask(), &classifyTask(), &embedTask(), &detectTask(),
                                                 &instancesTask()};
  return tasks;
}

const Task& taskOf(ModelTask task) {
  for (const Task* t : allTasks())
    if (t->id() == task) return *t;
  TILER_THROW(ConfigError, "no task '" << taskName(task) << "' (--task " << taskName(ModelTask::kAuto)
                                       << " is settled by the model's output)");
}

ModelTask resolveTask(ModelTask requested, const std::vector<int64_t>& sizes, Activation activation,
                      bool classes_named, const std::string& path) {
  if (requested != ModelTask::kAuto) {
    const std::string refused = taskOf(requested).refuses(sizes);
    TILER_CHECK(refused.empty(), ModelError, "'" << path << "': " << refused);
    return requested;
  }
  for (const Task* t : allTasks())
    if (t->claims(sizes, activation != Activation::kNone, classes_named)) return t->id();
  TILER_THROW(ModelError, "'" << path << "': " << dimensionsRefusal(sizes));
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

ConsumerFactory consumersFor(ModelTask task, TaskOutputs outputs) {
  const Task* t = &taskOf(task);
  // The stage holds the factory, and the consumers it makes hold its options: they live as long as it.
  auto held = std::make_shared<const TaskOutputs>(std::move(outputs));
  return [t, held](CatalogImage& image, const WriterOptions& writer) {
    return t->makeConsumer(image, *held, writer);
  };
}

}  // namespace tiler
