// validation: which epoch --save_best keeps.
#include "tiler/finetune/validation.hpp"

#include <gtest/gtest.h>

namespace tiler {
namespace {

TEST(Validation, TheBestEpochHasTheHighestMeanDiceTheFirstOfEquals) {
  const nlohmann::json history = {{{"epoch", 1}, {"val_dice", 0.5}},
                                  {{"epoch", 2}, {"val_dice", 0.7}},
                                  {{"epoch", 3}},
                                  {{"epoch", 4}, {"val_dice", 0.7}}};
  EXPECT_EQ(bestEpoch(history), 2);
  EXPECT_EQ(bestEpoch(nlohmann::json::array({{{"epoch", 1}, {"train_loss", 1.0}}})), 0) << "none validated";
}

}  // namespace
}  // namespace tiler
