// The TorchScript runtime: torch::jit::load, the forward's schema checked, optionally frozen and optimised.
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/script.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/zip_archive.hpp"
#include "tiler/model/model_runtime.hpp"

namespace tiler {

namespace {

// Bytes held once, read by the loader where they lie (an istringstream of them would copy them all).
class HeldBytes final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit HeldBytes(std::string bytes) : bytes_(std::move(bytes)) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, size_t(bytes_.size() - pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::string bytes_;
};

}  // namespace

torch::jit::Module loadTorchScript(const std::string& path, const torch::Device& device,
                                   const std::string& sha256, const std::string& sha256_card) {
  const std::string not_a_file = notARegularFile(path);
  // A zipped bioimage.io package's weights (ARCHIVE!/MEMBER) load from the member's bytes, never extracted.
  const auto member = not_a_file.empty() ? std::nullopt : splitZipMemberPath(path);
  TILER_CHECK(not_a_file.empty() || member, ModelError,
              "'" << path << "': " << (not_a_file == "not found" ? "model file not found" : not_a_file)
                  << "; -m takes a model file (.pt from torch.jit.save, or a .pt2 package)");
  // The bytes hashed are the bytes loaded: a file a card states the digest of is read once, as a member is.
  std::shared_ptr<HeldBytes> held;
  if (member || !sha256.empty()) {
    std::string bytes = readFileOrZipMember(path, kMaxZipWeightsBytes);
    if (!sha256.empty()) requireSha256(path, sha256Hex(bytes), sha256, "weights.torchscript", sha256_card);
    held = std::make_shared<HeldBytes>(std::move(bytes));
  }
  try {
    if (held) return torch::jit::load(std::move(held), device);
    return torch::jit::load(path, device);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    if (what.find("constants.pkl") != std::string::npos || what.find("code/") != std::string::npos) {
      TILER_THROW(ModelError,
                  "'" << path << "' is not a TorchScript file (it looks like a torch.save() of a "
                      << "state_dict or a whole model); export it with torch.jit.script(model).save() "
                      << "or torch.jit.trace(model, example).save(), or as a .pt2 package "
                      << "(scripts/export_model.py)");
    }
    TILER_THROW(ModelError, "'" << path << "' is not a TorchScript file or is corrupt: " << firstLine(what));
  } catch (const std::exception& e) {
    TILER_THROW(ModelError, "'" << path << "' cannot be loaded: " << firstLine(e.what()));
  }
}

namespace {

class TorchScriptRuntime final : public ModelRuntime {
 public:
  explicit TorchScriptRuntime(torch::jit::Module module, bool optimized = false,
                              std::optional<torch::jit::Module> unoptimized = std::nullopt,
                              std::string not_optimized = "")
      : module_(std::move(module)),
        optimized_(optimized),
        unoptimized_(std::move(unoptimized)),
        not_optimized_(std::move(not_optimized)) {}

  const char* name() const override { return "torchscript"; }
  c10::IValue run(const torch::Tensor& nchw) override { return module_.forward({nchw}); }
  std::unique_ptr<ModelRuntime> replicate() const override {
    return std::make_unique<TorchScriptRuntime>(module_.clone(), optimized_);
  }
  bool autocasts() const override { return true; }
  torch::jit::Module* module() override { return &module_; }
  bool optimized() const override { return optimized_; }
  std::string notOptimized() const override { return not_optimized_; }
  c10::IValue runUnoptimized(const torch::Tensor& nchw) override {
    return unoptimized_ ? unoptimized_->forward({nchw}) : run(nchw);
  }
  void dropUnoptimized() override { unoptimized_.reset(); }
  void useUnoptimized() override {
    if (!unoptimized_) return;
    module_ = std::move(*unoptimized_);
    unoptimized_.reset();
    optimized_ = false;
  }

 private:
  torch::jit::Module module_;
  bool optimized_ = false;
  std::optional<torch::jit::Module> unoptimized_;
  std::string not_optimized_;
};

}  // namespace

std::unique_ptr<ModelRuntime> openTorchScriptRuntime(const RuntimeOptions& options) {
  const std::string& path = options.path;
  torch::jit::Module module = loadTorchScript(path, options.device, options.sha256, options.sha256_card);
  module.eval();
  auto forward = module.find_method("forward");
  TILER_CHECK(forward.has_value(), ModelError,
              "'" << path << "' is not a TorchScript model: it has no forward() (saved tensors or a "
                  << "state_dict?); export the model with torch.jit.script(model).save()");
  const auto& args = forward->function().getSchema().arguments();
  // args[0] is self.
  TILER_CHECK(args.size() == 2, ModelError,
              "'" << path << "': forward() takes " << args.size() - 1
                  << " inputs; tiler passes exactly one tensor (NCHW)");
  TILER_CHECK(args[1].type()->kind() == c10::TypeKind::TensorType, ModelError,
              "'" << path << "': forward() takes a " << args[1].type()->str() << ", not a Tensor");
  if (!options.jit_optimize) return std::make_unique<TorchScriptRuntime>(std::move(module));
  if (!options.jit_optimize_default)
    return std::make_unique<TorchScriptRuntime>(torch::jit::optimize_for_inference(module), true);
  // Freezing copies the module: the one as loaded stays as it was, to check the copy against.
  try {
    torch::jit::Module optimized = torch::jit::optimize_for_inference(module);
    return std::make_unique<TorchScriptRuntime>(std::move(optimized), true, std::move(module));
  } catch (const std::exception& e) {
    return std::make_unique<TorchScriptRuntime>(std::move(module), false, std::nullopt,
                                                "freezing refused the module: " + firstLine(e.what()));
  }
}

}  // namespace tiler
