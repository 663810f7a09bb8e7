// processing: bioimage.io's pre- and postprocessing steps as tiler follows them, and the statistics of one
// image that the statistics steps (scale_range, zero_mean_unit_variance, scale_mean_variance) read. Promise:
// a chain of steps before its first step that is no affine map (clip, sigmoid, binarize, softmax) becomes one
// per-channel affine map for an image (inputAffine), composed on top of tiler's own normalisation and
// computed from the image's statistics of the values as tiler reads them; the steps after it are fixed
// numbers (a statistics step there is refused when the card is read). A postprocessing chain is split at its
// first statistics step (splitAtStatistics): the steps before it run on each window, the rest on the blended
// image, its affine steps one map (outputAffine) from the blended output's statistics and the input's (a
// reference_tensor), the steps after them fixed (applyFixedSteps). Statistics are gathered by
// StatisticsGatherer in bands:
// count, mean and std in double precision (bands combined as Chan et al.'s pairwise update), percentiles
// exact for integer images of at most 16 bits (a histogram of every value), and for any other image from a
// histogram of kFloatBins bins over [min, max] of a first pass, within one bin's width of numpy's linear
// percentile. Plain data, no LibTorch.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tiler {

struct ProcessingStep {
  // scale_linear (fixed_zero_mean_unit_variance arrives as one), scale_range, zero_mean_unit_variance,
  // scale_mean_variance (postprocessing only), clip, sigmoid, softmax, binarize.
  std::string id;
  std::vector<double> gain, offset;  // scale_linear: per channel (one value: every channel)
  std::vector<double> threshold;     // binarize: per channel (one value: every channel)
  double min = -std::numeric_limits<double>::infinity(),
         max = std::numeric_limits<double>::infinity();  // clip
  double min_percentile = 0, max_percentile = 100;       // scale_range, in [0, 100]
  double eps = 1e-6;                                     // scale_range, zero_mean_unit_variance
  bool per_channel = true;  // statistics over y, x of each channel; false: over channel, y, x together
  // A postprocessing step's statistics of the input as read (its reference_tensor) rather than of the output:
  // scale_range's percentiles, scale_mean_variance's reference mean and std.
  bool reference_input = false;

  bool usesStatistics() const {
    return id == "scale_range" || id == "zero_mean_unit_variance" || id == "scale_mean_variance";
  }
  bool isAffine() const { return id == "scale_linear" || usesStatistics(); }
};

// The steps' names as a card writes them, in order ("zero_mean_unit_variance, clip").
std::string stepNames(const std::vector<ProcessingStep>& steps);
bool usesStatistics(const std::vector<ProcessingStep>& steps);

struct ValueStatistics {
  double count = 0, mean = 0, std = 0;   // std: of the population (numpy's ddof=0)
  std::map<double, double> percentiles;  // percentile in [0, 100] -> value (numpy's linear method)
};
// An image's statistics per channel (the model's input channels, values as read, before any scaling) and
// over all its channels together.
struct ImageStatistics {
  std::vector<ValueStatistics> channels;
  ValueStatistics all;
};

// The percentiles `steps` read (q and 100 - q of each: a negative gain before them swaps the two): of the
// tensor itself, or (`reference`) of the input where a postprocessing step names it as its reference.
std::vector<double> percentilesRead(const std::vector<ProcessingStep>& steps, bool reference = false);
// Whether a postprocessing chain reads the input's statistics (a step's reference_input).
bool readsInputStatistics(const std::vector<ProcessingStep>& steps);

// A per-channel affine map y = gain * x + offset.
struct ChannelAffine {
  std::vector<double> gain, offset;
};

// The map the steps before the first step that is no affine map make of an image with the statistics
// `stats` (of raw values), applied after `before` (tiler's scale, mean and std, per channel). Throws
// ConfigError (naming `what`) where a statistic over all channels is asked after channels were mapped apart
// (percentiles over channel, y, x after a per-channel gain), or a percentile was not gathered.
ChannelAffine inputAffine(const std::vector<ProcessingStep>& steps, const ImageStatistics& stats,
                          const ChannelAffine& before, const std::string& what);
// The steps from the first one that is no affine map on: fixed numbers, applied to each window as they are.
std::vector<ProcessingStep> fixedTail(const std::vector<ProcessingStep>& steps);

// A postprocessing chain split at its first statistics step: the steps before it (each window's) and the
// rest (the blended image's); the rest is empty where no step reads statistics.
std::pair<std::vector<ProcessingStep>, std::vector<ProcessingStep>> splitAtStatistics(
    const std::vector<ProcessingStep>& steps);
// The map the affine steps at the head of `rest` (splitAtStatistics' second part) make of the blended
// output whose statistics are `output`; `input`: the input's as read (a reference_tensor's), or null when no
// step reads it. Throws ConfigError (naming `what`) where a step reads the input's channel k for an output of
// another channel count, or a statistic was not gathered.
ChannelAffine outputAffine(const std::vector<ProcessingStep>& rest, const ImageStatistics& output,
                           const ImageStatistics* input, const std::string& what);
// `pixels` interleaved pixels of `channels` floats each, `affine` (one map a channel; empty gain: none) and
// then fixed steps (scale_linear, clip, sigmoid, softmax, binarize) applied in place, as ModelRunner applies
// them to a window (bioimage.io's definitions; binarize gives 0 and 1).
void applyFixedSteps(float* values, int64_t pixels, int channels, const ChannelAffine& affine,
                     const std::vector<ProcessingStep>& steps);

// The statistics of each channel's values (NaN left out) by sorting them: numpy's numbers exactly, for a
// tensor small enough to hold (check-model's test input).
ImageStatistics exactStatistics(const std::vector<std::vector<double>>& channels,
                                const std::vector<double>& percentiles);

constexpr int kFloatBins = 1 << 16;

// Gathers ImageStatistics from an image's values in bands. Integer images of at most 16 bits (`exact`):
// add() once over the image; others: addRange() over the image, then add() over it again.
class StatisticsGatherer {
 public:
  // No percentile asked: moments alone (no histogram, no range pass needed).
  StatisticsGatherer(int channels, bool exact, std::vector<double> percentiles);
  bool exact() const { return exact_; }
  // First pass of a non-exact image: its per-channel range.
  void addRange(int channel, const float* values, int64_t n);
  // The values of one channel in one band (NaN left out).
  void add(int channel, const float* values, int64_t n);
  ImageStatistics finish() const;

 private:
  struct Moments {
    double n = 0, mean = 0, m2 = 0;
    void merge(double n2, double mean2, double m22);
  };
  struct Histogram {
    double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
    std::vector<int64_t> bins;
  };
  ValueStatistics statistics(const Moments& m, const Histogram& h) const;
  int channels_;
  bool exact_;
  std::vector<double> percentiles_;
  std::vector<Moments> moments_;
  std::vector<Histogram> hists_;  // per channel; exact: bins are values 0..65535
};

}  // namespace tiler
