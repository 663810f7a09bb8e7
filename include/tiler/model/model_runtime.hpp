// model_runtime: the kinds of model file tiler runs, behind one interface: TorchScript (torch.jit.save) and
// AOTInductor packages (.pt2: torch.export + aoti_compile_and_package; LibTorch 2.6 and later). Which kind a
// file is comes from its contents (a registry of probes, as for the image readers), never from its name.
// Promise: openModelRuntime() throws ModelError naming the file and the problem (missing, a directory,
// corrupt, not a model, a package for another device, a package this LibTorch cannot run, a package without
// the shapes tiler must know before running it and that running it in a child process did not find). A
// runtime runs one contiguous float32 NCHW tensor on its device and returns the model's output as the model
// gave it (a package: its outputs as a tensor, a dict by name where its call spec names them, else a tuple).
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Declared only: a unit that loads or walks a TorchScript module includes <torch/script.h> itself (its parse
// costs every unit that includes it more than <torch/types.h>'s, and a unit's code generation grows with it).
namespace c10 {
struct IValue;
}
namespace torch::jit {
struct Module;
}

namespace tiler {

struct RuntimeOptions {
  std::string path;
  torch::Device device = torch::kCPU;
  bool jit_optimize = false;  // TorchScript: freeze + optimize_for_inference
  // jit_optimize is the default, not asked for: a package ignores it, and a module that freezing refuses runs
  // as loaded (ModelRuntime::notOptimized says why); the loaded module is kept until dropUnoptimized().
  bool jit_optimize_default = false;
  int64_t batch = 1;      // the most windows one forward runs (a package without shapes is probed at it)
  bool in_probe = false;  // in probeShapesInChild's child: run what it is given, learn nothing
  // The sha256 a model card states of the file (weights.torchscript.sha256, lowercase hex; empty: none) and
  // that card: a mismatch is a ConfigError naming the file and both digests. TorchScript is hashed on the
  // bytes it is loaded from, read once.
  std::string sha256, sha256_card;
};

class ModelRuntime {
 public:
  virtual ~ModelRuntime() = default;
  // "torchscript" or "pt2" (the report's `runtime`).
  virtual const char* name() const = 0;
  virtual c10::IValue run(const torch::Tensor& nchw) = 0;
  // Another runtime over the same model with parameters of its own, for another thread.
  virtual std::unique_ptr<ModelRuntime> replicate() const = 0;
  // Whether --precision fp16/bf16 can run it under autocast; a compiled package runs as it was compiled.
  virtual bool autocasts() const = 0;
  // The TorchScript module (training, checkpoints); null for compiled code.
  virtual torch::jit::Module* module() { return nullptr; }
  // The input channels, where the file says (else probe() tries counts until one runs).
  virtual std::optional<int> inputChannels() const { return std::nullopt; }
  // Why a window of w x h must not be run (a package compiled for another size does not check its inputs:
  // garbage or a crash), or empty. A package that does not say what it was compiled for learns it here.
  virtual std::string refusesWindow(int64_t /*w*/, int64_t /*h*/) { return {}; }
  // Frozen + optimize_for_inference (RuntimeOptions::jit_optimize); where it was the default and was not
  // done, why (freezing refused the module); empty otherwise.
  virtual bool optimized() const { return false; }
  virtual std::string notOptimized() const { return {}; }
  // With RuntimeOptions::jit_optimize_default: the module as loaded, run beside the optimised one to check
  // it, then either dropped (dropUnoptimized) or kept in its place (useUnoptimized).
  virtual c10::IValue runUnoptimized(const torch::Tensor& nchw);
  virtual void dropUnoptimized() {}
  virtual void useUnoptimized() {}
};

// What running a model at one window size in a child process found, for a package that does not say what it
// was compiled for: a shape it was not compiled for may crash the process that runs it (or read past its
// input), so that process is never the job's. The child tries 1 to 16 input channels, fewest first, each at
// batch 1 and at `options.batch`; on the CPU its input ends at a page it may not read, so a package that
// reads more than it is given crashes there rather than running on what lies beyond, and its own input
// checks are on (AOTI_RUNTIME_CHECK_INPUTS, where it was compiled with them). A run passes when it returns
// outputs of the batch it was given.
struct ShapeProbe {
  int channels = 0;         // the fewest that ran at some batch; 0: none did
  bool batch_one = false;   // ran at batch 1
  bool batch_full = false;  // ran at options.batch
  // One line, when channels is 0: why nothing ran ("it does not run [1, 3, h, w] (why), nor ...", "it
  // does not check the shape of its input ...", "loading it crashed (...)").
  std::string refusal;
};
ShapeProbe probeShapesInChild(const RuntimeOptions& options, int64_t w, int64_t h);

// The runtime for `options.path`, by what the file holds.
std::unique_ptr<ModelRuntime> openModelRuntime(const RuntimeOptions& options);
// Whether this build runs .pt2 packages, and if not, why (for --version and the error).
bool pt2Supported();
const char* pt2Unsupported();

// Loads a TorchScript module with tiler's error messages (infer, finetune and its checkpoints). A zip
// member's bytes (ARCHIVE!/MEMBER), or a file a card states the `sha256` of, are read once and held once:
// hashed (a mismatch: requireSha256's ConfigError naming `sha256_card`) and loaded from where they are held.
torch::jit::Module loadTorchScript(const std::string& path, const torch::Device& device,
                                   const std::string& sha256 = "", const std::string& sha256_card = "");

// The runtimes, one file each (the registry in model_runtime.cpp lists them).
std::unique_ptr<ModelRuntime> openTorchScriptRuntime(const RuntimeOptions& options);
std::unique_ptr<ModelRuntime> openPt2Runtime(const RuntimeOptions& options);
// The names of an AOTInductor package's outputs, from the out_spec of its call spec (torch.utils._pytree's
// TreeSpec JSON, protocol 1: [1, {"type": ..., "context": ..., "children_spec": [...]}]): the keys, in the
// spec's order, of a dict (or OrderedDict) whose entries are all leaves (tensors) with string keys. Empty for
// anything else (one tensor, a tuple or list, a nested or unknown spec, an empty or malformed string): the
// package's outputs are then picked by index only.
std::vector<std::string> outputNamesOfSpec(const std::string& out_spec);
// Whether a file is an AOTInductor package: a zip whose `archive_format` entry says "pt2".
bool isPt2Package(const std::string& path);
// Whether a zip entry's `name` ends with `suffix` (a package's entries sit under folders of its own naming).
inline bool nameEndsWith(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// The first entry of a zip, by its central directory (any writer: sizes after the data, zip64), whose name
// `matches`: its bytes if stored and at most `max_bytes`, empty if compressed or larger; nullopt if there is
// none or the file is not a zip.
std::optional<std::string> findZipEntry(const std::string& path,
                                        const std::function<bool(const std::string&)>& matches,
                                        size_t max_bytes);

}  // namespace tiler
