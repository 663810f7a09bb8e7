#include "tiler/core/grid.hpp"

#include <gtest/gtest.h>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

using V = std::vector<int64_t>;

TEST(Grid, MonaiExample110Window64Overlap05) {
  EXPECT_EQ(axisStarts(110, 64, 0.5), (V{0, 32, 46}));
}

TEST(Grid, NoOverlapPullsTheLastWindowBack) {
  EXPECT_EQ(axisStarts(100, 30, 0.0), (V{0, 30, 60, 70}));
  EXPECT_EQ(axisStarts(90, 30, 0.0), (V{0, 30, 60}));
}

TEST(Grid, WindowEqualToImageIsOneWindow) {
  EXPECT_EQ(axisInterval(64, 64, 0.5), 64);
  EXPECT_EQ(axisStarts(64, 64, 0.5), (V{0}));
}

TEST(Grid, IntervalTruncatesInDoubleLikeMonai) {
  // 20 * (1 - 0.9) = 1.9999999999999996 in double: int() gives 1, not 2.
  EXPECT_EQ(axisInterval(100, 20, 0.9), 1);
  EXPECT_EQ(axisStarts(100, 20, 0.9).size(), 81u);
  EXPECT_EQ(axisInterval(1000, 256, 0.25), 192);
  EXPECT_EQ(axisInterval(1000, 3, 0.99), 1) << "at least 1";
}

TEST(Grid, SampleImageGrid) {
  WindowGrid g(4096, 4096, GridSpec{256, 256, 0.25, 0.25});
  EXPECT_EQ(g.count(), 21 * 21);
  EXPECT_EQ(g.startsX().back(), 4096 - 256);
  EXPECT_EQ(g.window(22), (Rect{192, 192, 256, 256}));
}

TEST(Grid, PerAxisWindowAndOverlap) {
  WindowGrid g(300, 200, GridSpec{100, 50, 0.5, 0.0});
  EXPECT_EQ(g.startsX(), (V{0, 50, 100, 150, 200}));
  EXPECT_EQ(g.startsY(), (V{0, 50, 100, 150}));
  EXPECT_EQ(g.count(), 20);
  EXPECT_EQ(g.window(6), (Rect{50, 50, 100, 50})) << "row-major";
}

TEST(Grid, SmallImageIsPaddedSymmetrically) {
  WindowGrid g(200, 151, GridSpec{256, 256, 0.25, 0.25});
  EXPECT_EQ(g.paddedWidth(), 256);
  EXPECT_EQ(g.paddedHeight(), 256);
  EXPECT_EQ(g.padLeft(), 28);
  EXPECT_EQ(g.padTop(), 52);  // (256 - 151) / 2
  EXPECT_EQ(g.count(), 1);
  EXPECT_EQ(g.imageWindow(0), (Rect{-28, -52, 256, 256}));
}

// TRIDENT's and CLAM's patch lattice: starts at whole strides, the last window past the edge, no padding
// before the image; a coordinate divided by the stride names a cell of its own (255/256/257 px axes).
TEST(Grid, LatticeStartsAtWholeStridesAndReachesPastTheEdge) {
  EXPECT_EQ(latticeStarts(255, 256, 0.0), (V{0}));
  EXPECT_EQ(latticeStarts(256, 256, 0.0), (V{0}));
  EXPECT_EQ(latticeStarts(257, 256, 0.0), (V{0, 256}));
  EXPECT_EQ(latticeStarts(300, 224, 0.5), (V{0, 112, 224}));
  EXPECT_EQ(latticeStarts(1, 224, 0.0), (V{0}));
  WindowGrid g(600, 257, GridSpec{256, 256, 0.0, 0.0, /*lattice=*/true});
  EXPECT_EQ(g.startsX(), (V{0, 256, 512}));
  EXPECT_EQ(g.startsY(), (V{0, 256}));
  EXPECT_EQ(g.padLeft(), 0);
  EXPECT_EQ(g.padTop(), 0);
  EXPECT_EQ(g.paddedWidth(), 768);
  EXPECT_EQ(g.paddedHeight(), 512);
  EXPECT_EQ(g.imageWindow(5), (Rect{512, 256, 256, 256})) << "past both edges, padded there";
  for (int64_t i = 0; i < g.count(); ++i) {
    const Rect r = g.imageWindow(i);
    EXPECT_EQ(r.x % 256, 0);
    EXPECT_EQ(r.y % 256, 0);
  }
  const WindowGrid small(100, 80, GridSpec{256, 256, 0.0, 0.0, true});
  EXPECT_EQ(small.imageWindow(0), (Rect{0, 0, 256, 256})) << "padded after the image, not around it";
  EXPECT_THROW(WindowGrid(100, 100, GridSpec{64, 64, 0.0, 0.0, true}, Scale{1, 2}), ConfigError);
}

TEST(Grid, OneAxisPaddedOnly) {
  WindowGrid g(1000, 100, GridSpec{256, 256, 0.25, 0.25});
  EXPECT_EQ(g.paddedWidth(), 1000);
  EXPECT_EQ(g.padLeft(), 0);
  EXPECT_EQ(g.paddedHeight(), 256);
  EXPECT_EQ(g.startsY(), (V{0}));
}

TEST(Grid, DownscalingModelGetsWindowsOnWholeOutputPixels) {
  WindowGrid g(110, 110, GridSpec{64, 64, 0.5, 0.5}, Scale{1, 2});
  for (auto s : g.startsX()) EXPECT_EQ(s % 2, 0) << s;
  EXPECT_GE(g.startsX().back() + 64, 110);
  EXPECT_THROW(WindowGrid(100, 100, GridSpec{63, 63, 0.5, 0.5}, Scale{1, 2}), ConfigError);
}

// The overlap a halo needs: the least fraction whose neighbouring windows share the pixels asked for, at the
// output's resolution, for same-size, upscaled and downscaled outputs.
TEST(Grid, OverlapForAHalo) {
  EXPECT_EQ(overlapPixels(64, 0.25, {}), 16);
  EXPECT_EQ(overlapPixels(64, 0.25, {2, 1}), 32);
  EXPECT_EQ(overlapPixels(64, 0.25, {1, 2}), 8);
  for (Scale s : {Scale{}, Scale{2, 1}, Scale{1, 2}, Scale{1, 4}})
    for (int64_t window : {64, 100, 256})
      for (int64_t pixels : {1, 7, 24, 33}) {
        if (pixels >= s.apply(window)) continue;
        const double f = overlapFor(window, pixels, s);
        ASSERT_LT(f, 1.0);
        EXPECT_GE(overlapPixels(window, f, s), pixels) << window << " " << pixels << " " << s.value();
        EXPECT_LE(overlapPixels(window, f, s), pixels + 2 * s.num) << "a pixel of the grid past it at most";
      }
  EXPECT_EQ(overlapFor(64, 64, {}), 1.0) << "the whole window: no overlap can";
}

TEST(Grid, ParseWindowSize) {
  EXPECT_EQ(parseWindowSize("256"), (std::pair<int64_t, int64_t>{256, 256}));
  EXPECT_EQ(parseWindowSize("512,128"), (std::pair<int64_t, int64_t>{512, 128}));
  EXPECT_EQ(parseWindowSize("64x32"), (std::pair<int64_t, int64_t>{64, 32}));
  for (const char* bad : {"", "0", "-3", "12,", "a", "3,4,5", "256px"})
    EXPECT_THROW(parseWindowSize(bad), ConfigError) << bad;
}

TEST(Grid, RejectsBadOverlapAndEmptyImages) {
  EXPECT_THROW(axisStarts(100, 10, 1.0), ConfigError);
  EXPECT_THROW(axisStarts(100, 10, -0.1), ConfigError);
  EXPECT_THROW(WindowGrid(0, 10, GridSpec{}), ConfigError);
}

}  // namespace
}  // namespace tiler
