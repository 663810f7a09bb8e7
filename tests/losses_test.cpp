// losses: each loss against a value computed by hand, on tensors small enough to check on paper.
#include "tiler/finetune/losses.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

double lossValue(LossKind kind, const torch::Tensor& out, const torch::Tensor& target,
                 const torch::Tensor& mask, const torch::Tensor& weights = {}) {
  return (*makeLoss(kind, weights))(out, target, mask).item<double>();
}

// Two pixels of a two-class map: logits (0, 0) and (ln 3, 0), classes 0 and 1; the second one not counted.
struct TwoPixels {
  torch::Tensor out = torch::tensor({0.0f, float(std::log(3.0)), 0.0f, 0.0f}).reshape({1, 2, 1, 2});
  torch::Tensor target = torch::tensor({0.0f, 1.0f}).reshape({1, 1, 1, 2});
  torch::Tensor mask = torch::tensor({1.0f, 0.0f}).reshape({1, 1, 2});
};

TEST(Losses, CrossEntropyIsTheMeanOverCountedPixelsWeightsIncluded) {
  const TwoPixels p;
  EXPECT_NEAR(lossValue(LossKind::kCe, p.out, p.target, p.mask), std::log(2.0), 1e-6);
  // Weighted: 2 ln 2 over the one counted pixel, not over the weights' sum as PyTorch's mean would.
  EXPECT_NEAR(lossValue(LossKind::kCe, p.out, p.target, p.mask, torch::tensor({2.0f, 1.0f})),
              2 * std::log(2.0), 1e-6);
  // A per-window model's [B,K] scores: windows 0 and 1, the second of class 1 at logits (ln 3, 0): ln 4.
  const auto windows = torch::tensor({0.0f, 0.0f, float(std::log(3.0)), 0.0f}).reshape({2, 2});
  EXPECT_NEAR(lossValue(LossKind::kCe, windows, torch::tensor({0.0f, 1.0f}).reshape({2, 1, 1, 1}),
                        torch::ones({2, 1, 1})),
              (std::log(2.0) + std::log(4.0)) / 2, 1e-6);
}

TEST(Losses, BinaryCrossEntropyMeanSquaredErrorAndDice) {
  const TwoPixels p;
  // Two channels: the foreground's logit minus the background's. The counted pixel's 0 against 0: ln 2; the
  // other's -ln 3 against 1: ln 4.
  EXPECT_NEAR(lossValue(LossKind::kBce, p.out, p.target, p.mask), std::log(2.0), 1e-6);
  EXPECT_NEAR(lossValue(LossKind::kBce, p.out, p.target, torch::ones({1, 1, 2})),
              (std::log(2.0) + std::log(4.0)) / 2, 1e-6);
  const auto one_channel = torch::tensor({-1.0f, 2.0f}).reshape({1, 1, 1, 2});
  EXPECT_TRUE(makeLoss(LossKind::kBce)->predict(one_channel).equal(torch::tensor({0, 1}).reshape({1, 1, 2})))
      << "foreground where the logit is positive";
  EXPECT_TRUE(makeLoss(LossKind::kCe)->predict(p.out).equal(torch::tensor({0, 0}).reshape({1, 1, 2})));
  // Squared error, the channels' mean: the counted pixel's (0-1)^2 and (0-0)^2.
  const auto values = torch::tensor({1.0f, 0.0f, 0.0f, 0.0f}).reshape({1, 2, 1, 2});
  EXPECT_NEAR(lossValue(LossKind::kMse, p.out, values, p.mask), 0.5, 1e-6);
  // Dice of one counted pixel at probabilities (1/2, 1/2), class 0: class 0 (2*0.5+1)/(1.5+1) = 0.8, class 1
  // (0+1)/(0.5+1) = 2/3; the loss 1 - their mean.
  EXPECT_NEAR(lossValue(LossKind::kDice, p.out, p.target, p.mask), 1 - (0.8 + 2.0 / 3.0) / 2, 1e-6);
  EXPECT_NEAR(lossValue(LossKind::kDice, p.out, p.target, p.mask, torch::tensor({1.0f, 0.0f})), 0.2, 1e-6);
}

TEST(Losses, MetricClassesAndInverseFrequencyWeights) {
  EXPECT_EQ(metricClasses(LossKind::kBce, 1), 2);
  EXPECT_EQ(metricClasses(LossKind::kCe, 5), 5);
  const auto w = inverseFrequencyWeights(torch::tensor({3.0, 1.0, 0.0}, torch::kDouble));
  EXPECT_NEAR(w[0].item<double>(), 4.0 / 9.0, 1e-12);
  EXPECT_NEAR(w[1].item<double>(), 4.0 / 3.0, 1e-12);
  EXPECT_EQ(w[2].item<double>(), 0.0) << "a class never labelled weighs nothing";
  EXPECT_THROW(inverseFrequencyWeights(torch::zeros({2}, torch::kDouble)), ConfigError);
}

}  // namespace
}  // namespace tiler
