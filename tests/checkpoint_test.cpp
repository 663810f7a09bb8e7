// checkpoint: an epoch's checkpoint replaces the one before, loads into a model of the same shapes with its
// optimizer and state, and is refused for another seed; the model file records its trained settings.
#include "tiler/finetune/checkpoint.hpp"

#include <gtest/gtest.h>
#include <torch/optim.h>
#include <torch/script.h>

#include <filesystem>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// A module of one parameter `w`, as TorchScript holds a trained model's.
torch::jit::Module moduleHolding(const torch::Tensor& w) {
  torch::jit::Module m("Net");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", w.clone().set_requires_grad(true), false);
  return m;
}

std::vector<torch::Tensor> parametersOfModule(torch::jit::Module& m) {
  std::vector<torch::Tensor> params;
  for (const auto& p : m.parameters()) params.push_back(p);
  return params;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratchDir(std::string("checkpoint_") +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    settings_.window = "32,16";
    settings_.classes = "bg,fg";
    settings_.mpp = 0.5;
  }
  std::string dir_;
  TrainedSettings settings_;
};

TEST_F(CheckpointTest, TheLastEpochIsKeptAndLoadsIntoAModelOfTheSameShapes) {
  auto model = moduleHolding(torch::tensor({1.0f, 2.0f}));
  auto params = parametersOfModule(model);
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  params[0].mutable_grad() = torch::ones_like(params[0]);
  optimizer.step();  // momentum buffers to save: w is now (0.9, 1.9)
  const Checkpoints checkpoints(dir_, 7, settings_);
  TrainingState state;
  state.scaler.scale = 128;
  state.step = 3;
  state.total_steps = 10;
  state.history = nlohmann::json::array({{{"epoch", 1}}});
  std::vector<std::string> hooked;
  checkpoints.save(1, model, optimizer, state, [&](const std::string& dir) { hooked.push_back(dir); });
  EXPECT_EQ(hooked, (std::vector<std::string>{checkpoints.epochDir(1) + ".partial"}));
  state.step = 6;
  checkpoints.save(2, model, optimizer, state, nullptr);
  EXPECT_EQ(checkpoints.latest(), 2);
  EXPECT_FALSE(fs::exists(checkpoints.epochDir(1)))
      << "the older checkpoint goes once the new one is current";

  auto other = moduleHolding(torch::zeros({2}));
  auto other_params = parametersOfModule(other);
  torch::optim::SGD other_optimizer(other_params, torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainingState loaded;
  checkpoints.load(2, other, other_params, other_optimizer, torch::kCPU, loaded);
  EXPECT_TRUE(other_params[0].allclose(torch::tensor({0.9f, 1.9f})));
  EXPECT_EQ(loaded.step, 6);
  EXPECT_EQ(loaded.scaler.scale, 128);
  EXPECT_EQ(loaded.history, state.history);
  // The same momentum: the next step of both optimizers gives the same weights.
  params[0].mutable_grad() = torch::ones_like(params[0]);
  other_params[0].mutable_grad() = torch::ones_like(other_params[0]);
  optimizer.step();
  other_optimizer.step();
  EXPECT_TRUE(other_params[0].equal(params[0]));

  const auto settings = readTrainedSettings(checkpoints.epochDir(2) + "/model.pt");
  ASSERT_TRUE(settings.has_value());
  EXPECT_EQ(settings->window, "32,16");
  EXPECT_EQ(settings->classes, "bg,fg");
  EXPECT_EQ(settings->mpp, 0.5);

  const Checkpoints another_seed(dir_, 8, settings_);
  EXPECT_THROW(another_seed.load(2, other, other_params, other_optimizer, torch::kCPU, loaded), ConfigError);
  auto larger = moduleHolding(torch::zeros({3}));
  auto larger_params = parametersOfModule(larger);
  torch::optim::SGD larger_optimizer(larger_params, torch::optim::SGDOptions(0.1));
  EXPECT_THROW(checkpoints.load(2, larger, larger_params, larger_optimizer, torch::kCPU, loaded), ModelError);
}

}  // namespace
}  // namespace tiler
