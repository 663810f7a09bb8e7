// finetune/losses: training's losses as objects, one a --loss (ce, bce, mse, dice), and what a loss says of
// the model's classes: how many the metrics count and which each pixel is predicted. Promise: a loss is the
// mean over the counted pixels (mask 1) of a batch, class weights included, so that K ranks' batches average
// to the step of one batch of them all; out [B,C,h,w] (a per-window model's [B,K] for ce), target [B,c,h,w],
// mask [B,h,w]. Stateless once made: the same on every rank and device.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>

#include "tiler/finetune/plan_types.hpp"

namespace tiler {

class Loss {
 public:
  virtual ~Loss() = default;
  virtual torch::Tensor operator()(const torch::Tensor& out, const torch::Tensor& target,
                                   const torch::Tensor& mask) const = 0;
  // The class of each pixel (or window) of `out`: argmax over its channels.
  virtual torch::Tensor predict(const torch::Tensor& out) const { return out.argmax(1); }
};

// The loss of `kind`; `class_weights` (float32 [K] on the model's device; undefined: none) weigh ce and dice.
std::unique_ptr<Loss> makeLoss(LossKind kind, const torch::Tensor& class_weights = {});

// The classes the metrics count for a model of `output_channels` trained by `kind`: bce's two (background,
// foreground), else its channels.
int64_t metricClasses(LossKind kind, int64_t output_channels);

// --class_weights auto from each class's labelled pixels `counts` (float64 [K]): inverse frequency,
// normalised so that balanced classes weigh 1 each; a class never labelled weighs 0. ConfigError when nothing
// is labelled.
torch::Tensor inverseFrequencyWeights(const torch::Tensor& counts);

}  // namespace tiler
