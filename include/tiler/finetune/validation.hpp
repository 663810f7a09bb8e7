// finetune/validation: after each epoch, the held-out windows' loss and metrics, summed over every rank: the
// loss, per-class IoU and Dice (and their means), accuracy for window labels, PSNR for --loss mse; and which
// epoch was best (--save_best).
// Promise: a window a sampler repeats to even the ranks' counts is counted once, so the numbers do not depend
// on the world size; a window that fails to read on any rank fails validation on every rank, at the same
// point.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "tiler/dist/exchange.hpp"
#include "tiler/finetune/batches.hpp"
#include "tiler/finetune/losses.hpp"

namespace tiler {

// What validation runs: the model (put in eval mode while it does, then back in training), its loss, the
// batches, and the exchange that sums the ranks' counts.
struct Validator {
  const FinetuneOptions& options;
  const FinetunePlan& plan;
  ModelRunner& runner;
  const Loss& loss;
  const TrainingBatches& batches;
  StepExchange& exchange;
};

// The report's validation fields of an epoch ({} without held-out windows): val_loss, then val_psnr (mse), or
// segmentationMetrics' fields by class name (--classes, else class_K), and val_accuracy for window labels.
// `readers` are validation's own, kept across epochs.
nlohmann::json validate(const Validator& v, const std::vector<WindowRef>& windows, ReaderCache& readers);

// The epoch of `history` with the highest validation mean Dice (the first of equals); 0: none validated.
int bestEpoch(const nlohmann::json& history);

}  // namespace tiler
