// processing: the statistics StatisticsGatherer gathers in bands equal numpy's over the whole image (exact
// percentiles for 16-bit integers, within one bin's width for floats), and a chain's affine steps become the
// per-channel map that numbers worked out by hand give.
#include "tiler/core/processing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

using namespace tiler;

namespace {

// numpy's count, mean, std and linear percentiles of each channel and of all of them, of `values` (channel
// planes of float32 written to a file), as JSON; null where the Python has no NumPy.
nlohmann::json numpyStatistics(const std::string& dir, const std::vector<std::vector<float>>& channels,
                               const std::vector<double>& qs) {
  std::ofstream out(dir + "/values.f32", std::ios::binary);
  for (const auto& c : channels)
    out.write(reinterpret_cast<const char*>(c.data()), std::streamsize(c.size() * 4));
  out.close();
  std::string q_list;
  for (double q : qs) q_list += (q_list.empty() ? "" : ",") + std::to_string(q);
  std::ofstream(dir + "/stats.py") << R"(import sys, json, numpy as np
v = np.fromfile(sys.argv[1], np.float32).astype(np.float64).reshape(int(sys.argv[2]), -1)
qs = [float(q) for q in sys.argv[3].split(',')]
one = lambda a: {'count': a.size, 'mean': a.mean(), 'std': a.std(), 'p': [np.percentile(a, q) for q in qs]}
print(json.dumps({'channels': [one(c) for c in v], 'all': one(v.ravel())}))
)";
  const auto r = test::runCommand("/usr/bin/python3 " + dir + "/stats.py " + dir + "/values.f32 " +
                                  std::to_string(channels.size()) + " " + q_list + " 2>&1");
  if (r.code != 0) return nullptr;
  return nlohmann::json::parse(r.output);
}

// Values of `n` pixels a channel from a fixed linear congruential sequence: integers below 2^16 or floats.
std::vector<std::vector<float>> values(int channels, size_t n, bool integers) {
  std::vector<std::vector<float>> v(static_cast<size_t>(channels));
  uint64_t state = 12345;
  for (int c = 0; c < channels; ++c)
    for (size_t i = 0; i < n; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      const double u = double(state >> 11) / double(1ULL << 53);
      // Skewed (a square), and each channel about its own offset: percentiles are no simple fractions.
      v[size_t(c)].push_back(integers ? float(std::floor(u * u * 60000) + 1000 * c)
                                      : float(u * u * 3.5 - 1.25 + 0.5 * c));
    }
  return v;
}

// Gathers `v` in bands of `band` values a channel (two passes unless exact).
ImageStatistics gathered(const std::vector<std::vector<float>>& v, bool exact, const std::vector<double>& qs,
                         size_t band) {
  StatisticsGatherer g(int(v.size()), exact, qs);
  for (int pass = exact ? 1 : 0; pass < 2; ++pass)
    for (size_t at = 0; at < v[0].size(); at += band)
      for (size_t c = 0; c < v.size(); ++c) {
        const int64_t n = int64_t(std::min(band, v[0].size() - at));
        if (pass == 0)
          g.addRange(int(c), v[c].data() + at, n);
        else
          g.add(int(c), v[c].data() + at, n);
      }
  return g.finish();
}

void expectLike(const ValueStatistics& got, const nlohmann::json& want, const std::vector<double>& qs,
                double percentile_bound, const std::string& what) {
  EXPECT_EQ(got.count, want["count"].get<double>()) << what;
  EXPECT_NEAR(got.mean, want["mean"].get<double>(), 1e-9 * std::abs(want["mean"].get<double>()) + 1e-12)
      << what;
  EXPECT_NEAR(got.std, want["std"].get<double>(), 1e-9 * want["std"].get<double>()) << what;
  for (size_t k = 0; k < qs.size(); ++k) {
    const double p = want["p"][k].get<double>();
    if (percentile_bound == 0)
      EXPECT_NEAR(got.percentiles.at(qs[k]), p, 1e-9 * std::abs(p)) << what << " percentile " << qs[k];
    else
      EXPECT_LE(std::abs(got.percentiles.at(qs[k]) - p), percentile_bound) << what << " percentile " << qs[k];
  }
}

}  // namespace

TEST(Processing, SixteenBitStatisticsInBandsAreNumpysExactly) {
  const std::string dir = test::scratchDir("processing_u16");
  const std::vector<double> qs = {0, 0.1, 1, 37.5, 50, 99, 99.8, 100};
  const auto v = values(3, 100003, true);
  const auto want = numpyStatistics(dir, v, qs);
  if (want.is_null()) GTEST_SKIP() << "no NumPy";
  const ImageStatistics got = gathered(v, true, qs, 4096);
  for (size_t c = 0; c < 3; ++c)
    expectLike(got.channels[c], want["channels"][c], qs, 0, "channel " + std::to_string(c));
  expectLike(got.all, want["all"], qs, 0, "all channels");
  // Sorting gives the same numbers (check-model's statistics of a test tensor).
  std::vector<std::vector<double>> as_double;
  for (const auto& c : v) as_double.emplace_back(c.begin(), c.end());
  const ImageStatistics sorted = exactStatistics(as_double, qs);
  for (size_t c = 0; c < 3; ++c) expectLike(sorted.channels[c], want["channels"][c], qs, 0, "sorted");
  expectLike(sorted.all, want["all"], qs, 0, "sorted, all channels");
}

TEST(Processing, FloatPercentilesAreWithinOneBinOfNumpys) {
  const std::string dir = test::scratchDir("processing_f32");
  const std::vector<double> qs = {0, 0.5, 2, 50, 98, 99.5, 100};
  const auto v = values(2, 200001, false);
  const auto want = numpyStatistics(dir, v, qs);
  if (want.is_null()) GTEST_SKIP() << "no NumPy";
  const ImageStatistics got = gathered(v, false, qs, 1000);
  for (size_t c = 0; c < 2; ++c) {
    const auto [lo, hi] = std::minmax_element(v[c].begin(), v[c].end());
    const double bin = (double(*hi) - double(*lo)) / kFloatBins;
    expectLike(got.channels[c], want["channels"][c], qs, bin, "channel " + std::to_string(c));
    // The extremes are exact.
    EXPECT_EQ(got.channels[c].percentiles.at(0), double(*lo));
    EXPECT_EQ(got.channels[c].percentiles.at(100), double(*hi));
  }
  const double lo = std::min(*std::min_element(v[0].begin(), v[0].end()),
                             *std::min_element(v[1].begin(), v[1].end())),
               hi = std::max(*std::max_element(v[0].begin(), v[0].end()),
                             *std::max_element(v[1].begin(), v[1].end()));
  expectLike(got.all, want["all"], qs, (hi - lo) / kFloatBins, "all channels");
}

TEST(Processing, AChainsAffineStepsMakeOneMapPerChannel) {
  ImageStatistics s;
  s.channels.resize(2);
  s.channels[0].count = s.channels[1].count = 100;
  s.channels[0].mean = 10, s.channels[0].std = 2;
  s.channels[1].mean = 20, s.channels[1].std = 4;
  s.channels[0].percentiles = {{1, 4}, {99, 16}};
  s.channels[1].percentiles = {{1, 8}, {99, 40}};
  s.all.count = 200, s.all.mean = 15, s.all.std = std::sqrt(35.0);  // E[x^2] = (104 + 416) / 2, less 15^2
  s.all.percentiles = {{1, 5}, {99, 38}};
  ProcessingStep zmuv;
  zmuv.id = "zero_mean_unit_variance", zmuv.eps = 0;
  // Tiler's scale of 2 first: the channels' values are 2x, their means 20 and 40, stds 4 and 8.
  ChannelAffine f = inputAffine({zmuv}, s, {{2.0}, {0.0}}, "t");
  EXPECT_DOUBLE_EQ(f.gain[0], 2.0 / 4);
  EXPECT_DOUBLE_EQ(f.offset[0], -20.0 / 4);
  EXPECT_DOUBLE_EQ(f.gain[1], 2.0 / 8);
  EXPECT_DOUBLE_EQ(f.offset[1], -40.0 / 8);
  // Over all channels: the mean and std of all values (15 and sqrt(35)).
  zmuv.per_channel = false;
  f = inputAffine({zmuv}, s, {{1.0}, {0.0}}, "t");
  EXPECT_DOUBLE_EQ(f.gain[0], 1 / std::sqrt(35.0));
  EXPECT_DOUBLE_EQ(f.gain[1], 1 / std::sqrt(35.0));
  EXPECT_DOUBLE_EQ(f.offset[1], -15 / std::sqrt(35.0));
  // scale_range per channel after a negative gain: the 1st percentile of -x is minus the 99th of x.
  ProcessingStep negate, range;
  negate.id = "scale_linear", negate.gain = {-1}, negate.offset = {0};
  range.id = "scale_range", range.min_percentile = 1, range.max_percentile = 99, range.eps = 0;
  f = inputAffine({negate, range}, s, {{1.0}, {0.0}}, "t");
  // -x in [-16, -4] -> (-x + 16) / 12.
  EXPECT_DOUBLE_EQ(f.gain[0], -1.0 / 12);
  EXPECT_DOUBLE_EQ(f.offset[0], 16.0 / 12);
  // Over all channels it is known while the channels are mapped alike ...
  range.per_channel = false;
  f = inputAffine({negate, range}, s, {{1.0}, {0.0}}, "t");
  EXPECT_DOUBLE_EQ(f.gain[1], -1.0 / 33);
  EXPECT_DOUBLE_EQ(f.offset[1], 38.0 / 33);
  // ... and refused by name once they are not.
  ProcessingStep apart = negate;
  apart.gain = {1, 2}, apart.offset = {0, 0};
  try {
    inputAffine({apart, range}, s, {{1.0}, {0.0}}, "'img.tif'");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("'img.tif': scale_range's percentile 1 over channel, y, x"), std::string::npos)
        << e.message();
  }
  // The chain's map stops at its first step that is no affine map; the rest is fixed.
  ProcessingStep clip;
  clip.id = "clip", clip.min = 0, clip.max = 1;
  f = inputAffine({zmuv, clip, negate}, s, {{1.0}, {0.0}}, "t");
  EXPECT_DOUBLE_EQ(f.gain[0], 1 / std::sqrt(35.0));
  EXPECT_EQ(stepNames(fixedTail({zmuv, clip, negate})), "clip, scale_linear");
  EXPECT_EQ(percentilesRead({range}), (std::vector<double>{1, 99}));
}

// The common 0.1 / 99.9 pair: 100 - 99.9 is 0.1 only within rounding, so the percentiles read are the two
// given (each the other's mirror) and no near-copy, and a negative gain still finds its mirror.
TEST(Processing, PercentilesThatMirrorEachOtherAreReadOnce) {
  ProcessingStep negate, range;
  negate.id = "scale_linear", negate.gain = {-1}, negate.offset = {0};
  range.id = "scale_range", range.min_percentile = 0.1, range.max_percentile = 99.9, range.eps = 0;
  EXPECT_EQ(percentilesRead({range}), (std::vector<double>{0.1, 99.9}));
  EXPECT_EQ(percentilesRead({range, range}).size(), 2u);
  ImageStatistics s;
  s.channels.resize(1);
  s.channels[0].count = 10, s.channels[0].mean = 5, s.channels[0].std = 1;
  s.channels[0].percentiles = {{0.1, 2}, {99.9, 8}};
  s.all = s.channels[0];
  // -x in [-8, -2] -> (-x + 8) / 6.
  const ChannelAffine f = inputAffine({negate, range}, s, {{1.0}, {0.0}}, "t");
  EXPECT_DOUBLE_EQ(f.gain[0], -1.0 / 6);
  EXPECT_DOUBLE_EQ(f.offset[0], 8.0 / 6);
}

// A postprocessing chain splits at its first statistics step; the rest's affine head is one map from the
// output's statistics and the input's (a reference_tensor), by bioimageio.core's formulas; a per-channel
// reference of another channel count is refused naming both counts; the fixed steps after it give hand
// numbers.
TEST(Processing, TheOutputsStatisticsStepsMakeOneMapAndTheFixedStepsFollow) {
  ImageStatistics out;
  out.channels.resize(2);
  out.channels[0].count = out.channels[1].count = 4;
  out.channels[0].mean = 1, out.channels[0].std = 2;
  out.channels[1].mean = -3, out.channels[1].std = 0.5;
  out.channels[0].percentiles = {{5, 0}, {95, 4}};
  out.channels[1].percentiles = {{5, -4}, {95, -2}};
  // Over all: mean -1, variance (4 + 0.25) / 2 + (1 + 9) / 2 - 1.
  out.all.count = 8, out.all.mean = -1, out.all.std = std::sqrt(6.125);
  ImageStatistics in = out;
  in.channels[0].mean = 100, in.channels[0].std = 10;
  in.channels[1].mean = 50, in.channels[1].std = 5;
  in.all.mean = 75, in.all.std = 20;
  ProcessingStep sigmoid, smv, zmuv, clip;
  sigmoid.id = "sigmoid";
  smv.id = "scale_mean_variance", smv.reference_input = true, smv.eps = 0;
  zmuv.id = "zero_mean_unit_variance", zmuv.eps = 0, zmuv.per_channel = false;
  clip.id = "clip", clip.min = 0, clip.max = 1;
  const auto [head, rest] = splitAtStatistics({sigmoid, smv, zmuv, clip});
  EXPECT_EQ(stepNames(head), "sigmoid");
  EXPECT_EQ(stepNames(rest), "scale_mean_variance, zero_mean_unit_variance, clip");
  EXPECT_TRUE(splitAtStatistics({sigmoid, clip}).second.empty());
  // (x - 1) / 2 * 10 + 100 and (x + 3) / 0.5 * 5 + 50: each channel then has the input's mean and std, so
  // zero_mean_unit_variance over all channels maps by the channels' moments combined (mean 75).
  const ChannelAffine just = outputAffine({smv}, out, &in, "t");
  EXPECT_DOUBLE_EQ(just.gain[0], 5);
  EXPECT_DOUBLE_EQ(just.offset[0], 95);
  EXPECT_DOUBLE_EQ(just.gain[1], 10);
  EXPECT_DOUBLE_EQ(just.offset[1], 80);
  const double all_std = std::sqrt((100.0 + 25.0) / 2 + (100.0 * 100 + 50.0 * 50) / 2 - 75.0 * 75);
  const ChannelAffine both = outputAffine(rest, out, &in, "t");
  EXPECT_DOUBLE_EQ(both.gain[0], 5 / all_std);
  EXPECT_DOUBLE_EQ(both.offset[0], (95 - 75) / all_std);
  // Over all channels against the input's: its mean and std over all.
  smv.per_channel = false;
  const ChannelAffine over_all = outputAffine({smv}, out, &in, "t");
  EXPECT_DOUBLE_EQ(over_all.gain[1], 20.0 / std::sqrt(6.125));
  EXPECT_DOUBLE_EQ(over_all.offset[1], 75 + 20.0 / std::sqrt(6.125));
  // scale_range against the input's percentiles, not the output's.
  ProcessingStep range;
  range.id = "scale_range", range.min_percentile = 5, range.max_percentile = 95, range.eps = 0;
  range.reference_input = true;
  EXPECT_EQ(percentilesRead({range}, true), (std::vector<double>{5, 95}));
  EXPECT_TRUE(percentilesRead({range}).empty());
  in.channels[0].percentiles = {{5, 10}, {95, 30}};
  EXPECT_DOUBLE_EQ(outputAffine({range}, out, &in, "t").gain[0], 1.0 / 20);
  // Output channel k against input channel k: three input channels for two output channels are refused.
  smv.per_channel = true;
  ImageStatistics three = in;
  three.channels.push_back(in.channels[0]);
  try {
    outputAffine({smv}, out, &three, "'img.tif'");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("'img.tif': scale_mean_variance over y, x of each channel"), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("the output has 2 channel(s) and the input 3"), std::string::npos)
        << e.message();
  }
  // The map, then clip, softmax, binarize and scale_linear on interleaved pixels of two channels.
  std::vector<float> v = {0.0f, 1.0f, 2.0f, -1.0f};
  applyFixedSteps(v.data(), 2, 2, {{2.0, 1.0}, {0.0, -1.0}}, {clip});
  EXPECT_EQ(v, (std::vector<float>{0.0f, 0.0f, 1.0f, 0.0f}));
  ProcessingStep softmax, binarize, linear;
  softmax.id = "softmax", binarize.id = "binarize", binarize.threshold = {0.5};
  linear.id = "scale_linear", linear.gain = {1, 3}, linear.offset = {0, 1};
  v = {0.0f, 0.0f, 3.0f, 1.0f};
  applyFixedSteps(v.data(), 2, 2, {}, {softmax});
  EXPECT_FLOAT_EQ(v[0], 0.5f);
  EXPECT_FLOAT_EQ(v[2], 1 / (1 + std::exp(-2.0f)));
  applyFixedSteps(v.data(), 2, 2, {}, {binarize, linear});
  EXPECT_EQ(v, (std::vector<float>{0.0f, 1.0f, 1.0f, 1.0f}));
  // A step's values for another channel count are refused.
  linear.gain = {1, 2, 3};
  EXPECT_THROW(applyFixedSteps(v.data(), 2, 2, {}, {linear}), ConfigError);
}

// Without a percentile asked, moments alone: no range pass is needed, and they are numpy's.
TEST(Processing, MomentsAloneNeedNoRange) {
  StatisticsGatherer g(1, /*exact=*/false, {});
  const std::vector<float> a = {1, 2, 3}, b = {4, NAN, 6};
  g.add(0, a.data(), 3);
  g.add(0, b.data(), 3);
  const ImageStatistics s = g.finish();
  EXPECT_EQ(s.channels[0].count, 5);
  EXPECT_DOUBLE_EQ(s.channels[0].mean, 3.2);
  EXPECT_NEAR(s.channels[0].std, std::sqrt(((1 - 3.2) * (1 - 3.2) + 1.44 + 0.04 + 0.64 + 7.84) / 5), 1e-12);
  EXPECT_TRUE(s.channels[0].percentiles.empty());
}
