#include "tiler/model/model.hpp"

#include <ATen/Parallel.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include <mutex>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/model/torch_compat.hpp"
#include "tiler/tasks/registry.hpp"
#include "tiler/writers/window_outputs.hpp"

namespace tiler {
namespace {

// CUDA's "CUDA out of memory."; the CPU allocator's "not enough memory" (1.x), "can't allocate memory" (2.x).
constexpr const char* kOutOfMemorySigns[] = {"out of memory", "not enough memory", "can't allocate memory"};

// The line of `what` that says memory ran out (the interpreter puts its own line and a traceback first).
std::string outOfMemoryLine(const std::string& what) {
  for (const char* sign : kOutOfMemorySigns) {
    const auto at = what.find(sign);
    if (at == std::string::npos) continue;
    const auto begin = what.rfind('\n', at), end = what.find('\n', at);
    const auto from = begin == std::string::npos ? 0 : begin + 1;
    return what.substr(from, end == std::string::npos ? std::string::npos : end - from);
  }
  return what;
}

}  // namespace

ModelOptions modelOptionsFor(const JobOptions& job, int local_rank) {
  ModelOptions mo;
  mo.path = job.model.empty() ? bundledSamplesDir() + "/models/sample.pt" : job.model;
  mo.sha256 = job.model_sha256;
  mo.sha256_card = job.model_card;
  mo.device = job.device;
  mo.precision = job.precision;
  mo.threads = job.threads;
  mo.output_key = job.output_key;
  mo.mean = job.mean;
  mo.std = job.std;
  mo.input_steps = job.preprocessing;
  mo.output_steps = splitAtStatistics(job.postprocessing).first;  // the rest: the blended image's
  mo.local_rank = local_rank;
  mo.preferred_input_channels = int(parseChannelList(job.channels).size());
  return mo;
}

bool isOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  const std::string what = e.what();
  for (const char* sign : kOutOfMemorySigns)
    if (what.find(sign) != std::string::npos) return true;
  return false;
}

torch::Device resolveDevice(const std::string& spec, int local_rank) {
  const bool cuda = torch::cuda::is_available();
  if (spec == "cpu" || (spec == "auto" && !cuda)) return torch::Device(torch::kCPU);
  TILER_CHECK(cuda, ConfigError,
              "--device " << spec << ": CUDA is not usable here (LibTorch "
                          << (TILER_WITH_CUDA ? "has CUDA but no GPU is visible" : "was built without CUDA")
                          << ")");
  const int count = int(torch::cuda::device_count());
  if (spec == "auto" || spec == "cuda") return torch::Device(torch::kCUDA, int8_t(local_rank % count));
  if (spec.rfind("cuda:", 0) == 0) {
    int k = -1;
    try {
      k = std::stoi(spec.substr(5));
    } catch (const std::exception&) {
    }
    TILER_CHECK(k >= 0 && k < count, ConfigError,
                "--device " << spec << ": have " << count << " CUDA device(s)");
    return torch::Device(torch::kCUDA, int8_t(k));
  }
  TILER_THROW(ConfigError, "--device must be auto, cpu, cuda or cuda:K; got '" << spec << "'");
}

Precision resolvePrecision(const std::string& spec, const torch::Device& device) {
  if (spec == "auto") return device.is_cuda() ? Precision::kFp16 : Precision::kFp32;
  if (spec == "fp32") return Precision::kFp32;
  if (spec == "bf16") return Precision::kBf16;
  if (spec == "fp16") {
    TILER_CHECK(device.is_cuda(), ConfigError, "--precision fp16 needs CUDA; on the CPU use bf16 or fp32");
    return Precision::kFp16;
  }
  TILER_THROW(ConfigError, "--precision must be fp32, fp16 or bf16; got '" << spec << "'");
}

ModelRunner::ModelRunner(const ModelOptions& options)
    : options_(options),
      device_(resolveDevice(options.device, options.local_rank)),
      precision_(resolvePrecision(options.precision, device_)),
      current_device_(device_) {
  installLargeBlockCache();
  // oneDNN reads its ISA limit once, at its first kernel: before the model is loaded or run.
  if (compat::kOneDnnBf16NeedsAvx2 && precision_ == Precision::kBf16 && device_.is_cpu() &&
      std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr) {
    setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
    spdlog::info(
        "bf16 on the CPU: oneDNN limited to AVX2 kernels (its AVX-512 bf16 convolutions are wrong in "
        "this LibTorch); set ONEDNN_MAX_CPU_ISA to override");
  }
  at::set_num_threads(options.threads > 0 ? options.threads : defaultIntraOpThreads());
  // optimize_for_inference fuses ops (conv+bn, conv+add) into ones autocast has no rule for: their inputs
  // would stay fp32 or mix with fp16 weights.
  TILER_CHECK(!options.jit_optimize || precision_ == Precision::kFp32, ConfigError,
              "--jit_optimize fuses ops that mixed precision does not cover; use it with --precision fp32");
  const bool by_default = options.jit_optimize_default && !options.jit_optimize;
  if (by_default && precision_ != Precision::kFp32)
    jit_fallback_ = "--precision " + std::string(precisionName(precision_)) +
                    ": optimize_for_inference fuses ops that mixed precision does not cover";
  else if (by_default && !device_.is_cpu())
    jit_fallback_ = "optimize_for_inference's fusions are oneDNN's, for the CPU";
  RuntimeOptions runtime;
  runtime.path = options.path, runtime.device = device_;
  runtime.jit_optimize = options.jit_optimize || (by_default && jit_fallback_.empty());
  runtime.jit_optimize_default = by_default;
  runtime.batch = options.batch_size, runtime.sha256 = options.sha256,
  runtime.sha256_card = options.sha256_card;
  runtime_ = openModelRuntime(runtime);
  if (runtime.jit_optimize && by_default && !runtime_->optimized())
    jit_fallback_ = runtime_->autocasts() ? runtime_->notOptimized() : "a .pt2 package is compiled already";
  if (!jit_fallback_.empty()) spdlog::debug("'{}' runs as loaded: {}", options.path, jit_fallback_);
  if (!runtime_->autocasts()) {
    TILER_CHECK(options.precision == "auto" || options.precision == "fp32", ConfigError,
                "'" << options.path << "': --precision " << options.precision
                    << " runs the model under autocast; a .pt2 package runs in the precision it was compiled "
                    << "in (leave --precision at auto or fp32)");
    precision_ = Precision::kFp32;
  }
}

ModelRunner::ModelRunner(const ModelRunner& other, std::unique_ptr<ModelRuntime> runtime)
    : options_(other.options_),
      device_(other.device_),
      precision_(other.precision_),
      current_device_(device_),
      runtime_(std::move(runtime)),
      probe_(other.probe_),
      head_probes_(other.head_probes_),
      mean_(other.mean_),
      inv_std_(other.inv_std_),
      input_tail_(other.input_tail_),
      jit_fallback_(other.jit_fallback_) {}

void ModelRunner::synchronize() const {
  if (device_.is_cpu()) return;
  const c10::impl::VirtualGuardImpl device(device_.type());
  device.synchronizeStream(device.getStream(device_));
}

std::unique_ptr<ModelRunner> ModelRunner::replicate() const {
  return std::unique_ptr<ModelRunner>(new ModelRunner(*this, runtime_->replicate()));
}

namespace {

std::string untrainablePackage(const std::string& path) {
  return "'" + path +
         "': training needs a TorchScript model; a .pt2 package is compiled code and has no trainable "
         "parameters (export the model with torch.jit.script(model).save())";
}

}  // namespace

void requireTrainableModel(const std::string& path) {
  TILER_CHECK(!isPt2Package(path), ConfigError, untrainablePackage(path));
}

torch::jit::Module& ModelRunner::module() {
  torch::jit::Module* module = runtime_->module();
  TILER_CHECK(module != nullptr, ConfigError, untrainablePackage(options_.path));
  return *module;
}

namespace {

// A step's per-channel values as a tensor that broadcasts along dimension 1 of a tensor of `dims`
// dimensions ([B, C, H, W] or a per-window [B, D]).
torch::Tensor perChannel(const std::vector<double>& v, const torch::Tensor& like) {
  std::vector<int64_t> shape(size_t(like.dim()), 1);
  shape[1] = int64_t(v.size());
  return torch::tensor(v, torch::kFloat32).to(like.device()).view(shape);
}

// A card's fixed steps on a batch, in order (bioimage.io's definitions; binarize gives 0 and 1).
torch::Tensor applySteps(torch::Tensor x, const std::vector<ProcessingStep>& steps) {
  for (const ProcessingStep& s : steps) {
    if (s.id == "scale_linear") {
      x = x * perChannel(s.gain, x) + perChannel(s.offset, x);
    } else if (s.id == "clip") {
      x = torch::clamp(x, std::isfinite(s.min) ? c10::optional<c10::Scalar>(s.min) : c10::nullopt,
                       std::isfinite(s.max) ? c10::optional<c10::Scalar>(s.max) : c10::nullopt);
    } else if (s.id == "sigmoid") {
      x = torch::sigmoid(x);
    } else if (s.id == "softmax") {
      x = torch::softmax(x, 1);
    } else if (s.id == "binarize") {
      x = torch::gt(x, perChannel(s.threshold, x)).to(x.scalar_type());
    } else {
      TILER_THROW(ConfigError, "step '" << s.id << "' is not one tiler applies to a window");
    }
  }
  return x;
}

// Each step's per-channel values are one or one a channel of the tensor it meets.
void checkStepChannels(const std::vector<ProcessingStep>& steps, int channels, const std::string& list,
                       const std::string& path) {
  for (const ProcessingStep& s : steps)
    for (const auto* v : {&s.gain, &s.offset, &s.threshold})
      TILER_CHECK(v->size() <= 1 || int(v->size()) == channels, ConfigError,
                  "'" << path << "': the card's " << list << " step " << s.id << " has " << v->size()
                      << " values, one a channel, but the model's tensor there has " << channels
                      << " channels");
}

// `key` as an index below `size`, if it is one.
std::optional<size_t> indexKey(const std::string& key, size_t size) {
  if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos || key.size() > 9)
    return std::nullopt;
  const size_t k = std::stoul(key);
  return k < size ? std::optional<size_t>(k) : std::nullopt;
}

// The element of a tuple or list by `key`, an index (empty: the first tensor). A package's tuple is its
// outputs where its call spec names none (`unnamed_package`): a name is refused saying so.
torch::Tensor pickFromSequence(const std::string& path, const c10::IValue& out, const std::string& key,
                               bool unnamed_package) {
  const char* kind = out.isTuple() ? "tuple" : "list";
  std::vector<c10::IValue> items;
  if (out.isTuple()) {
    for (const auto& e : out.toTuple()->elements()) items.push_back(e);
  } else {
    for (const auto& e : out.toList()) items.push_back(e);
  }
  if (!key.empty()) {
    const bool is_index = key.find_first_not_of("0123456789") == std::string::npos;
    TILER_CHECK(is_index || !unnamed_package, ModelError,
                "'" << path << "': the package's " << items.size()
                    << " outputs have no names (its call spec records no dict of tensors), so '" << key
                    << "' names none of them: pick one by index, 0 to " << items.size() - 1);
    TILER_CHECK(
        is_index, ModelError,
        "'" << path << "': output is a " << kind << "; --output_key must be an index, got '" << key << "'");
    const auto k = indexKey(key, items.size());
    TILER_CHECK(k && items[*k].isTensor(), ModelError,
                "'" << path << "': output element " << key << " is not a tensor");
    return items[*k].toTensor();
  }
  for (const auto& e : items) {
    if (e.isTensor()) return e.toTensor();
  }
  // Say what it holds instead (a list of lists of tensors, of numbers, nothing): the type names it.
  TILER_THROW(ModelError, "'" << path << "': the model's output is a " << kind << " of " << items.size()
                              << " item(s), " << out.type()->annotation_str()
                              << ", with no tensor among them; tiler takes a tensor, or one of a tuple, list "
                              << "or dict (--output_key)");
}

// The entry of a dict by `key`: its name, else its position in the dict's order (a .pt2 package's outputs
// were picked by index before their names were known); empty: the first tensor.
torch::Tensor pickFromDict(const std::string& path, const c10::impl::GenericDict& dict,
                           const std::string& key) {
  if (key.empty()) {
    for (const auto& entry : dict) {
      if (entry.value().isTensor()) return entry.value().toTensor();
    }
    TILER_THROW(ModelError, "'" << path << "': the model's output dict holds no tensor");
  }
  const auto position = indexKey(key, dict.size());
  std::optional<c10::IValue> by_name, by_position;
  size_t k = 0;
  for (const auto& entry : dict) {
    if (entry.key().isString() && entry.key().toStringRef() == key) by_name = entry.value();
    if (position == k++) by_position = entry.value();
  }
  const std::optional<c10::IValue>& value = by_name ? by_name : by_position;
  TILER_CHECK(value.has_value(), ModelError, "'" << path << "': output dict has no key '" << key << "'");
  TILER_CHECK(value->isTensor(), ModelError, "'" << path << "': output '" << key << "' is not a tensor");
  return value->toTensor();
}

}  // namespace

torch::Tensor ModelRunner::extractTensor(const c10::IValue& out, const std::string& key) const {
  const std::string& path = options_.path;
  // One tensor is output 0 and no other: --heads a,b would otherwise write the same map twice.
  TILER_CHECK(!out.isTensor() || key.empty() || key == "0", ModelError,
              "'" << path << "': the model returns one tensor, which has no output '" << key
                  << "' (--output_key and --heads name the outputs of a dict, tuple or list)");
  if (out.isTensor()) return out.toTensor();
  if (out.isTuple() || out.isList())
    return pickFromSequence(path, out, key, std::strcmp(runtime_->name(), "pt2") == 0);
  if (out.isGenericDict()) return pickFromDict(path, out.toGenericDict(), key);
  TILER_THROW(ModelError, "'" << path << "': the model returns " << out.tagKind() << ", not a tensor");
}

torch::Tensor ModelRunner::apply(const torch::Tensor& nchw) {
  const bool autocast = precision_ != Precision::kFp32;
  const auto dtype = precision_ == Precision::kBf16 ? at::kBFloat16 : at::kHalf;
  compat::AutocastScope scope(device_.type(), autocast, dtype);
  c10::IValue out = runtime_->run(nchw);
  return extractTensor(out, options_.output_key).to(predictionType(options_.task));
}

std::vector<torch::Tensor> ModelRunner::applyHeads(const torch::Tensor& nchw) {
  if (options_.heads.empty()) return {apply(nchw)};
  const bool autocast = precision_ != Precision::kFp32;
  const auto dtype = precision_ == Precision::kBf16 ? at::kBFloat16 : at::kHalf;
  compat::AutocastScope scope(device_.type(), autocast, dtype);
  // One forward for every head.
  c10::IValue out = runtime_->run(nchw);
  std::vector<torch::Tensor> heads;
  for (const HeadOptions& head : options_.heads)
    heads.push_back(extractTensor(out, head.key).to(predictionType(head.task)));
  return heads;
}

torch::ScalarType predictionType(const Task* task) {
  return task == nullptr ? torch::kFloat32 : task->predictionType();
}

namespace {

// What one output of a window of `window_w` x `window_h` is: its task (as `task` asks, or as its shape says),
// channels and scale; ModelError starting with 'path' (and the head) when it is none of the tasks'.
ModelProbe probeOutput(torch::Tensor out, const Task* task, Activation activation, bool classes_named,
                       int64_t window_w, int64_t window_h, const std::string& path) {
  ModelProbe probe;
  probe.task = &resolveTask(task, out.sizes().vec(), activation, classes_named, path);
  TILER_CHECK(out.size(0) == 1, ModelError,
              "'" << path << "': output batch " << out.size(0) << " for input batch 1");
  // A detector may find nothing: [1, 0, 6] is no boxes.
  TILER_CHECK(out.numel() > 0 || probe.task->givesBoxes(), ModelError,
              "'" << path << "': output " << c10::str(out.sizes())
                  << " is empty; tiler needs at least one channel (a map) or one value (a vector) a window");
  Scale s;
  if (perWindow(probe)) {
    out = out.flatten(1);
  } else {
    const int64_t oh = out.size(2), ow = out.size(3);
    if (oh >= window_h && oh % window_h == 0) {
      s = Scale{oh / window_h, 1};
    } else if (oh > 0 && oh < window_h && window_h % oh == 0) {
      s = Scale{1, window_h / oh};
    } else {
      s = Scale{1, 0};
    }
    TILER_CHECK(s.den > 0 && s.apply(window_h) == oh && s.apply(window_w) == ow, ModelError,
                "'" << path << "': output " << ow << "x" << oh << " for a " << window_w << "x" << window_h
                    << " window is not an exact integer multiple or fraction of it");
  }
  probe.output_channels = int(out.size(1));
  probe.scale = s;
  return probe;
}

}  // namespace

const ModelProbe& ModelRunner::probe(int64_t window_w, int64_t window_h) {
  if (probe_.input_channels > 0) return probe_;
  c10::InferenceMode guard;
  const std::string& path = options_.path;
  const std::string refused = runtime_->refusesWindow(window_w, window_h);
  TILER_CHECK(refused.empty(), ModelError, "'" << path << "': " << refused);
  // The model's input channel count is not in a TorchScript file: try the likely ones, then a few more.
  std::vector<int> counts = {3, 1, 4, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  if (auto known = runtime_->inputChannels()) {
    counts = {*known};
  } else if (const int chosen = options_.preferred_input_channels; chosen > 0) {
    // --channels chose this many: a model that takes any count is fed them.
    counts.erase(std::remove(counts.begin(), counts.end(), chosen), counts.end());
    counts.insert(counts.begin(), chosen);
  }
  std::string first_error;
  for (int c : counts) {
    std::vector<torch::Tensor> outs;
    try {
      outs = applyHeads(torch::zeros({1, c, window_h, window_w}, torch::TensorOptions().device(device_)));
    } catch (const ModelError&) {
      throw;
    } catch (const std::exception& e) {
      // Out of memory: another channel count would not fit either; say what ran out.
      TILER_CHECK(!isOutOfMemory(e), ModelError,
                  "'" << path << "': out of memory running one " << window_w << "x" << window_h
                      << " window on " << device_.str()
                      << " (a smaller --window?): " << outOfMemoryLine(e.what()));
      if (first_error.empty()) first_error = firstLine(e.what());
      continue;
    }
    head_probes_.clear();
    if (options_.heads.empty())
      head_probes_.push_back(probeOutput(outs[0], options_.task, options_.activation, options_.classes_named,
                                         window_w, window_h, path));
    for (size_t h = 0; h < options_.heads.size(); ++h) {
      const HeadOptions& head = options_.heads[h];
      head_probes_.push_back(probeOutput(outs[h], head.task, head.activation, head.classes_named, window_w,
                                         window_h, path + "' head '" + head.name));
    }
    for (ModelProbe& p : head_probes_) p.input_channels = c;
    probe_ = head_probes_.front();
    break;
  }
  TILER_CHECK(probe_.input_channels > 0, ModelError,
              "'" << path << "': forward of a " << window_w << "x" << window_h
                  << " zero window failed for 1 to 16 "
                  << "input channels: " << first_error);
  const int c = probe_.input_channels;
  auto per_channel = [&](const std::vector<double>& v, const char* name) {
    TILER_CHECK(v.size() == 1 || int(v.size()) == c, ConfigError,
                "--" << name << " has " << v.size() << " values; the model takes " << c << " channels");
    auto t = torch::tensor(v, torch::kFloat32);
    if (v.size() == 1) t = t.expand({c}).clone();
    return t.view({1, c, 1, 1}).to(device_);
  };
  if (!options_.mean.empty()) mean_ = per_channel(options_.mean, "mean");
  if (!options_.std.empty()) {
    // The division is in float32: 1/std of a number float32 cannot hold normally is infinite.
    for (double s : options_.std)
      TILER_CHECK(std::isnormal(float(s)) && std::isfinite(1.0f / float(s)), ConfigError,
                  "--std values must be non-zero normal float32 numbers; got " << s);
    inv_std_ = 1.0 / per_channel(options_.std, "std");
  }
  input_tail_ = fixedTail(options_.input_steps);
  checkStepChannels(input_tail_, c, "inputs[0].preprocessing", path);
  checkStepChannels(options_.output_steps, probe_.output_channels, "outputs[0].postprocessing", path);
  if (options_.jit_optimize_default && !options_.jit_optimize && runtime_->optimized())
    checkOptimized(c, window_w, window_h);
  spdlog::debug("model '{}': {} -> {} channels, scale {}/{}, task {}", path, c, probe_.output_channels,
                probe_.scale.num, probe_.scale.den, taskName(probe_.task));
  return probe_;
}

namespace {

// Every tensor of a model's output (a tensor, or those of a tuple, list or dict, nested), in order.
void tensorsOf(const c10::IValue& v, std::vector<torch::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTuple()->elements()) tensorsOf(e, out);
  } else if (v.isList()) {
    for (const auto& e : v.toList()) tensorsOf(e, out);
  } else if (v.isGenericDict()) {
    for (const auto& entry : v.toGenericDict()) tensorsOf(entry.value(), out);
  }
}

// Why the optimised outputs `got` are not the loaded module's `want`, or empty.
std::string outputsDiffer(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " output tensors, the model as loaded " + std::to_string(want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k].sizes() != want[k].sizes())
      return "output " + std::to_string(k) + " is " + c10::str(got[k].sizes()) + ", as loaded " +
             c10::str(want[k].sizes());
    if (want[k].numel() == 0) continue;
    const torch::Tensor a = got[k].to(torch::kDouble), b = want[k].to(torch::kDouble);
    const double scale = std::max(1.0, b.abs().max().item<double>());
    const double diff = (a - b).abs().max().item<double>();
    // NaN anywhere fails too.
    if (!(diff <= kJitOptimizeTolerance * scale)) {
      std::ostringstream why;
      why << "its output " << k << " differs from the model's as loaded by up to " << diff << " (over "
          << kJitOptimizeTolerance << " x " << scale << ")";
      return why.str();
    }
  }
  return {};
}

thread_local double normalize_seconds = 0;

}  // namespace

double normalizeSecondsOfThisThread() {
  return normalize_seconds;
}

namespace {

// Values in [0, 1) that change from pixel to pixel and channel to channel (a zero window checks only the
// biases).
torch::Tensor variedWindow(int channels, int64_t window_w, int64_t window_h) {
  return torch::arange(int64_t(channels) * window_h * window_w, torch::kFloat32)
      .mul_(0.6180339887f)
      .frac_()
      .view({1, channels, window_h, window_w});
}

// The process's intra-op threads set for a scope (left alone where `threads` is 0), restored when it ends.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int threads) : restore_(threads > 0 ? at::get_num_threads() : 0) {
    if (threads > 0) at::set_num_threads(threads);
  }
  ~IntraOpThreads() {
    if (restore_ > 0) at::set_num_threads(restore_);
  }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int restore_;
};

}  // namespace

bool ModelRunner::sameOutputAtThreads(int64_t window_w, int64_t window_h, int threads) {
  const torch::Tensor u = variedWindow(probe_.input_channels, window_w, window_h);
  const torch::Tensor scales = torch::ones({1});
  try {
    const IntraOpThreads scope(1);
    const torch::Tensor one = forward(u, scales).cpu();
    at::set_num_threads(threads);
    const torch::Tensor many = forward(u, scales).cpu();
    return torch::equal(one, many);
  } catch (const std::exception& e) {
    spdlog::debug("'{}': the thread check's forward failed: {}", options_.path, firstLine(e.what()));
    return false;
  }
}

void ModelRunner::checkOptimized(int channels, int64_t window_w, int64_t window_h) {
  c10::InferenceMode guard;
  // Through the job's normalisation.
  const torch::Tensor u = variedWindow(channels, window_w, window_h);
  std::string why;
  try {
    const torch::Tensor x = normalize(u, torch::ones({1}));
    std::vector<torch::Tensor> got, want;
    tensorsOf(runtime_->run(x), got);
    tensorsOf(runtime_->runUnoptimized(x), want);
    why = outputsDiffer(got, want);
  } catch (const std::exception& e) {
    // The probe ran a zero window; a model may fail on others (and its windows then fail their images): as
    // loaded, it fails as it would have.
    why = "its forward failed on the check's window: " + firstLine(e.what());
  }
  if (why.empty()) {
    runtime_->dropUnoptimized();
    return;
  }
  runtime_->useUnoptimized();
  jit_fallback_ = "the frozen + optimize_for_inference model's check failed: " + why;
  spdlog::warn("'{}' runs as loaded: {}", options_.path, jit_fallback_);
}

double ModelRunner::secondsPerWindow(int64_t window_w, int64_t window_h, int64_t batch, double enough) {
  // One window twice first (a heavy model is plain from it, at a fraction of a batch's start-up time), then
  // whole batches as the run sends them: one window alone can cost a light model 20x more per window
  // (LibTorch's fixed cost per call, buffers small enough for malloc instead of the block cache).
  const auto one = torch::zeros({1, probe_.input_channels, window_h, window_w});
  const auto windows = torch::zeros({batch, probe_.input_channels, window_h, window_w});
  const auto one_scale = torch::ones({1}), scales = torch::ones({batch});
  // On the CPU: this thread's CPU time, one intra-op thread. Wall time counts whatever else the machine runs,
  // and under load would judge a light model heavy.
  const bool cpu = !device_.is_cuda();
  const IntraOpThreads one_thread(cpu ? 1 : 0);
  auto now = [cpu] {
    if (!cpu)
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  double best = std::numeric_limits<double>::infinity();
  // LibTorch 1.13's graph executor profiles and optimises the first forwards of a shape, each costing many
  // times a light model's own forward: go on until a run answers the question.
  for (int run = 0; run < 8; ++run) {
    const bool single = run < 2;  // one window twice: the second past most of its shape's one-time cost
    const int64_t n = single ? 1 : batch;
    const double t0 = now();
    forward(single ? one : windows, single ? one_scale : scales);
    synchronize();
    const double seconds = now() - t0;
    best = std::min(best, seconds / double(n));
    if (best < enough) break;
    // One window again over twice the bar: heavy. A batch could only save a call's own cost per window, and a
    // call that costs a bar on its own keeps replicas busy too; the first batch of a shape costs several
    // times a window alone, which the replicas then pay side by side.
    if (run == 1 && seconds > 2 * enough) break;
    // A run past twice the bar and any warm-up's cost (100 ms) says enough on its own.
    if (seconds / double(n) > 2 * enough && seconds > 0.1) break;
  }
  return best;
}

torch::Tensor ModelRunner::normalize(const torch::Tensor& batch, const torch::Tensor& scales,
                                     const torch::Tensor& affine) const {
  const auto t0 = std::chrono::steady_clock::now();
  struct Count {
    std::chrono::steady_clock::time_point t0;
    ~Count() {
      normalize_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  } count{t0};
  const bool cuda = device_.is_cuda();
  torch::Tensor x = batch.to(device_, /*non_blocking=*/cuda);
  if (affine.defined()) {
    // Each image's own map (scale, mean, std and a card's statistics steps composed): [B, 2, C].
    const auto f = affine.to(device_, cuda);
    const int64_t b = f.size(0), c = f.size(2);
    const auto gain = f.select(1, 0).reshape({b, c, 1, 1}), offset = f.select(1, 1).reshape({b, c, 1, 1});
    x = x.is_floating_point() ? x * gain : x.to(torch::kFloat32).mul_(gain);
    x.add_(offset);
  } else {
    // A batch of bytes becomes floats on the device (a quarter of the copy); the same values either way.
    // Bytes times float32 scales are float32 products of the bytes' exact values, in one pass over the batch.
    const auto scale = scales.to(device_, cuda).view({-1, 1, 1, 1});
    x = x * scale;
    if (mean_.defined()) x.sub_(mean_);
    if (inv_std_.defined()) x.mul_(inv_std_);
  }
  if (!input_tail_.empty()) x = applySteps(x, input_tail_);
  return x.contiguous();
}

std::vector<torch::Tensor> ModelRunner::activatedHeads(const torch::Tensor& x) {
  std::vector<torch::Tensor> outs = applyHeads(x);
  for (size_t h = 0; h < outs.size(); ++h) {
    const ModelProbe& probe = h < head_probes_.size() ? head_probes_[h] : probe_;  // unprobed: a map
    torch::Tensor& out = outs[h];
    // Boxes are flattened below: a shape that is not the probe's is shown as the model gave it.
    const int64_t boxes = probe.output_channels / 6;
    TILER_CHECK(probe.task == nullptr || !probe.task->givesBoxes() ||
                    out.sizes() == torch::IntArrayRef({x.size(0), boxes, int64_t(6)}),
                ModelError,
                "'" << options_.path << "': the model's output is " << out.sizes() << " for " << x.size(0)
                    << " windows, not [" << x.size(0) << ", " << boxes << ", 6] as at the probe (a detector "
                    << "gives every window the same N rows, padding with a score of 0 or less)");
    // A per-window model's [B, D, 1, 1] as [B, D].
    if (perWindow(probe)) out = out.flatten(1);
    const Activation activation = options_.heads.empty() ? options_.activation : options_.heads[h].activation;
    if (activation == Activation::kSoftmax) out = torch::softmax(out, 1);
    if (activation == Activation::kSigmoid) out = torch::sigmoid(out);
    if (options_.heads.empty() && !options_.output_steps.empty())
      out = applySteps(out, options_.output_steps);
  }
  return outs;
}

namespace {

// One output as it is; heads (`packed`, one or several) side by side, each window's values of every head in a
// row.
torch::Tensor packHeads(const std::vector<torch::Tensor>& heads, bool packed) {
  if (!packed) return heads.front().contiguous();
  std::vector<torch::Tensor> rows;
  for (const torch::Tensor& head : heads) rows.push_back(head.flatten(1));
  return torch::cat(rows, 1).contiguous();
}

}  // namespace

torch::Tensor ModelRunner::forward(const torch::Tensor& batch, const torch::Tensor& scales,
                                   const torch::Tensor& affine) {
  c10::InferenceMode guard;
  const torch::Tensor x = normalize(batch, scales, affine);
  if (options_.tta == Tta::kNone) return packHeads(activatedHeads(x), !options_.heads.empty());
  // (quarter turns, mirrored): the copies of the batch, all in one forward.
  std::vector<std::pair<int64_t, bool>> views = {{0, false}, {0, true}};
  if (options_.tta == Tta::kD4)
    views = {{0, false}, {1, false}, {2, false}, {3, false}, {0, true}, {1, true}, {2, true}, {3, true}};
  std::vector<torch::Tensor> copies;
  for (const auto& [turns, mirrored] : views) {
    const torch::Tensor v = mirrored ? x.flip({3}) : x;
    copies.push_back(turns ? torch::rot90(v, turns, {2, 3}) : v);
  }
  const std::vector<torch::Tensor> outs = activatedHeads(torch::cat(copies, 0));
  std::vector<torch::Tensor> means;
  for (size_t h = 0; h < outs.size(); ++h) {
    const bool map = !perWindow(h < head_probes_.size() ? head_probes_[h] : probe_);
    const auto parts = outs[h].chunk(int64_t(views.size()), 0);
    torch::Tensor sum;
    for (size_t i = 0; i < views.size(); ++i) {
      const auto& [turns, mirrored] = views[i];
      // A map goes back to the window's orientation; a vector belongs to the whole window as it is.
      torch::Tensor back = parts[i];
      if (map && turns) back = torch::rot90(back, -turns, {2, 3});
      if (map && mirrored) back = back.flip({3});
      sum = sum.defined() ? sum + back : back;
    }
    means.push_back(sum / double(views.size()));
  }
  return packHeads(means, !options_.heads.empty());
}

ForwardPool::ForwardPool(ModelRunner& model, ForwardLayout layout) : threads_each_(layout.threads) {
  const bool shared = !model.device().is_cpu();
  if (!shared)
    for (int i = 1; i < layout.replicas; ++i) copies_.push_back(model.replicate());
  threads_.emplace_back([this, &model] { loop(model); });
  for (int i = 1; i < layout.replicas; ++i)
    threads_.emplace_back([this, runner = shared ? &model : copies_[size_t(i - 1)].get()] { loop(*runner); });
}

ForwardPool::~ForwardPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    jobs_.clear();
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ForwardPool::loop(ModelRunner& runner) {
  // The model's device current on this thread, and this thread's OpenMP team sized now: oneDNN's first
  // convolution would otherwise size it from OMP_NUM_THREADS or the CPU count, not from --threads.
  c10::OptionalDeviceGuard device_guard;
  c10::OptionalStreamGuard stream_guard;
  if (!runner.device().is_cpu()) {
    device_guard.reset_device(runner.device());
    // A stream of its own: another thread's batches are not queued behind this one's copies and waits.
    const c10::impl::VirtualGuardImpl device(runner.device().type());
    stream_guard.reset_stream(device.getStreamFromGlobalPool(runner.device()));
  }
  {
    static std::mutex init_mutex;  // init_num_threads also resets process-wide caches
    std::lock_guard<std::mutex> lock(init_mutex);
    at::init_num_threads();
    // The layout's count, whatever the last at::set_num_threads said (a job may time several layouts).
    if (runner.device().is_cpu() && threads_each_ > 0) at::set_num_threads(threads_each_);
  }
  for (;;) {
    std::function<void(ModelRunner&)> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job(runner);  // a packaged task: its exception goes to its future
  }
}

}  // namespace tiler
