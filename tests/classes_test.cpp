// Class names and colours: parsing --classes, the default names, the palette.
#include "tiler/io/classes.hpp"

#include <gtest/gtest.h>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

TEST(Classes, AnUnnamedClassHasOneDefaultName) {
  EXPECT_EQ(defaultClassName(0), "class_0");
  EXPECT_EQ(defaultClassName(12), "class_12");
}

TEST(Classes, ClassesAndPalette) {
  auto classes = parseClasses("background,tumour:#ff8000,stroma");
  ASSERT_EQ(classes.size(), 3u);
  EXPECT_EQ(classes[1].name, "tumour");
  EXPECT_EQ(classes[1].color, (std::array<uint8_t, 3>{255, 128, 0}));
  EXPECT_EQ(classes[0].color, (std::array<uint8_t, 3>{0, 0, 0})) << "class 0 black";
  EXPECT_THROW(parseClasses("a,b:#12"), ConfigError);
  EXPECT_THROW(parseClasses("a,,b"), ConfigError);
  // Names key the scores (CSV columns, GeoJSON measurements): no repeats, nothing that breaks a line.
  EXPECT_THROW(parseClasses("a,b,a"), ConfigError);
  EXPECT_THROW(parseClasses("a,b\nc"), ConfigError);
  EXPECT_THROW(parseClasses("a\tb"), ConfigError);
  EXPECT_THROW(parseClasses("caf\xe9"), ConfigError) << "Latin-1, not UTF-8";
  EXPECT_EQ(parseClasses("caf\xc3\xa9,\"quoted\"")[1].name, "\"quoted\"");
  EXPECT_FALSE(classes[0].colored);
  EXPECT_TRUE(classes[1].colored);
  auto palette = labelPalette(300, classes);
  ASSERT_EQ(palette.size(), 300u);
  EXPECT_EQ(palette[1], classes[1].color);
  EXPECT_NE(palette[3], palette[4]);
  EXPECT_EQ(palette[3], palette[23]) << "20 colours in turn";
}

}  // namespace
}  // namespace tiler
