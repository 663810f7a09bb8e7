// The .pt2 runtime: an AOTInductor package (torch.export + aoti_compile_and_package) run by LibTorch's
// AOTIModelPackageLoader (2.6 and later). A package checks neither its inputs' shapes nor their layout (2.6
// read a permuted batch as if contiguous, a 64 px window into a 256 px package crashed), so tiler runs one
// only at a window size, batch and input channels it knows to fit, always on contiguous inputs: those its
// metadata records (scripts/export_model.py writes them: tiler_window, tiler_batch, tiler_in_channels), or,
// for a package without them (PyTorch's own aoti_compile_and_package), those that ran in a child process
// (probeShapesInChild) at the job's window. Its outputs come back as a flat list; where the package's call
// spec says they are a dict of tensors (torch.export records the forward's output structure), they are
// packed as that dict again, so --output_key and --heads take its keys as for TorchScript.
#include "tiler/model/torch_compat.hpp"

#include <spdlog/spdlog.h>
#include <torch/script.h>

#include <nlohmann/json.hpp>

#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/model/model_runtime.hpp"

namespace tiler {

namespace {

// A TreeSpec node that is a leaf (a tensor): no type, no context, no children.
bool isLeafSpec(const nlohmann::json& node) {
  if (!node.is_object()) return false;
  const auto type = node.find("type"), children = node.find("children_spec");
  return type != node.end() && type->is_null() && children != node.end() && children->is_array() &&
         children->empty();
}

}  // namespace

std::vector<std::string> outputNamesOfSpec(const std::string& out_spec) {
  const auto spec = nlohmann::json::parse(out_spec, nullptr, /*allow_exceptions=*/false);
  if (!spec.is_array() || spec.size() != 2 || spec[0] != 1 || !spec[1].is_object()) return {};
  const nlohmann::json& root = spec[1];
  const auto type = root.find("type"), context = root.find("context"), children = root.find("children_spec");
  if (type == root.end() || !(*type == "builtins.dict" || *type == "collections.OrderedDict")) return {};
  if (context == root.end() || !context->is_string() || children == root.end() || !children->is_array())
    return {};
  // A dict's context is its keys as a JSON list, itself a string in the spec.
  const auto keys = nlohmann::json::parse(context->get<std::string>(), nullptr, false);
  if (!keys.is_array() || keys.size() != children->size()) return {};
  std::vector<std::string> names;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!keys[i].is_string() || !isLeafSpec((*children)[i])) return {};
    names.push_back(keys[i].get<std::string>());
  }
  return names;
}

#if TILER_HAVE_AOTI

bool pt2Supported() {
  return true;
}

const char* pt2Unsupported() {
  return "";
}

namespace {

class Pt2Runtime final : public ModelRuntime {
 public:
  explicit Pt2Runtime(const RuntimeOptions& options) : options_(options) {
    const std::string& path = options.path;
    TILER_CHECK(!options.jit_optimize || options.jit_optimize_default, ConfigError,
                "'" << path << "': --jit_optimize is for TorchScript; a .pt2 package is compiled already");
    // The device first, from the package's metadata file: LibTorch's loader would fail on a package for a
    // device it was not built for with its own words.
    const auto json = findZipEntry(
        path,
        [](const std::string& name) {
          return name != "_metadata.json" && nameEndsWith(name, "_metadata.json");
        },
        1 << 20);
    const std::string ours = c10::DeviceTypeName(options.device.type(), /*lower_case=*/true);
    if (json && !json->empty()) {
      const auto metadata = nlohmann::json::parse(*json, nullptr, /*allow_exceptions=*/false);
      const std::string device =
          metadata.is_object() ? metadata.value("AOTI_DEVICE_KEY", std::string()) : std::string();
      TILER_CHECK(device.empty() || device == ours, ModelError,
                  "'" << path << "': the package was compiled for " << device << "; this run's device is "
                      << options.device.str() << " (--device " << device
                      << ", or export the package on the device it is to run on)");
    }
    try {
      loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path);
    } catch (const std::exception& e) {
      TILER_THROW(ModelError, "'" << path << "': not a .pt2 package that LibTorch " << TORCH_VERSION
                                  << " can run: " << firstLine(e.what()));
    }
    output_names_ = outputNamesFromCallSpec();
    const auto metadata = loader_->get_metadata();
    const auto field = [&metadata](const char* key) {
      auto it = metadata.find(key);
      return it == metadata.end() ? std::string() : it->second;
    };
    const std::string window = field("tiler_window"), batch = field("tiler_batch"),
                      channels = field("tiler_in_channels");
    // Without all three, what it takes is learnt at the window (refusesWindow); in the probe's child it runs
    // what it is given.
    learns_shape_ = window.empty() || batch.empty() || channels.empty();
    if (learns_shape_) return;
    if (window != "dynamic") {
      std::istringstream in(window);
      char x = 0;
      const bool ok =
          (in >> window_w_ >> x >> window_h_) && x == 'x' && window_w_ >= 1 && window_h_ >= 1 && in.eof();
      TILER_CHECK(ok, ModelError,
                  "'" << path << "': metadata tiler_window '" << window << "' is not WxH or dynamic");
    }
    if (batch != "dynamic") {
      batch_ = std::atoll(batch.c_str());
      TILER_CHECK(batch_ >= 1 && std::to_string(batch_) == batch, ModelError,
                  "'" << path << "': metadata tiler_batch '" << batch << "' is not a count or dynamic");
      spdlog::info("'{}': the package runs batches of {} windows only; shorter ones are padded", path,
                   batch_);
    }
    channels_ = std::atoi(channels.c_str());
    TILER_CHECK(channels_ >= 1 && std::to_string(channels_) == channels, ModelError,
                "'" << path << "': metadata tiler_in_channels '" << channels << "' is not a channel count");
  }

  const char* name() const override { return "pt2"; }

  c10::IValue run(const torch::Tensor& nchw) override {
    const torch::Tensor x = nchw.contiguous();
    const int64_t n = x.size(0);
    if (batch_ == 0 || n == batch_) return pack(loader_->run({x}));
    // A static batch: runs of batch_ windows, the last padded with zeros, outputs cut back to n.
    std::vector<std::vector<torch::Tensor>> runs;
    for (int64_t first = 0; first < n; first += batch_) {
      const int64_t count = std::min(batch_, n - first);
      torch::Tensor part = x.narrow(0, first, count);
      if (count < batch_) {
        std::vector<int64_t> sizes = x.sizes().vec();
        sizes[0] = batch_ - count;
        part = torch::cat({part, torch::zeros(sizes, x.options())});
      }
      std::vector<torch::Tensor> out = loader_->run({part.contiguous()});
      for (auto& t : out) t = t.narrow(0, 0, count);
      runs.push_back(std::move(out));
    }
    std::vector<torch::Tensor> joined;
    for (size_t k = 0; k < runs.front().size(); ++k) {
      std::vector<torch::Tensor> pieces;
      for (const auto& r : runs) pieces.push_back(r[k]);
      joined.push_back(torch::cat(pieces));
    }
    return pack(std::move(joined));
  }

  std::unique_ptr<ModelRuntime> replicate() const override {
    auto copy = std::make_unique<Pt2Runtime>(options_);
    copy->learns_shape_ = learns_shape_;  // what this one learnt holds for the copy: no second probe
    copy->window_w_ = window_w_;
    copy->window_h_ = window_h_;
    copy->batch_ = batch_;
    copy->channels_ = channels_;
    return copy;
  }
  bool autocasts() const override { return false; }
  std::optional<int> inputChannels() const override {
    return channels_ > 0 ? std::optional<int>(channels_) : std::nullopt;
  }

  std::string refusesWindow(int64_t w, int64_t h) override {
    if (learns_shape_ && !options_.in_probe && !(w == window_w_ && h == window_h_)) {
      const ShapeProbe found = probeShapesInChild(options_, w, h);
      if (found.channels == 0)
        return "the package records no window, batch or input channels (tiler's metadata, which "
               "scripts/export_model.py writes), and a child process that ran it at this window found that " +
               found.refusal;
      window_w_ = w;
      window_h_ = h;
      channels_ = found.channels;
      // A batch that ran is the batch it runs (shorter ones padded); else one window at a time.
      batch_ = found.batch_full ? options_.batch : 1;
      spdlog::info(
          "'{}': learnt from running it in a child process: {} input channel(s), {}x{} windows, "
          "batches of {}",
          options_.path, channels_, w, h, batch_);
      return {};
    }
    if (window_w_ == 0 || (w == window_w_ && h == window_h_)) return {};
    std::ostringstream why;
    why << "the package was compiled for windows of " << window_w_ << "x" << window_h_ << ", not " << w << "x"
        << h << " (--window " << window_w_;
    if (window_h_ != window_w_) why << "," << window_h_;
    why << ", or export it for that window)";
    return why.str();
  }

 private:
  // The names its call spec gives its outputs (empty: none; LibTorch's loader says [in_spec, out_spec]).
  std::vector<std::string> outputNamesFromCallSpec() const {
    std::vector<std::string> spec;
    try {
      spec = loader_->get_call_spec();
    } catch (const std::exception& e) {
      spdlog::debug("'{}': no call spec ({}): its outputs are picked by index", options_.path,
                    firstLine(e.what()));
    }
    return spec.size() == 2 ? outputNamesOfSpec(spec[1]) : std::vector<std::string>{};
  }

  // A dict by name where the call spec names every output (--output_key and --heads take its keys, as for
  // TorchScript); else one output as a tensor, several as a tuple (picked by index).
  c10::IValue pack(std::vector<torch::Tensor> outputs) const {
    if (!output_names_.empty() && output_names_.size() == outputs.size()) {
      c10::impl::GenericDict named(c10::StringType::get(), c10::TensorType::get());
      for (size_t k = 0; k < outputs.size(); ++k) named.insert(output_names_[k], std::move(outputs[k]));
      return c10::IValue(std::move(named));
    }
    if (outputs.size() == 1) return outputs.front();
    std::vector<c10::IValue> items(outputs.begin(), outputs.end());
    return c10::ivalue::Tuple::create(std::move(items));
  }

  RuntimeOptions options_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  std::vector<std::string> output_names_;  // from the call spec: a dict's keys, in order; empty: a tuple
  bool learns_shape_ = false;              // no tiler metadata: refusesWindow learns window, batch, channels
  int64_t window_w_ = 0, window_h_ = 0;    // 0: dynamic
  int64_t batch_ = 0;                      // 0: dynamic
  int channels_ = 0;
};

}  // namespace

std::unique_ptr<ModelRuntime> openPt2Runtime(const RuntimeOptions& options) {
  return std::make_unique<Pt2Runtime>(options);
}

#else

bool pt2Supported() {
  return false;
}

const char* pt2Unsupported() {
  return "this tiler was built against LibTorch " TORCH_VERSION
         ", which has no AOTInductor package loader (LibTorch 2.6 and later have it)";
}

std::unique_ptr<ModelRuntime> openPt2Runtime(const RuntimeOptions& options) {
  TILER_THROW(ModelError, "'" << options.path << "': a .pt2 package (AOTInductor); " << pt2Unsupported()
                              << ": export the model to TorchScript (scripts/export_model.py)");
}

#endif

}  // namespace tiler
