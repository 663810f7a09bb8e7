#include "tiler/finetune/plan.hpp"

#include <cmath>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/dist/session.hpp"
#include "tiler/finetune/label_source.hpp"
#include "tiler/io/polygons.hpp"

namespace tiler {
namespace {

LossKind parseLoss(const std::string& name) {
  if (name == "ce") return LossKind::kCe;
  if (name == "bce") return LossKind::kBce;
  if (name == "mse") return LossKind::kMse;
  if (name == "dice") return LossKind::kDice;
  TILER_THROW(ConfigError, "--loss must be ce, bce, mse or dice; got '" << name << "'");
}

// --class_weights: auto, or one weight >= 0 a class.
void planClassWeights(const FinetuneOptions& o, FinetunePlan& plan) {
  if (o.class_weights.empty()) return;
  TILER_CHECK(plan.loss == LossKind::kCe || plan.loss == LossKind::kDice, ConfigError,
              "--class_weights weigh the classes of --loss ce or dice");
  if (o.class_weights == "auto") {
    plan.auto_class_weights = true;
    return;
  }
  std::stringstream list(o.class_weights);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const double w = std::strtod(item.c_str(), &end);
    TILER_CHECK(!item.empty() && *end == 0 && std::isfinite(w) && w >= 0, ConfigError,
                "--class_weights: '" << item << "' is not a number >= 0 (auto | w1,w2,...)");
    plan.class_weights.push_back(float(w));
  }
}

// The labels' flags: the classes, which source, what unlabeled pixels are, the source's own checks, weights.
void planLabels(const FinetuneOptions& o, FinetunePlan& plan) {
  for (const auto& c : parseClasses(o.classes)) plan.class_names.push_back(c.name);
  plan.labels = &chooseLabelSource(o);
  TILER_CHECK(o.unlabeled == "ignore" || o.unlabeled == "background", ConfigError,
              "--unlabeled must be ignore or background; got '" << o.unlabeled << "'");
  plan.unlabeled_background = o.unlabeled == "background";
  plan.labels->settle(o, plan);
  planClassWeights(o, plan);
}

}  // namespace

FinetunePlan planFinetune(FinetuneOptions& o) {
  FinetunePlan plan;
  // The flags infer shares (--channels too: refused here, in one line, before anything is read).
  const JobPlan job = planJob(o);
  plan.spec = job.spec;
  plan.pad = job.pad;
  plan.loss = parseLoss(o.loss);
  // --batch_size is planJob's; these words are the ones this check has always said.
  TILER_CHECK(o.epochs >= 1 && o.lr > 0, ConfigError, "--epochs, --batch_size and --lr must be positive");
  TILER_CHECK(o.grad_accum_steps >= 1, ConfigError, "--grad_accum_steps must be >= 1");
  TILER_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, ConfigError, "--val_fraction must be in [0,1)");
  TILER_CHECK(o.schedule == "constant" || o.schedule == "cosine", ConfigError,
              "--schedule: constant or cosine");
  plan.schedule = o.schedule == "cosine" ? Schedule::kCosine : Schedule::kConstant;
  TILER_CHECK(o.optimizer == "adam" || o.optimizer == "sgd", ConfigError,
              "--optimizer must be adam or sgd; got '" << o.optimizer << "'");
  plan.optimizer = o.optimizer == "adam" ? OptimizerKind::kAdam : OptimizerKind::kSgd;
  TILER_CHECK(!o.resume || !o.checkpoint_dir.empty(), ConfigError, "--resume needs --checkpoint_dir");
  if (o.report.empty()) o.report = o.output + ".report.json";
  planLabels(o, plan);
  TILER_CHECK(o.loss_scale >= 0 && std::isfinite(o.loss_scale) && o.loss_scale_growth_steps >= 1, ConfigError,
              "--loss_scale must be a finite number >= 0 and its growth steps >= 1");
  return plan;
}

double learningRate(const FinetuneOptions& o, const FinetunePlan& plan, double progress) {
  const double warm = o.epochs > 0 ? double(o.warmup_epochs) / double(o.epochs) : 0.0;
  if (progress < warm) return o.lr * (progress + 1e-9) / warm;
  if (plan.schedule == Schedule::kCosine) {
    const double t = warm < 1.0 ? (progress - warm) / (1.0 - warm) : 1.0;
    return o.lr * 0.5 * (1.0 + std::cos(M_PI * std::min(t, 1.0)));
  }
  return o.lr;
}

}  // namespace tiler
