#include "tiler/finetune.hpp"

#include <gtest/gtest.h>

TEST(Finetune, Placeholder) {
  SUCCEED();
}
