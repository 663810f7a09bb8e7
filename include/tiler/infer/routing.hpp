// routing: a step's windows to the owners of their images, as free functions over the step's slots.
// Promise: every rank, given the same window lists (every rank's StepSlots) and owners, makes the same
// gathers in the same order (one per owner with windows in the step) and the owner gets each rank's windows
// in rank order, each rank's in slot order; a rank that owns none of the step's windows gets an empty
// StepResult. The collective is the caller's (RouteContext::gather), so a test drives these without a process
// group.
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "tiler/core/slots.hpp"
#include "tiler/stitch/outputs.hpp"

namespace tiler {

struct RouteContext {
  int rank = 0, world_size = 1;
  std::vector<int> owners;  // each image's owner (assignOwners)
  // Rank `owner`'s concatenation (along dim 0) of every rank's `part` (every rank calls it, in the same
  // order); `what` names it for a timeout's message.
  std::function<torch::Tensor(const torch::Tensor& part, int owner, const std::string& what)> gather;
};

// Every rank's predictions of a step (`preds`: [slots, window_sizes...]) to their owners: the whole batch as
// it is when every window goes to one owner, else this owner's slots packed and padded with zeros to the most
// any rank sends it.
StepResult routePredictions(const std::vector<StepSlots>& every_rank, const torch::Tensor& preds,
                            const std::vector<int64_t>& window_sizes, const RouteContext& ctx,
                            const std::string& what);
// Object tasks: each slot's record (slot.record_bytes of it) to its owner, every rank's end to end and padded
// to the most bytes any rank sends that owner.
StepResult routeRecords(const std::vector<StepSlots>& every_rank, const std::vector<std::string>& records,
                        const RouteContext& ctx, const std::string& what);

}  // namespace tiler
