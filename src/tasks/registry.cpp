#include "tiler/tasks/registry.hpp"

#include <algorithm>

#include "tiler/core/error.hpp"
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

ConsumerFactory consumersFor(ModelTask task, TaskOutputs outputs) {
  const Task* t = &taskOf(task);
  // The stage holds the factory, and the consumers it makes hold its options: they live as long as it.
  auto held = std::make_shared<const TaskOutputs>(std::move(outputs));
  return [t, held](CatalogImage& image, const WriterOptions& writer) -> std::unique_ptr<ImageConsumer> {
    if (!held->flags.head.empty()) return std::make_unique<HeadConsumer>(image, *t, *held, writer);
    return t->makeConsumer(image, *held, writer);
  };
}

}  // namespace tiler
