// tasks/embed: the task embed: one feature vector a window, an encoder's (window_outputs: features,
// features_pt).
#include "tiler/tasks/task.hpp"

#include "tiler/core/error.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {
namespace {

class EmbedTask : public VectorTask {
 public:
  const char* name() const override { return "embed"; }
  std::vector<Consumes> produces() const override { return {Consumes::kWindowVectors}; }
  std::vector<std::string> defaultKinds() const override { return {"features"}; }
  // Any other vector: features (classify claims class scores first).
  bool claims(const std::vector<int64_t>& sizes, bool, bool) const override { return sizes.size() == 2; }

 protected:
  void checkFlags(const ModelProbe&, const TaskFlags& flags, GridSpec& spec) const override {
    TILER_CHECK(flags.classes.empty(), ConfigError,
                "--classes names classes, but '" << flags.model
                                                 << "' is an encoder (--task embed): its features have none");
    settlePatchLattice(flags, spec);
  }
};

}  // namespace

const Task& embedTask() {
  static const EmbedTask task;
  return task;
}

}  // namespace tiler
