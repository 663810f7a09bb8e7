#include "tiler/core/json_document.hpp"

#include <gtest/gtest.h>

#include <string>

namespace tiler {
namespace {

std::string nested(int depth) {
  return std::string(size_t(depth), '[') + std::string(size_t(depth), ']');
}

TEST(JsonDocument, ParsesWhatIsWithinTheDepthLimit) {
  std::string error;
  const auto doc = parseJsonDocument(nested(kMaxJsonDepth), error);
  ASSERT_TRUE(doc.has_value()) << error;
  EXPECT_TRUE(doc->is_array());
}

TEST(JsonDocument, RefusesDeepNestingWithoutCrashing) {
  for (const std::string& text :
       {nested(kMaxJsonDepth + 1), nested(200000), std::string(100000, '[') /* never closed */,
        "{\"a\":" + nested(100000) + "}"}) {
    std::string error;
    EXPECT_FALSE(parseJsonDocument(text, error).has_value());
    EXPECT_NE(error.find("nested deeper than " + std::to_string(kMaxJsonDepth)), std::string::npos) << error;
  }
}

TEST(JsonDocument, SaysWhatIsWrongWithText) {
  std::string error;
  EXPECT_FALSE(parseJsonDocument("{\"x\": NaN}", error).has_value());
  EXPECT_NE(error.find("parse error"), std::string::npos) << error;
}

TEST(JsonDocument, DropsTheObjectsKeepTurnsDown) {
  std::string error;
  int asked = 0;
  const auto doc = parseJsonDocument(
      R"({"features": [{"kind": "detection", "big": [1, 2, 3]}, {"kind": "annotation"}, {"kind": "cell"}]})",
      error, [&](int depth, const nlohmann::json& object) {
        ++asked;
        return depth != 2 || object.value("kind", "") == "annotation";
      });
  ASSERT_TRUE(doc.has_value()) << error;
  ASSERT_EQ((*doc)["features"].size(), 1u) << doc->dump();
  EXPECT_EQ((*doc)["features"][0]["kind"], "annotation");
  EXPECT_EQ(asked, 4);
}

}  // namespace
}  // namespace tiler
