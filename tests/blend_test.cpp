#include "tiler/writers/blend.hpp"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

namespace tiler {
namespace {

// The image as CHW float, and each window's prediction cut from it (an identity "model").
struct Synthetic {
  int64_t w, h;
  int c;
  std::vector<float> chw;
  float at(int ch, int64_t y, int64_t x) const { return chw[size_t((ch * h + y) * w + x)]; }
};

Synthetic makeImage(int64_t w, int64_t h, int c, uint64_t seed) {
  Synthetic s{w, h, c, std::vector<float>(size_t(w * h * c))};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  for (auto& v : s.chw) v = u(rng);
  return s;
}

// Prediction of window i: the image's pixels (padding 0), upsampled by `up` or subsampled by `down`.
std::vector<float> identityPrediction(const Synthetic& img, const WindowGrid& g, int64_t i) {
  const Scale s = g.scale();
  const Rect r = g.imageWindow(i);
  const int64_t ow = s.apply(r.w), oh = s.apply(r.h);
  std::vector<float> p(size_t(img.c * ow * oh), 0.0f);
  for (int c = 0; c < img.c; ++c)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t iy = r.y + y * s.den / s.num, ix = r.x + x * s.den / s.num;
        if (iy >= 0 && ix >= 0 && iy < img.h && ix < img.w)
          p[size_t((c * oh + y) * ow + x)] = img.at(c, iy, ix);
      }
  return p;
}

// Stitches in the given order (only `order`'s windows, when `expect` lists them); returns the output as HWC
// rows.
// Every window's identity prediction with a little noise of its own: windows disagree, as real predictions
// do.
std::vector<std::vector<float>> disagreeingPredictions(const Synthetic& img, const WindowGrid& g,
                                                       std::mt19937& rng) {
  std::vector<std::vector<float>> preds;
  for (int64_t i = 0; i < g.count(); ++i) {
    auto p = identityPrediction(img, g, i);
    for (auto& v : p) v += float(rng() % 1000) * 1e-4f;
    preds.push_back(p);
  }
  return preds;
}

// `step` > 0: the windows go in through addMany, `step` at a time (as a step's windows of an image do).
cv::Mat stitch(const WindowGrid& g, int c, StitchOptions o, const std::vector<std::vector<float>>& preds,
               const std::vector<int64_t>& order, const std::vector<int64_t>& expect = {}, size_t step = 0) {
  cv::Mat out(int(std::max<int64_t>(1, g.scale().apply(g.imageHeight()))),
              int(std::max<int64_t>(1, g.scale().apply(g.imageWidth()))), CV_MAKETYPE(CV_32F, c));
  int64_t next_row = 0;
  Stitcher st(
      g, c, o,
      [&](const cv::Mat& band, int64_t first) {
        EXPECT_EQ(first, next_row) << "bands arrive top to bottom, without gaps";
        EXPECT_LE(band.rows, g.scale().apply(g.windowHeight())) << "bands of at most a window's height";
        band.copyTo(out.rowRange(int(first), int(first + band.rows)));
        next_row = first + band.rows;
      },
      expect.empty() ? std::nullopt : std::optional<std::vector<int64_t>>(expect));
  if (step == 0) {
    for (int64_t i : order) st.add(i, preds[size_t(i)].data());
  } else {
    for (size_t first = 0; first < order.size(); first += step) {
      std::vector<std::pair<int64_t, const float*>> windows;
      for (size_t k = first; k < std::min(order.size(), first + step); ++k)
        windows.emplace_back(order[k], preds[size_t(order[k])].data());
      st.addMany(windows);
    }
  }
  EXPECT_TRUE(st.done());
  EXPECT_EQ(next_row, out.rows);
  return out;
}

TEST(Importance, GaussianEqualsTheFormula) {
  const int64_t w = 7, h = 4;
  const double ss = 0.125;
  auto map = gaussianImportance(w, h, ss);
  std::vector<double> raw;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      auto g = [&](int64_t i, int64_t n) {
        double t = double(i) - double(n - 1) / 2.0, sigma = ss * double(n);
        return std::exp(-t * t / (2 * sigma * sigma));
      };
      raw.push_back(g(y, h) * g(x, w));
    }
  const float lowest = float(*std::min_element(raw.begin(), raw.end()));
  for (size_t i = 0; i < raw.size(); ++i)
    EXPECT_EQ(map[i], std::max(float(raw[i]), std::max(lowest, 1e-3f))) << i;
  EXPECT_FLOAT_EQ(*std::max_element(map.begin(), map.end()), float(raw[size_t(1 * w + 3)]));
  auto big = gaussianImportance(256, 256, 0.125);
  EXPECT_FLOAT_EQ(*std::min_element(big.begin(), big.end()), 1e-3f) << "corners clamp at 1e-3";
  EXPECT_THROW(gaussianImportance(4, 4, 0.0), ConfigError);
}

TEST(Importance, CropCoresSplitOverlapsAtTheMiddle) {
  EXPECT_EQ(cropCores({0, 32, 46}, 64, 110), (std::vector<int64_t>{0, 48, 71, 110}));
  EXPECT_EQ(cropCores({0}, 64, 64), (std::vector<int64_t>{0, 64}));
}

class IdentityBlend : public ::testing::TestWithParam<BlendMode> {};

TEST_P(IdentityBlend, IdentityPredictionsReproduceTheInput) {
  const BlendMode mode = GetParam();
  for (auto [w, h, win, ov] : std::vector<std::tuple<int, int, int, double>>{
           {300, 200, 64, 0.25}, {110, 110, 64, 0.5}, {50, 40, 64, 0.25}, {257, 129, 128, 0.0}}) {
    const Synthetic img = makeImage(w, h, 2, 1);
    WindowGrid g(w, h, GridSpec{win, win, ov, ov});
    std::vector<std::vector<float>> preds;
    for (int64_t i = 0; i < g.count(); ++i) preds.push_back(identityPrediction(img, g, i));
    cv::Mat out = stitch(g, 2, StitchOptions{mode, 0.125}, preds, test::inOrder(g.count()));
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int c = 0; c < 2; ++c) {
          float got = out.ptr<float>(int(y))[x * 2 + c], want = img.at(c, y, x);
          if (mode == BlendMode::kCrop)
            ASSERT_EQ(got, want) << x << "," << y;
          else
            ASSERT_NEAR(got, want, 1e-6 * std::abs(want)) << x << "," << y;
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, IdentityBlend,
                         ::testing::Values(BlendMode::kConstant, BlendMode::kGaussian, BlendMode::kCrop));

TEST(Stitcher, ArrivalOrderDoesNotChangeAByte) {
  const Synthetic img = makeImage(333, 277, 3, 7);
  WindowGrid g(333, 277, GridSpec{64, 64, 0.4, 0.4});
  std::mt19937 rng(3);
  const std::vector<std::vector<float>> preds = disagreeingPredictions(img, g, rng);
  StitchOptions o{BlendMode::kGaussian, 0.125};
  cv::Mat ref = stitch(g, 3, o, preds, test::inOrder(g.count()));
  for (int trial = 0; trial < 5; ++trial) {
    // Shuffle within "steps" of 8 windows, as gathered batches arrive.
    auto order = test::inOrder(g.count());
    for (size_t s = 0; s < order.size(); s += 8)
      std::shuffle(order.begin() + long(s), order.begin() + long(std::min(order.size(), s + 8)), rng);
    if (trial == 4) std::reverse(order.begin(), order.end());
    cv::Mat got = stitch(g, 3, o, preds, order);
    ASSERT_EQ(std::memcmp(got.data, ref.data, ref.total() * ref.elemSize()), 0) << "trial " << trial;
  }
}

// Windows added a step at a time and blended in row pieces on a pool give the bytes of one window at a time
// on the caller's thread: every blend mode, shuffled steps, a mask's subset of the windows, and steps that
// span grid rows.
TEST(Stitcher, RowPiecesOnAPoolChangeNoByte) {
  const Synthetic img = makeImage(301, 259, 2, 11);
  WindowGrid g(301, 259, GridSpec{48, 48, 0.5, 0.5});
  std::mt19937 rng(5);
  const std::vector<std::vector<float>> preds = disagreeingPredictions(img, g, rng);
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < g.count(); ++i)
    if (i % 7 != 3) kept.push_back(i);
  WorkPool pool(3);
  for (BlendMode mode : {BlendMode::kGaussian, BlendMode::kConstant, BlendMode::kCrop}) {
    for (bool masked : {false, true}) {
      const std::vector<int64_t> windows = masked ? kept : test::inOrder(g.count());
      StitchOptions serial{mode, 0.125};
      const cv::Mat ref = stitch(g, 2, serial, preds, windows, masked ? kept : std::vector<int64_t>{});
      StitchOptions pooled = serial;
      pooled.pool = &pool;
      for (size_t step : {size_t(1), size_t(8), size_t(13), windows.size()}) {
        auto order = windows;
        for (size_t s = 0; s < order.size(); s += step)
          std::shuffle(order.begin() + long(s), order.begin() + long(std::min(order.size(), s + step)), rng);
        const cv::Mat got = stitch(g, 2, pooled, preds, order, masked ? kept : std::vector<int64_t>{}, step);
        ASSERT_EQ(std::memcmp(got.data, ref.data, ref.total() * ref.elemSize()), 0)
            << "mode " << int(mode) << (masked ? ", masked" : "") << ", steps of " << step;
      }
    }
  }
}

TEST(Stitcher, CropModeEqualsAWholeImageForwardOfAConvNet) {
  torch::manual_seed(0);
  // Three 3x3 convolutions (zero padded, tanh between): each output pixel sees 3 px around it; cores stay >=
  // 8 px from window edges. Weights and biases uniform in +-1/sqrt(fan-in), as torch.nn.Conv2d starts them.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> layers;
  for (auto [in, out] : {std::pair{2, 4}, std::pair{4, 4}, std::pair{4, 3}}) {
    const double bound = 1.0 / std::sqrt(in * 9.0);
    layers.emplace_back((torch::rand({out, in, 3, 3}) * 2 - 1) * bound, (torch::rand({out}) * 2 - 1) * bound);
  }
  auto net = [&](torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = torch::conv2d(x, layers[i].first, layers[i].second, 1, 1);
      if (i + 1 < layers.size()) x = torch::tanh(x);
    }
    return x;
  };
  torch::NoGradGuard ng;
  const int64_t w = 200, h = 150;
  auto image = torch::rand({1, 2, h, w});
  auto whole = net(image)[0].contiguous();
  WindowGrid g(w, h, GridSpec{64, 64, 0.25, 0.25});
  std::vector<std::vector<float>> preds;
  for (int64_t i = 0; i < g.count(); ++i) {
    Rect r = g.window(i);
    auto win = image.index({torch::indexing::Slice(), torch::indexing::Slice(),
                            torch::indexing::Slice(r.y, r.bottom()), torch::indexing::Slice(r.x, r.right())});
    auto p = net(win.contiguous())[0].contiguous();
    preds.emplace_back(p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
  }
  cv::Mat out = stitch(g, 3, StitchOptions{BlendMode::kCrop, 0.125}, preds, test::inOrder(g.count()));
  auto acc = whole.accessor<float, 3>();
  float worst = 0;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        worst = std::max(worst, std::abs(out.ptr<float>(int(y))[x * 3 + c] - acc[c][y][x]));
  EXPECT_LT(worst, 1e-5);
}

// A model that cannot compute the outer `halo` px of its window (there it gives garbage: +100): with the
// halo given, that band weighs 0 where a window meets another, in every mode, and the blend is the image;
// along the image's border the band is kept (a whole-image forward has it there too).
TEST(Stitcher, AHalosBandIsDroppedBetweenWindowsAndKeptAtTheBorder) {
  const int64_t w = 200, h = 150, halo = 12;
  const Synthetic img = makeImage(w, h, 2, 11);
  const WindowGrid g(w, h, GridSpec{64, 64, 0.375, 0.375});  // 24 px of overlap: twice the halo
  std::vector<std::vector<float>> preds;
  for (int64_t i = 0; i < g.count(); ++i) {
    auto p = identityPrediction(img, g, i);
    for (int c = 0; c < 2; ++c)
      for (int64_t y = 0; y < 64; ++y)
        for (int64_t x = 0; x < 64; ++x)
          if (y < halo || x < halo || y >= 64 - halo || x >= 64 - halo)
            p[size_t((c * 64 + y) * 64 + x)] += 100;
    preds.push_back(p);
  }
  for (BlendMode mode : {BlendMode::kConstant, BlendMode::kGaussian, BlendMode::kCrop}) {
    StitchOptions o{mode, 0.125};
    o.halo = halo;
    const cv::Mat out = stitch(g, 2, o, preds, test::inOrder(g.count()));
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) {
        const bool border = y < halo || x < halo || y >= h - halo || x >= w - halo;
        for (int c = 0; c < 2; ++c) {
          const float got = out.ptr<float>(int(y))[x * 2 + c], want = img.at(c, y, x) + (border ? 100 : 0);
          ASSERT_NEAR(got, want, 1e-4) << "mode " << int(mode) << " at " << x << "," << y;
        }
      }
    // Without the halo the garbage between windows is blended in (crop's cores already keep it out).
    if (mode == BlendMode::kCrop) continue;
    const cv::Mat blended = stitch(g, 2, StitchOptions{mode, 0.125}, preds, test::inOrder(g.count()));
    EXPECT_GT(blended.at<cv::Vec2f>(75, 50)[0] - img.at(0, 75, 50), 1.0f) << int(mode);
  }
  // The blended part of a corner window keeps its halo at the border; an interior window loses it all round.
  StitchOptions o;
  o.halo = halo;
  const OutputLayout layout(g, o);
  const OutputLayout::Part corner = layout.part(0), inner = layout.part(g.columns() + 1);
  EXPECT_EQ(std::vector<int64_t>({corner.x0, corner.x1, corner.y0, corner.y1}),
            std::vector<int64_t>({0, 64 - halo, 0, 64 - halo}));
  EXPECT_EQ(std::vector<int64_t>({inner.x0, inner.x1, inner.y0, inner.y1}),
            std::vector<int64_t>({halo, 64 - halo, halo, 64 - halo}));
  // A halo of half the window leaves it nothing.
  o.halo = 32;
  EXPECT_THROW(OutputLayout(g, o), ConfigError);
}

TEST(Stitcher, OutputAtTheModelsScale) {
  for (Scale s : {Scale{2, 1}, Scale{1, 2}, Scale{1, 4}}) {
    const Synthetic img = makeImage(160, 96, 1, 5);
    WindowGrid g(160, 96, GridSpec{64, 64, 0.25, 0.25}, s);
    std::vector<std::vector<float>> preds;
    for (int64_t i = 0; i < g.count(); ++i) preds.push_back(identityPrediction(img, g, i));
    cv::Mat out = stitch(g, 1, StitchOptions{BlendMode::kCrop, 0.125}, preds, test::inOrder(g.count()));
    ASSERT_EQ(out.cols, s.apply(160));
    ASSERT_EQ(out.rows, s.apply(96));
    for (int y = 0; y < out.rows; ++y)
      for (int x = 0; x < out.cols; ++x)
        ASSERT_EQ(out.ptr<float>(y)[x], img.at(0, y * s.den / s.num, x * s.den / s.num))
            << s.num << "/" << s.den;
  }
}

TEST(Stitcher, MemoryStaysABandOfRowsFor60000Squared) {
  const int64_t n = 60000, win = 256;
  WindowGrid g(n, n, GridSpec{win, win, 0.0, 0.0});
  // Bound: a ring of one window height across the width with value + weight, plus the importance map.
  const size_t bound = size_t(win * n * (1 + 1) * 4 + win * win * 4);
  std::vector<float> pred(size_t(win * win), 1.0f);
  int64_t rows = 0;
  size_t peak = 0;
  Stitcher st(g, 1, StitchOptions{BlendMode::kConstant, 0.125}, [&](const cv::Mat& band, int64_t first) {
    ASSERT_EQ(first, rows);
    ASSERT_EQ(band.ptr<float>(0)[n - 1], 1.0f);
    rows += band.rows;
  });
  for (int64_t i = 0; i < g.count(); ++i) {
    st.add(i, pred.data());
    peak = std::max(peak, st.bytesHeld());
  }
  EXPECT_EQ(rows, n);
  EXPECT_LE(peak, bound) << "under " << bound / (1 << 20) << " MiB, vs " << n * n * 4 / (1 << 20)
                         << " MiB for the image";
}

TEST(Stitcher, EarlyArrivalsAreHeldAndDuplicatesRejected) {
  WindowGrid g(100, 64, GridSpec{64, 64, 0.5, 0.5});
  std::vector<float> pred(64 * 64, 1.0f);
  Stitcher st(g, 1, StitchOptions{}, [](const cv::Mat&, int64_t) {});
  st.add(2, pred.data());
  EXPECT_GT(st.bytesHeld(), size_t(64 * 64 * 4));
  EXPECT_THROW(st.add(2, pred.data()), ConfigError);
  st.add(0, pred.data());
  EXPECT_THROW(st.add(0, pred.data()), ConfigError);
  st.add(1, pred.data());
  EXPECT_TRUE(st.done());
}

// Two ranks' parts of a row: half the windows arrive early, a few at a time. The buffers that held them are
// reused, so a long image makes as many as were ever held at once (a fresh buffer each faulted in all its
// pages: 25% more page faults on the 2-rank null-model job).
TEST(Stitcher, EarlyArrivalBuffersAreReused) {
  WindowGrid g(64 * 41, 64, GridSpec{64, 64, 0.0, 0.0});  // one row of 41 windows
  ASSERT_EQ(g.count(), 41);
  std::vector<float> pred(2 * 64 * 64, 1.0f);
  Stitcher st(g, 2, StitchOptions{}, [](const cv::Mat&, int64_t) {});
  for (int64_t part = 0; part + 3 < 41; part += 4) {  // windows part+2, part+3 early, then part, part+1
    st.add(part + 2, pred.data());
    st.add(part + 3, pred.data());
    st.add(part, pred.data());
    st.add(part + 1, pred.data());
  }
  EXPECT_EQ(st.earlyBuffersMade(), 2) << "two held at once, at most";
  st.add(40, pred.data());
  EXPECT_TRUE(st.done());
}

// A mask kept some windows: rows and columns no kept window reaches are 0; where every covering window was
// kept the values are exactly the full run's; gaps taller than a window come out as zero bands.
TEST(Stitcher, MaskedWindowsLeaveZerosAndKeepTheRestExact) {
  const GridSpec spec{32, 32, 0.25, 0.25};
  const WindowGrid g(300, 260, spec);
  auto img = makeImage(300, 260, 2, 7);
  std::vector<std::vector<float>> preds;
  for (int64_t i = 0; i < g.count(); ++i) preds.push_back(identityPrediction(img, g, i));
  const StitchOptions o{BlendMode::kGaussian, 0.125};
  const cv::Mat full = stitch(g, 2, o, preds, test::inOrder(g.count()));
  // Keep the windows of the first two grid rows and of the last row: a gap of several window heights.
  std::vector<int64_t> kept;
  const int64_t cols = g.columns(), rows = g.count() / cols;
  for (int64_t i = 0; i < g.count(); ++i)
    if (i / cols < 2 || i / cols == rows - 1) kept.push_back(i);
  std::vector<int64_t> shuffled(kept.rbegin(), kept.rend());
  const cv::Mat masked = stitch(g, 2, o, preds, shuffled, kept);
  const Rect last_row = g.imageWindow((rows - 1) * cols);
  const int64_t top_end = g.imageWindow(cols).bottom();  // below this, rows of grid row 2 would also reach
  for (int y = 0; y < 260; ++y) {
    const float* a = full.ptr<float>(y);
    const float* b = masked.ptr<float>(y);
    for (int x = 0; x < 300 * 2; ++x) {
      if (y < g.imageWindow(2 * cols).y) {
        ASSERT_EQ(a[x], b[x]) << "row " << y << ": every covering window was kept";
      } else if (y >= top_end && y < last_row.y) {
        ASSERT_EQ(b[x], 0.f) << "row " << y << ": no kept window reaches it";
      }
    }
  }
}

TEST(Stitcher, NoWindowAtAllGivesAZeroImageInBands) {
  const WindowGrid g(100, 700, GridSpec{64, 64, 0.25, 0.25});
  int64_t rows = 0;
  Stitcher st(
      g, 3, StitchOptions{},
      [&](const cv::Mat& band, int64_t first) {
        EXPECT_EQ(first, rows);
        EXPECT_LE(band.rows, 64);
        EXPECT_EQ(cv::countNonZero(band.reshape(1)), 0);
        rows += band.rows;
      },
      std::vector<int64_t>{});
  EXPECT_FALSE(st.done());
  st.finishEmpty();
  EXPECT_TRUE(st.done());
  EXPECT_EQ(rows, 700);
  Stitcher all(g, 3, StitchOptions{}, [](const cv::Mat&, int64_t) {});
  EXPECT_THROW(all.finishEmpty(), Error) << "a stitcher expecting every window is not empty";
  const std::vector<float> pred(size_t(3 * 64 * 64), 1.f);
  Stitcher some(
      g, 3, StitchOptions{}, [](const cv::Mat&, int64_t) {}, std::vector<int64_t>{2, 5});
  EXPECT_THROW(some.add(3, pred.data()), Error) << "window 3 was not among those to expect";
}

TEST(Labels, NonFiniteValuesAreCounted) {
  std::vector<float> v(1001, 0.5f);
  EXPECT_EQ(countNonFinite(v.data(), int64_t(v.size())), 0);
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[500] = std::numeric_limits<float>::infinity();
  v[1000] = -std::numeric_limits<float>::infinity();
  v[7] = std::numeric_limits<float>::max();         // large is finite
  v[8] = std::numeric_limits<float>::denorm_min();  // so is tiny
  EXPECT_EQ(countNonFinite(v.data(), int64_t(v.size())), 3);
  // The same count, and whether any magnitude reaches 2^23 (what a byte conversion must look at twice).
  bool large = false;
  EXPECT_EQ(countNonFinite(v.data(), int64_t(v.size()), large), 3);
  EXPECT_TRUE(large);
  std::vector<float> probabilities(70000, 0.25f);
  probabilities[69999] = 8388607.0f;
  large = false;
  EXPECT_EQ(countNonFinite(probabilities.data(), int64_t(probabilities.size()), large), 0);
  EXPECT_FALSE(large) << "below 2^23";
  probabilities[69999] = -8388608.0f;
  EXPECT_EQ(countNonFinite(probabilities.data(), int64_t(probabilities.size()), large), 0);
  EXPECT_TRUE(large) << "in the second block of 65536";
}

TEST(Labels, ArgmaxThresholdAndWideClassCounts) {
  cv::Mat band(1, 2, CV_32FC3);
  band.ptr<float>(0)[0] = 0.1f, band.ptr<float>(0)[1] = 0.7f, band.ptr<float>(0)[2] = 0.2f;
  band.ptr<float>(0)[3] = 0.5f, band.ptr<float>(0)[4] = 0.1f, band.ptr<float>(0)[5] = 0.9f;
  cv::Mat l = labelsFromProbabilities(band, 0.f);
  EXPECT_EQ(l.type(), CV_8UC1);
  EXPECT_EQ(l.at<uint8_t>(0, 0), 1);
  EXPECT_EQ(l.at<uint8_t>(0, 1), 2);
  cv::Mat one(1, 2, CV_32FC1);
  one.at<float>(0, 0) = 0.4f;
  one.at<float>(0, 1) = 0.6f;
  cv::Mat t = labelsFromProbabilities(one, 0.5f);
  EXPECT_EQ(t.at<uint8_t>(0, 0), 0);
  EXPECT_EQ(t.at<uint8_t>(0, 1), 1);
  cv::Mat wide = cv::Mat::zeros(1, 1, CV_32FC(300));
  wide.ptr<float>(0)[299] = 1.0f;
  cv::Mat wl = labelsFromProbabilities(wide, 0.f);
  EXPECT_EQ(wl.type(), CV_16UC1);
  EXPECT_EQ(wl.at<uint16_t>(0, 0), 299);
}

// u8 probabilities: OpenCV's convertTo bytes for every value a probability takes (halves of 1/255 round to
// even), 255 and 0 for the huge, infinite and negative values it gets wrong (it turns p x 255 past 2^31 into
// 0), and NaN to 0.
TEST(Labels, ProbabilitiesAsBytesRoundHalfToEvenAndClamp) {
  std::vector<float> v;
  for (int k = -300; k <= 600; ++k) v.push_back(float(k) / 510.0f);  // halves of 1/255 among them
  for (int k = 0; k <= 255; ++k) v.push_back((float(k) + 0.5f) / 255.0f);
  std::mt19937 random(5);
  for (int k = 0; k < 10000; ++k) v.push_back(std::uniform_real_distribution<float>(-0.01f, 1.01f)(random));
  std::vector<uint8_t> bytes(v.size());
  probabilitiesToBytes(v.data(), int64_t(v.size()), bytes.data());
  cv::Mat opencv;
  cv::Mat(1, int(v.size()), CV_32F, v.data()).convertTo(opencv, CV_8U, 255.0);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(bytes[i], opencv.at<uint8_t>(0, int(i))) << v[i];
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> edges = {1e10f, inf,  -1e10f, -inf,          std::numeric_limits<float>::quiet_NaN(),
                              1.0f,  0.0f, -0.0f,  0.5f / 255.0f, 1.5f / 255.0f};
  std::vector<uint8_t> out(edges.size());
  probabilitiesToBytes(edges.data(), int64_t(edges.size()), out.data());
  EXPECT_EQ(out, (std::vector<uint8_t>{255, 255, 0, 0, 0, 255, 0, 0, 0, 2}));
}

}  // namespace
}  // namespace tiler
