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
