#include "tiler/core/processing.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "tiler/core/error.hpp"

namespace tiler {

std::string stepNames(const std::vector<ProcessingStep>& steps) {
  std::string text;
  for (const auto& step : steps) text += (text.empty() ? "" : ", ") + step.id;
  return text;
}

bool usesStatistics(const std::vector<ProcessingStep>& steps) {
  return std::any_of(steps.begin(), steps.end(), [](const ProcessingStep& s) { return s.usesStatistics(); });
}

std::vector<double> percentilesRead(const std::vector<ProcessingStep>& steps, bool reference) {
  std::set<double> qs;
  for (const auto& step : steps)
    if (step.id == "scale_range" && step.reference_input == reference)
      qs.insert({step.min_percentile, step.max_percentile});
  // Each one's mirror too (a negative gain reads it), unless it is one already: 100 - 99.9 is 0.1 only
  // within rounding, and two keys of one name would stand for different channels in the report.
  std::set<double> all = qs;
  for (double q : qs) {
    const double mirror = 100 - q;
    if (std::none_of(all.begin(), all.end(), [&](double e) { return std::abs(e - mirror) < 1e-9; }))
      all.insert(mirror);
  }
  return {all.begin(), all.end()};
}

bool readsInputStatistics(const std::vector<ProcessingStep>& steps) {
  return std::any_of(steps.begin(), steps.end(), [](const ProcessingStep& s) { return s.reference_input; });
}

namespace {

double at(const std::vector<double>& v, size_t c) {
  return v[v.size() == 1 ? 0 : c];
}

// Statistics carried through the chain: each channel's and those over all channels (percentiles over all
// stay known only while every channel is mapped alike).
struct Carried {
  std::vector<ValueStatistics> channels;
  ValueStatistics all;
  bool all_percentiles = true;
};

void mapValues(ValueStatistics& s, double a, double b) {
  s.mean = a * s.mean + b;
  s.std = std::abs(a) * s.std;
  std::map<double, double> p;
  // A negative gain turns the order around: the q-th percentile of a*x+b is a times the (100-q)-th (a key
  // within rounding of 100 - q: percentilesRead keeps one of the two).
  for (const auto& [q, v] : s.percentiles) {
    if (a >= 0) {
      p[q] = a * v + b;
      continue;
    }
    const auto mirror = std::find_if(s.percentiles.begin(), s.percentiles.end(),
                                     [&](const auto& e) { return std::abs(e.first - (100 - q)) < 1e-9; });
    if (mirror != s.percentiles.end()) p[q] = a * mirror->second + b;
  }
  s.percentiles = p;
}

void mapCarried(Carried& c, const ChannelAffine& f) {
  const size_t n = c.channels.size();
  bool alike = true;
  for (size_t k = 0; k < n; ++k) {
    mapValues(c.channels[k], at(f.gain, k), at(f.offset, k));
    alike = alike && at(f.gain, k) == at(f.gain, 0) && at(f.offset, k) == at(f.offset, 0);
  }
  // Mean and variance over all channels from the channels' own (the counts weigh them).
  double count = 0, sum = 0, squares = 0;
  for (const auto& s : c.channels) {
    count += s.count;
    sum += s.count * s.mean;
    squares += s.count * (s.std * s.std + s.mean * s.mean);
  }
  const double mean = count > 0 ? sum / count : 0;
  if (alike && n > 0) {
    mapValues(c.all, at(f.gain, 0), at(f.offset, 0));
  } else {
    c.all_percentiles = false;
    c.all.percentiles.clear();
  }
  c.all.mean = mean;
  c.all.std = count > 0 ? std::sqrt(std::max(0.0, squares / count - mean * mean)) : 0;
}

double percentileOf(const ValueStatistics& s, double q, bool known, const std::string& what, size_t channel,
                    bool per_channel) {
  const auto it = s.percentiles.find(q);
  TILER_CHECK(
      known && it != s.percentiles.end(), ConfigError,
      what << ": scale_range's percentile " << q << " over "
           << (per_channel ? "y, x of channel " + std::to_string(channel) : std::string("channel, y, x"))
           << " is not known here: an earlier step maps the channels apart (tiler gathers percentiles "
              "of the image as read)");
  return it->second;
}

}  // namespace

namespace {

// The map of the affine steps at the head of `steps` on values whose statistics are `stats`, after `before`;
// `reference`: the input's statistics as read, for a step that reads them (null: none does).
ChannelAffine affineOf(const std::vector<ProcessingStep>& steps, const ImageStatistics& stats,
                       const ChannelAffine& before, const ImageStatistics* reference,
                       const std::string& what) {
  const size_t n = stats.channels.size();
  TILER_CHECK(n > 0, ConfigError, what << ": no statistics of the image's channels");
  ChannelAffine total;
  for (size_t k = 0; k < n; ++k)
    total.gain.push_back(at(before.gain, k)), total.offset.push_back(at(before.offset, k));
  Carried carried{stats.channels, stats.all, true};
  mapCarried(carried, before);
  for (const auto& step : steps) {
    if (!step.isAffine()) break;
    // The input's statistics are its own, as read: no step of this chain maps them.
    const ImageStatistics* ref = step.reference_input ? reference : nullptr;
    TILER_CHECK(!step.reference_input || ref, ConfigError,
                what << ": " << step.id << " reads the input's statistics, which were not gathered");
    TILER_CHECK(!ref || !step.per_channel || ref->channels.size() == n, ConfigError,
                what << ": " << step.id << " over y, x of each channel matches output channel k to input "
                     << "channel k, but the output has " << n << " channel(s) and the input "
                     << (ref ? ref->channels.size() : 0) << " (give its axes as channel, y, x)");
    ChannelAffine f;
    for (size_t k = 0; k < n; ++k) {
      const ValueStatistics& s = step.per_channel ? carried.channels[k] : carried.all;
      double a = 1, b = 0;
      if (step.id == "scale_linear") {
        a = at(step.gain, k), b = at(step.offset, k);
      } else if (step.id == "zero_mean_unit_variance") {
        a = 1.0 / (s.std + step.eps), b = -s.mean * a;
      } else if (step.id == "scale_mean_variance") {
        // bioimageio.core: (x - mean) / (std + eps) * (ref_std + eps) + ref_mean.
        const ValueStatistics& r = !ref ? s : step.per_channel ? ref->channels[k] : ref->all;
        a = (r.std + step.eps) / (s.std + step.eps), b = r.mean - s.mean * a;
      } else {  // scale_range
        const ValueStatistics& p = ref ? (step.per_channel ? ref->channels[k] : ref->all) : s;
        const bool known = ref || step.per_channel || carried.all_percentiles;
        const double lo = percentileOf(p, step.min_percentile, known, what, k, step.per_channel),
                     hi = percentileOf(p, step.max_percentile, known, what, k, step.per_channel);
        a = 1.0 / (hi - lo + step.eps), b = -lo * a;
      }
      f.gain.push_back(a), f.offset.push_back(b);
    }
    for (size_t k = 0; k < n; ++k) {
      total.gain[k] *= f.gain[k];
      total.offset[k] = total.offset[k] * f.gain[k] + f.offset[k];
    }
    mapCarried(carried, f);
  }
  return total;
}

}  // namespace

ChannelAffine inputAffine(const std::vector<ProcessingStep>& steps, const ImageStatistics& stats,
                          const ChannelAffine& before, const std::string& what) {
  return affineOf(steps, stats, before, nullptr, what);
}

ChannelAffine outputAffine(const std::vector<ProcessingStep>& rest, const ImageStatistics& output,
                           const ImageStatistics* input, const std::string& what) {
  return affineOf(rest, output, ChannelAffine{{1.0}, {0.0}}, input, what);
}

std::pair<std::vector<ProcessingStep>, std::vector<ProcessingStep>> splitAtStatistics(
    const std::vector<ProcessingStep>& steps) {
  auto first =
      std::find_if(steps.begin(), steps.end(), [](const ProcessingStep& s) { return s.usesStatistics(); });
  return {{steps.begin(), first}, {first, steps.end()}};
}

void applyFixedSteps(float* values, int64_t pixels, int channels, const ChannelAffine& affine,
                     const std::vector<ProcessingStep>& steps) {
  const size_t C = size_t(channels);
  for (const auto* list : {&affine.gain, &affine.offset})
    TILER_CHECK(list->size() <= 1 || list->size() == C, ConfigError,
                "a map of " << list->size() << " channels for values of " << C);
  for (const ProcessingStep& s : steps) {
    for (const auto* list : {&s.gain, &s.offset, &s.threshold})
      TILER_CHECK(list->size() <= 1 || list->size() == C, ConfigError,
                  "postprocessing step " << s.id << " has " << list->size() << " values, one a channel, "
                                         << "but the output has " << C << " channels");
    TILER_CHECK(s.id == "scale_linear" || s.id == "clip" || s.id == "sigmoid" || s.id == "softmax" ||
                    s.id == "binarize",
                ConfigError, "step '" << s.id << "' is not one tiler applies to fixed numbers");
  }
  std::vector<float> gain(C, 1.f), offset(C, 0.f);
  for (size_t c = 0; c < C; ++c)
    if (!affine.gain.empty()) gain[c] = float(at(affine.gain, c)), offset[c] = float(at(affine.offset, c));
  for (int64_t i = 0; i < pixels; ++i) {
    float* v = values + i * int64_t(C);
    if (!affine.gain.empty())
      for (size_t c = 0; c < C; ++c) v[c] = v[c] * gain[c] + offset[c];
    for (const ProcessingStep& s : steps) {
      if (s.id == "scale_linear") {
        for (size_t c = 0; c < C; ++c) v[c] = v[c] * float(at(s.gain, c)) + float(at(s.offset, c));
      } else if (s.id == "clip") {
        // NaN stays NaN, as torch::clamp keeps it.
        for (size_t c = 0; c < C; ++c) {
          if (std::isfinite(s.min) && v[c] < float(s.min)) v[c] = float(s.min);
          if (std::isfinite(s.max) && v[c] > float(s.max)) v[c] = float(s.max);
        }
      } else if (s.id == "sigmoid") {
        for (size_t c = 0; c < C; ++c) v[c] = 1.f / (1.f + std::exp(-v[c]));
      } else if (s.id == "softmax") {
        float top = -std::numeric_limits<float>::infinity();
        for (size_t c = 0; c < C; ++c) top = std::max(top, v[c]);
        float sum = 0;
        for (size_t c = 0; c < C; ++c) sum += (v[c] = std::exp(v[c] - top));
        for (size_t c = 0; c < C; ++c) v[c] /= sum;
      } else {  // binarize
        for (size_t c = 0; c < C; ++c) v[c] = v[c] > float(at(s.threshold, c)) ? 1.f : 0.f;
      }
    }
  }
}

std::vector<ProcessingStep> fixedTail(const std::vector<ProcessingStep>& steps) {
  auto first =
      std::find_if(steps.begin(), steps.end(), [](const ProcessingStep& s) { return !s.isAffine(); });
  return {first, steps.end()};
}

// ---- statistics ----

namespace {

ValueStatistics sortedStatistics(std::vector<double> v, const std::vector<double>& percentiles) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  ValueStatistics s;
  s.count = double(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / s.count;
  double m2 = 0;
  for (double x : v) m2 += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(m2 / s.count);
  for (double q : percentiles) {
    const double pos = (s.count - 1) * q / 100.0;
    const size_t k = size_t(std::floor(pos));
    const double frac = pos - double(k);
    s.percentiles[q] = frac > 0 && k + 1 < v.size() ? v[k] + frac * (v[k + 1] - v[k]) : v[k];
  }
  return s;
}

}  // namespace

ImageStatistics exactStatistics(const std::vector<std::vector<double>>& channels,
                                const std::vector<double>& percentiles) {
  ImageStatistics out;
  std::vector<double> all;
  for (const auto& c : channels) {
    out.channels.push_back(sortedStatistics(c, percentiles));
    all.insert(all.end(), c.begin(), c.end());
  }
  out.all = sortedStatistics(std::move(all), percentiles);
  return out;
}

StatisticsGatherer::StatisticsGatherer(int channels, bool exact, std::vector<double> percentiles)
    : channels_(channels),
      exact_(exact),
      percentiles_(std::move(percentiles)),
      moments_(size_t(channels)),
      hists_(size_t(channels) + 1) {
  if (exact_)
    for (auto& h : hists_) h.bins.assign(size_t(1) << 16, 0);
}

void StatisticsGatherer::Moments::merge(double n2, double mean2, double m22) {
  if (n2 <= 0) return;
  const double total = n + n2, delta = mean2 - mean;
  mean += delta * n2 / total;
  m2 += m22 + delta * delta * n * n2 / total;
  n = total;
}

void StatisticsGatherer::addRange(int channel, const float* values, int64_t n) {
  for (Histogram* h : {&hists_[size_t(channel)], &hists_.back()})
    for (int64_t i = 0; i < n; ++i) {
      const double v = values[i];
      if (std::isnan(v)) continue;
      h->lo = std::min(h->lo, v), h->hi = std::max(h->hi, v);
    }
}

void StatisticsGatherer::add(int channel, const float* values, int64_t n) {
  // The band's own mean and sum of squared deviations (two passes over it, in double), merged into the
  // image's: no sum of squares over the whole image, which would cancel for a large mean.
  double count = 0, sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(values[i])) count += 1, sum += values[i];
  if (count == 0) return;
  const double mean = sum / count;
  double m2 = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(values[i])) m2 += (values[i] - mean) * (values[i] - mean);
  moments_[size_t(channel)].merge(count, mean, m2);
  Histogram& h = hists_[size_t(channel)];
  Histogram& all = hists_.back();
  if (exact_) {
    for (int64_t i = 0; i < n; ++i) {
      const double v = values[i];
      TILER_CHECK(v >= 0 && v <= 65535 && v == std::floor(v), ConfigError,
                  "statistics: value " << v << " of a 16-bit image is no 16-bit integer");
      ++h.bins[size_t(v)];
      ++all.bins[size_t(v)];
    }
    return;
  }
  if (percentiles_.empty()) return;
  for (Histogram* hist : {&h, &all}) {
    if (hist->bins.empty()) hist->bins.assign(size_t(kFloatBins), 0);
    const double width = (hist->hi - hist->lo) / kFloatBins;
    for (int64_t i = 0; i < n; ++i) {
      const double v = values[i];
      if (std::isnan(v)) continue;
      const double bin = width > 0 ? std::floor((v - hist->lo) / width) : 0;
      ++hist->bins[size_t(std::clamp(bin, 0.0, double(kFloatBins - 1)))];
    }
  }
}

ValueStatistics StatisticsGatherer::statistics(const Moments& m, const Histogram& h) const {
  ValueStatistics s;
  s.count = m.n;
  s.mean = m.mean;
  s.std = m.n > 0 ? std::sqrt(m.m2 / m.n) : 0;
  if (m.n <= 0 || h.bins.empty()) return s;
  const double width = exact_ ? 1 : (h.hi - h.lo) / kFloatBins;
  // The k-th smallest value (0-based): exact for an integer histogram; else the bin's lower edge plus the
  // share of its count below k (within one bin's width), the extremes themselves exact.
  auto kth = [&](int64_t k) {
    if (!exact_ && k <= 0) return h.lo;
    if (!exact_ && k >= int64_t(m.n) - 1) return h.hi;
    int64_t below = 0;
    for (size_t b = 0; b < h.bins.size(); ++b) {
      if (below + h.bins[b] > k) {
        if (exact_) return double(b);
        const double share = (double(k - below) + 0.5) / double(h.bins[b]);
        return std::min(h.hi, h.lo + (double(b) + share) * width);
      }
      below += h.bins[b];
    }
    return exact_ ? double(h.bins.size() - 1) : h.hi;
  };
  for (double q : percentiles_) {
    // numpy's linear method: position (n - 1) q / 100 between the two values either side.
    const double pos = (m.n - 1) * q / 100.0;
    const int64_t k = int64_t(std::floor(pos));
    const double lo = kth(k), frac = pos - double(k);
    s.percentiles[q] = frac > 0 ? lo + frac * (kth(k + 1) - lo) : lo;
  }
  return s;
}

ImageStatistics StatisticsGatherer::finish() const {
  ImageStatistics out;
  Moments all;
  for (int c = 0; c < channels_; ++c) {
    const Moments& m = moments_[size_t(c)];
    all.merge(m.n, m.mean, m.m2);
    out.channels.push_back(statistics(m, hists_[size_t(c)]));
  }
  out.all = statistics(all, hists_.back());
  return out;
}

}  // namespace tiler
