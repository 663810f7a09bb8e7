#include "tiler/tasks/task.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "tiler/core/cli.hpp"
#include "tiler/core/error.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {

void Task::settle(const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec) const {
  const std::string shape =
      perWindow() ? "one vector of " + std::to_string(probe.output_channels) + " values per window"
                  : "NCHW maps";
  // A map's pixels are OpenCV matrices on their way to the files (its CV_CN_MAX): more channels would not
  // fit the element type and wrap.
  TILER_CHECK(perWindow() || givesBoxes() || probe.output_channels <= kMaxMapChannels, ConfigError,
              "'" << flags.model << "' gives maps of " << probe.output_channels << " channels; --task "
                  << name() << " stitches at most " << kMaxMapChannels << " channels a pixel");
  // Another task's flag that the others refuse, given: it would do nothing here.
  for (const auto& [owner, settings] : flags.settings) {
    if (owner == this || !settings) continue;
    const auto [flag, what] = settings->elsewhere();
    TILER_CHECK(flag.empty(), ConfigError,
                flag << " is for --task " << owner->name() << "'s " << what << ", but '" << flags.model
                     << "' gives " << shape);
  }
  checkFlags(probe, flags, spec);
  if (flags.halo > 0) settleHalo(probe, flags, spec, shape);
}

void Task::settleHalo(const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec,
                      const std::string& shape) const {
  const int64_t halo = flags.halo;
  TILER_CHECK(
      !perWindow() || givesBoxes(), ConfigError,
      "--halo " << halo << " is a band of a map window's edge, but '" << flags.model << "' gives " << shape);
  // Neighbouring windows must share twice the halo, so that each drops its band where the other's core
  // covers it; the cores of crop, detect and instances then lie inside it as they are.
  const auto axis = [&](const char* name, int64_t window, double& overlap) {
    const int64_t out_window = probe.scale.apply(window), have = overlapPixels(window, overlap, probe.scale);
    TILER_CHECK(2 * halo < out_window, ConfigError,
                "--halo " << halo << " is not less than half the window (" << out_window << " px along "
                          << name << " at the output's resolution): no window would keep a pixel");
    if (have >= 2 * halo) return;
    const double least = overlapFor(window, 2 * halo, probe.scale);
    TILER_CHECK(!flags.overlap_given, ConfigError,
                "--overlap " << overlap << " gives windows " << have << " px of overlap along " << name
                             << " (at the output's resolution), less than twice --halo " << halo << " ("
                             << 2 * halo << " px): give --overlap " << least << " or more, or leave it out");
    spdlog::info("--halo {}: the overlap along {} raised from {} to {} ({} px, twice the halo)", halo, name,
                 overlap, least, overlapPixels(window, least, probe.scale));
    overlap = least;
  };
  axis("x", spec.window_w, spec.overlap_x);
  axis("y", spec.window_h, spec.overlap_y);
}

std::string Task::flagValue(const FlagValues& values, const std::string& name) const {
  if (const auto given = values.find(name); given != values.end()) return given->second;
  for (const TaskFlag& flag : flags())
    if (name == flag.name) return flag.default_value;
  TILER_THROW(ConfigError, "--task " << this->name() << " has no flag --" << name);
}

double numberFlag(const std::string& flag, const std::string& value) {
  double number = 0;
  TILER_CHECK(parseNumber(value, number), ConfigError, flag << " takes a number; got '" << value << "'");
  return number;
}

std::vector<std::string> Task::outputKinds() const {
  const std::vector<Consumes> products = produces();
  std::vector<std::string> kinds;
  for (const OutputFormat& format : outputFormats())
    if (std::find(products.begin(), products.end(), format.consumes) != products.end())
      kinds.push_back(format.naming.name);
  return kinds;
}

bool Task::writes(const std::string& kind) const {
  const OutputFormat* format = findOutputFormat(kind);
  if (format == nullptr) return false;
  const std::vector<Consumes> products = produces();
  return std::find(products.begin(), products.end(), format->consumes) != products.end();
}

std::vector<int64_t> Task::predictionSizes(const ModelProbe& probe, const GridSpec& spec,
                                           int64_t windows) const {
  if (perWindow()) return {windows, probe.output_channels};
  return {windows, probe.output_channels, probe.scale.apply(spec.window_h), probe.scale.apply(spec.window_w)};
}

void addNonFinite(CatalogImage& image, int64_t more) {
  image.non_finite_values += more;
  if (image.non_finite_values > 0)
    spdlog::warn(
        "'{}': {} value(s) of the predictions are not finite (the model gave NaN or Inf); those values "
        "mean nothing (a label, a class or a feature made of them neither)",
        image.input, image.non_finite_values);
}

std::string dimensionsRefusal(const std::vector<int64_t>& sizes) {
  return "output " + c10::str(torch::IntArrayRef(sizes)) + " has " + std::to_string(sizes.size()) +
         " dimension(s)";
}

bool perWindow(const ModelProbe& probe) {
  return probe.task != nullptr && probe.task->perWindow();
}

std::string VectorTask::refuses(const std::vector<int64_t>& sizes) const {
  if (sizes.size() == 2 || (sizes.size() == 4 && sizes[2] == 1 && sizes[3] == 1)) return "";
  if (sizes.size() != 4) return dimensionsRefusal(sizes);
  return std::string("--task ") + name() + " needs one vector per window, but the output " +
         c10::str(torch::IntArrayRef(sizes)) + " is a map";
}

std::unique_ptr<ImageConsumer> VectorTask::makeConsumer(CatalogImage& image, const TaskOutputs& outputs,
                                                        const WriterOptions&) const {
  WindowOutputOptions options = windowOutputOptions(outputs);
  options.class_scores = classScores();
  return windowOutputsConsumer(image, options);
}

void settlePatchLattice(const TaskFlags& flags, GridSpec& spec) {
  // Per-window outputs describe whole windows: without --overlap they tile the image without overlap, on the
  // patch lattice TRIDENT, CLAM and WSInfer cut (coordinates / patch size name distinct cells).
  if (!flags.overlap_given) spec.overlap_x = spec.overlap_y = 0.0;
  spec.lattice = flags.edge != "shift";
}

WindowOutputOptions windowOutputOptions(const TaskOutputs& outputs) {
  WindowOutputOptions wo;
  wo.kinds = outputs.flags.kinds;
  wo.dim = outputs.probe.output_channels;
  wo.overlap = outputs.spec.overlap_x;
  wo.classes = outputs.flags.classes;
  wo.compression = outputs.stage.compression;
  return wo;
}

namespace {

// classify, embed and detect: vectors or boxes into window_outputs' files, in window order.
class WindowOutputsConsumer : public ImageConsumer {
 public:
  WindowOutputsConsumer(CatalogImage& image, const WindowOutputOptions& options)
      : image_(image), dim_(options.dim), boxes_(options.boxes), out_(image, options) {}

  void aggregate(const std::vector<WindowResult>& windows) override {
    for (const WindowResult& w : windows) {
      if (w.record) {
        out_.addRecord(w.window, *w.record);
        continue;
      }
      // A vector's values are counted here; a box's where its rank made its record.
      image_.non_finite_values += countNonFinite(w.values, dim_);
      out_.add(w.window, w.values);
    }
  }
  bool done() const override { return out_.done(); }
  bool injectTileFault() override { return out_.injectTileFault(); }
  std::vector<std::string> finalize() override {
    addNonFinite(image_, 0);
    std::vector<std::string> paths = out_.commit();
    const auto objects = out_.objects();
    if (!objects) return paths;
    image_.objects = (*objects)[0];
    image_.objects_at_window_edge = (*objects)[1];
    if (boxes_ && image_.objects_at_window_edge > 0)
      spdlog::warn(
          "'{}': {} of {} object(s) touch a window edge inside the image: a window saw them cut, and "
          "another may have seen more of them (a larger --overlap than the largest object)",
          image_.input, image_.objects_at_window_edge, image_.objects);
    return paths;
  }

 private:
  CatalogImage& image_;  // the catalog's, which outlives the stage
  int64_t dim_;
  bool boxes_;
  WindowOutputs out_;
};

}  // namespace

std::unique_ptr<ImageConsumer> windowOutputsConsumer(CatalogImage& image,
                                                     const WindowOutputOptions& options) {
  return std::make_unique<WindowOutputsConsumer>(image, options);
}

}  // namespace tiler
