// tasks/instances: the task instances: a map of object ids and K class scores a window, [1 + K, h, w], whose
// objects are found where the window ran and sent to the owner as records, where the parts of objects a
// window edge cuts are joined (instances: objects, objects_csv, instances).
#include "tiler/tasks/task.hpp"

#include <spdlog/spdlog.h>

#include "tiler/core/error.hpp"
#include "tiler/writers/instances.hpp"

namespace tiler {
namespace {

InstanceOptions instanceOptions(const TaskOutputs& outputs) {
  InstanceOptions io;
  io.kinds = outputs.flags.kinds;
  io.channels = outputs.probe.output_channels;
  io.height = outputs.probe.scale.apply(outputs.spec.window_h);
  io.width = outputs.probe.scale.apply(outputs.spec.window_w);
  io.scale = outputs.probe.scale;
  if (io.channels > 1) io.classes = classNames(io.channels - 1, outputs.flags.classes);
  return io;
}

// An image's objects (InstanceOutputs), from the records of the ranks that found them.
class InstanceConsumer : public ImageConsumer {
 public:
  InstanceConsumer(CatalogImage& image, InstanceOptions options)
      : image_(image), band_height_(options.height), out_(image, std::move(options)) {}

  void aggregate(const std::vector<WindowResult>& windows) override {
    for (const WindowResult& w : windows) {
      if (w.record)
        out_.addRecord(w.window, *w.record);
      else
        out_.add(w.window, w.values);
    }
  }
  bool done() const override { return out_.done(); }
  bool injectTileFault() override { return out_.injectTileFault(); }
  std::vector<std::string> finalize() override {
    addNonFinite(image_, out_.nonFiniteValues());
    std::vector<std::string> paths = out_.commit();
    const auto objects = out_.objects();
    image_.objects = (*objects)[0];
    image_.objects_at_window_edge = (*objects)[1];
    if (image_.objects_at_window_edge > 0)
      spdlog::warn(
          "'{}': {} object(s) cut by a window edge were taller than the {} rows of the map held to join "
          "them ({} window heights) and were left out; {} written",
          image_.input, image_.objects_at_window_edge, kJoinBandWindows * band_height_, kJoinBandWindows,
          image_.objects);
    return paths;
  }

 private:
  CatalogImage& image_;  // the catalog's, which outlives the stage
  int64_t band_height_;  // a window's height in output pixels
  InstanceOutputs out_;
};

class InstancesTask : public Task {
 public:
  const char* name() const override { return "instances"; }
  std::vector<Consumes> produces() const override {
    return {Consumes::kObjects, Consumes::kInstanceMap, Consumes::kStoredObjects};
  }
  std::vector<std::string> defaultKinds() const override { return {"objects"}; }
  std::string refuses(const std::vector<int64_t>& sizes) const override {
    if (sizes.size() == 4 && sizes[1] >= 1) return "";
    return "--task instances needs an instance map [batch, 1 + K, h, w] (object ids, then K class scores), "
           "but the output is " +
           c10::str(torch::IntArrayRef(sizes));
  }
  // No output shape says "instances" for sure: --task or --save says it.
  bool claimedByShape() const override { return false; }
  std::string shapeWords() const override { return "instance maps, [batch, 1 + K, h, w] (--task instances)"; }
  // Ids exactly past 2^24.
  torch::ScalarType predictionType() const override { return torch::kFloat64; }
  bool sendsRecords() const override { return true; }
  // The objects a window keeps, found where it ran.
  RecordMaker recordMaker(const TaskOutputs& outputs) const override {
    return [options = instanceOptions(outputs)](const CatalogImage& image, int64_t window,
                                                const torch::Tensor& map) {
      return encodeWindowObjects(keepWindowObjects(image, options, window, map.data_ptr<double>()));
    };
  }
  std::unique_ptr<ImageConsumer> makeConsumer(CatalogImage& image, const TaskOutputs& outputs,
                                              const WriterOptions& writer) const override {
    InstanceOptions io = instanceOptions(outputs);
    io.tiff = writer;
    return std::make_unique<InstanceConsumer>(image, std::move(io));
  }

 protected:
  void checkFlags(const ModelProbe& probe, const TaskFlags& flags, GridSpec& spec) const override {
    // Ids are labels, not values: a flipped window's ids are other ids, and activations or blending would
    // make them fractions.
    TILER_CHECK(flags.tta == Tta::kNone, ConfigError,
                "--tta is for maps and vectors, not --task instances' ids");
    TILER_CHECK(flags.activation == Activation::kNone, ConfigError,
                "--activation " << flags.activation_name
                                << " would turn --task instances' ids into fractions; "
                                << "class scores are read as the model gives them");
    TILER_CHECK(flags.classes.empty() || int(flags.classes.size()) == probe.output_channels - 1, ConfigError,
                "--classes names " << flags.classes.size() << " class(es), the model gives "
                                   << probe.output_channels - 1 << " class channel(s) after its ids");
    // Ids are found, never blended or stored as maps: the flags that shape a stitched map do nothing here.
    for (const std::string& flag : flags.map_flags)
      TILER_THROW(ConfigError, flag << " is for a stitched map (--task segment); --task instances finds "
                                    << "objects in each window's ids and writes them as they are: leave "
                                    << flag << " out");
    // The lattice lays windows out in input pixels; a map at another scale needs MONAI's grid, which lays
    // them out in output pixels so that each window maps to whole output pixels.
    const bool scaled = !(probe.scale == Scale{});
    TILER_CHECK(!scaled || flags.edge != "lattice", ConfigError,
                "--edge lattice needs maps of the window's size; '"
                    << flags.model << "' gives maps at " << probe.scale.value()
                    << "x the window (--edge shift, or leave --edge at auto, which takes shift for it)");
    spec.lattice = flags.edge == "lattice" || (flags.edge == "auto" && !scaled);
  }
};

}  // namespace

const Task& instancesTask() {
  static const InstancesTask task;
  return task;
}

}  // namespace tiler
