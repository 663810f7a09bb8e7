// tasks/embed: the task embed: one feature vector a window, an encoder's (window_outputs: features,
// features_pt).
#include "tiler/tasks/task.hpp"

#include <filesystem>

#include "tiler/core/error.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace fs = std::filesystem;

namespace tiler {

const Task& embedTask();

namespace {

struct EmbedSettings : TaskSettings {
  std::string encoder;  // the encoder named in the features file; empty: the model file's stem
};

class EmbedTask : public VectorTask {
 public:
  const char* name() const override { return "embed"; }
  std::vector<Consumes> produces() const override { return {Consumes::kWindowVectors}; }
  std::vector<std::string> defaultKinds() const override { return {"features"}; }
  // Any other vector: features (classify claims class scores first).
  bool claims(const std::vector<int64_t>& sizes, bool, bool) const override { return sizes.size() == 2; }
  std::vector<TaskFlag> flags() const override {
    return {{"encoder_name", "embed: the encoder named in the features file (default: the model file's stem)",
             ""}};
  }
  std::shared_ptr<const TaskSettings> parseSettings(const FlagValues& values,
                                                    const TaskFlags&) const override {
    auto s = std::make_shared<EmbedSettings>();
    s->encoder = flagValue(values, "encoder_name");
    return s;
  }
  std::unique_ptr<ImageConsumer> makeConsumer(CatalogImage& image, const TaskOutputs& outputs,
                                              const WriterOptions&) const override {
    WindowOutputOptions options = windowOutputOptions(outputs);
    // The model that ran (a model card names its weights file).
    options.encoder = settingsOf<EmbedSettings>(embedTask(), outputs.flags).encoder;
    if (options.encoder.empty()) options.encoder = fs::path(outputs.flags.model).stem().string();
    return windowOutputsConsumer(image, options);
  }

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
