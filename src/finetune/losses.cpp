#include "tiler/finetune/losses.hpp"

#include <torch/nn/functional.h>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

namespace F = torch::nn::functional;

constexpr int64_t kIgnore = -100;  // cross-entropy's ignore index (PyTorch's default) for uncounted pixels

torch::Tensor countedPixels(const torch::Tensor& mask) {
  return mask.sum().clamp_min(1.0);
}

class CrossEntropy final : public Loss {
 public:
  explicit CrossEntropy(torch::Tensor class_weights) : class_weights_(std::move(class_weights)) {}
  torch::Tensor operator()(const torch::Tensor& out, const torch::Tensor& target,
                           const torch::Tensor& mask) const override {
    // A map's pixels, or a [B,K] model's windows (its target and mask [B,1,1,1] and [B,1,1]).
    const bool windows = out.dim() == 2;
    const auto m = windows ? mask.reshape({-1}) : mask;
    // Uncounted pixels take the ignore index: one fused loss kernel, no per-pixel tensor to weigh and mask.
    const auto truth =
        (windows ? target.reshape({-1}) : target.squeeze(1)).to(torch::kLong).masked_fill(m == 0, kIgnore);
    auto options = F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnore);
    // Each counted pixel's loss times its class's weight (a sum: PyTorch divides by the weights only for a
    // mean), over the counted pixels: not PyTorch's division by the batch's weight sum, which differs between
    // ranks' batches, so that K ranks' batches still average to the step of one batch of them all.
    if (class_weights_.defined()) options.weight(class_weights_);
    return F::cross_entropy(out, truth, options) / countedPixels(mask);
  }

 private:
  torch::Tensor class_weights_;
};

// A binary model's logits: its one channel, or foreground's over background's of two.
torch::Tensor binaryLogits(const torch::Tensor& out) {
  return out.size(1) == 1 ? out.squeeze(1) : out.select(1, 1) - out.select(1, 0);
}

class BinaryCrossEntropy final : public Loss {
 public:
  torch::Tensor operator()(const torch::Tensor& out, const torch::Tensor& target,
                           const torch::Tensor& mask) const override {
    auto per_px = F::binary_cross_entropy_with_logits(
        binaryLogits(out), target.squeeze(1),
        F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
    return (per_px * mask).sum() / countedPixels(mask);
  }
  torch::Tensor predict(const torch::Tensor& out) const override {
    return (binaryLogits(out) > 0).to(torch::kLong);
  }
};

class MeanSquaredError final : public Loss {
 public:
  torch::Tensor operator()(const torch::Tensor& out, const torch::Tensor& target,
                           const torch::Tensor& mask) const override {
    auto per_px = (out - target).pow(2).mean(1);
    return (per_px * mask).sum() / countedPixels(mask);
  }
};

class SoftDice final : public Loss {
 public:
  explicit SoftDice(torch::Tensor class_weights) : class_weights_(std::move(class_weights)) {}
  torch::Tensor operator()(const torch::Tensor& out, const torch::Tensor& target,
                           const torch::Tensor& mask) const override {
    auto probs = torch::softmax(out, 1) * mask.unsqueeze(1);
    auto onehot =
        F::one_hot(target.squeeze(1).to(torch::kLong), out.size(1)).permute({0, 3, 1, 2}).to(out.dtype()) *
        mask.unsqueeze(1);
    auto inter = (probs * onehot).sum({0, 2, 3});
    auto total = probs.sum({0, 2, 3}) + onehot.sum({0, 2, 3});
    auto dice = (2.0 * inter + 1.0) / (total + 1.0);
    if (!class_weights_.defined()) return 1.0 - dice.mean();
    return 1.0 - (dice * class_weights_).sum() / class_weights_.sum().clamp_min(1e-12);
  }

 private:
  torch::Tensor class_weights_;
};

}  // namespace

std::unique_ptr<Loss> makeLoss(LossKind kind, const torch::Tensor& class_weights) {
  switch (kind) {
    case LossKind::kCe:
      return std::make_unique<CrossEntropy>(class_weights);
    case LossKind::kBce:
      return std::make_unique<BinaryCrossEntropy>();
    case LossKind::kMse:
      return std::make_unique<MeanSquaredError>();
    case LossKind::kDice:
      return std::make_unique<SoftDice>(class_weights);
  }
  TILER_THROW(ConfigError, "no such loss");
}

int64_t metricClasses(LossKind kind, int64_t output_channels) {
  return kind == LossKind::kBce ? 2 : output_channels;
}

torch::Tensor inverseFrequencyWeights(const torch::Tensor& counts) {
  const int64_t K = counts.numel();
  const double total = counts.sum().item<double>();
  TILER_CHECK(total > 0, ConfigError, "--class_weights auto: the training windows hold no labelled pixel");
  return torch::where(counts > 0, total / (double(K) * counts), torch::zeros_like(counts));
}

}  // namespace tiler
