#include "tiler/finetune/validation.hpp"

#include <torch/script.h>

#include <cmath>

#include "tiler/finetune/label_source.hpp"
#include "tiler/finetune/train_metrics.hpp"

namespace tiler {

nlohmann::json validate(const Validator& v, const std::vector<WindowRef>& windows, ReaderCache& readers) {
  nlohmann::json j = nlohmann::json::object();
  if (windows.empty()) return j;
  torch::NoGradGuard ng;
  v.runner.module().eval();
  std::vector<bool> padded;
  auto mine = v.batches.epochWindows(windows, 0, false, &padded);
  const bool mse = v.plan.loss == LossKind::kMse, per_window = v.plan.labels->per_window;
  const int64_t classes = metricClasses(v.plan.loss, v.runner.probed().output_channels);
  // Sums over all ranks: loss*pixels, pixels, squared error, per-class intersection / prediction / target.
  auto stats = torch::zeros({3 + 3 * classes}, torch::kDouble);
  const size_t B = size_t(v.options.batch_size);
  auto failure = captureFailure([&] {
    auto loader = v.batches.loader(mine, readers, false);
    for (size_t s = 0; s < mine.size(); s += B) {
      std::vector<WindowRef> refs(mine.begin() + long(s), mine.begin() + long(std::min(mine.size(), s + B)));
      auto [x, target, mask] = v.batches.next(*loader, refs, -1);
      for (size_t k = 0; k < refs.size(); ++k)
        if (padded[s + k]) mask[int64_t(k)].zero_();  // a duplicate counts once
      auto out = v.runner.apply(x);
      const double pixels = mask.sum().item<double>();
      stats[0] += v.loss(out, target, mask).item<double>() * pixels;
      stats[1] += pixels;
      if (mse) {
        stats[2] += ((out - target).pow(2).mean(1) * mask).sum().item<double>();
        continue;
      }
      const torch::Tensor pred = v.loss.predict(out);
      auto truth = (per_window ? target.reshape({-1}) : target.squeeze(1)).to(torch::kLong);
      auto m = (per_window ? mask.reshape({-1}) : mask) > 0;
      for (int64_t c = 0; c < classes; ++c) {
        auto p = (pred == c) & m, t = (truth == c) & m;
        stats[3 + 3 * c] += (p & t).sum().item<double>();
        stats[4 + 3 * c] += p.sum().item<double>();
        stats[5 + 3 * c] += t.sum().item<double>();
      }
    }
  });
  v.exchange.check(failure, "the validation status");
  v.exchange.allreduceSum(stats, "the validation metrics");
  auto a = stats.accessor<double, 1>();
  const double pixels = std::max(a[1], 1.0);
  j["val_loss"] = a[0] / pixels;
  if (mse) {
    j["val_psnr"] = 10.0 * std::log10(1.0 / std::max(a[2] / pixels, 1e-12));  // targets in [0,1]
  } else {
    std::vector<ClassCounts> counts;
    for (int64_t c = 0; c < classes; ++c) counts.push_back({a[3 + 3 * c], a[4 + 3 * c], a[5 + 3 * c]});
    std::vector<std::string> names = v.plan.class_names;
    for (int64_t c = int64_t(names.size()); c < classes; ++c) names.push_back("class_" + std::to_string(c));
    j.update(segmentationMetrics(counts, names));
    if (per_window) {
      // A window is right when its class is: the classes' intersections summed, over the windows counted.
      double right = 0;
      for (const auto& c : counts) right += c.intersection;
      j["val_accuracy"] = right / pixels;
    }
  }
  v.runner.module().train();
  return j;
}

int bestEpoch(const nlohmann::json& history) {
  int best = 0;
  double best_dice = -1;
  for (const auto& e : history)
    if (e.contains("val_dice") && e["val_dice"].get<double>() > best_dice) {
      best_dice = e["val_dice"].get<double>();
      best = e["epoch"].get<int>();
    }
  return best;
}

}  // namespace tiler
