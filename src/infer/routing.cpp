#include "tiler/infer/routing.hpp"

#include <algorithm>
#include <cstring>

#include "tiler/dist/exchange.hpp"

namespace tiler {
namespace {

std::string gatherName(const std::string& of, int owner, int world_size) {
  return of + (world_size > 1 ? " for rank " + std::to_string(owner) : "");
}

// This rank's part for one owner: the whole batch when every rank's windows of the step go to it (no copy),
// else this owner's slots (`own`) packed in slot order and padded to `most`.
torch::Tensor predictionPart(const torch::Tensor& preds, const std::vector<int64_t>& own, size_t most,
                             bool everything, const std::vector<int64_t>& window_sizes) {
  if (everything) return preds;
  std::vector<int64_t> sizes = {int64_t(most)};
  sizes.insert(sizes.end(), window_sizes.begin(), window_sizes.end());
  auto part = torch::zeros(sizes, preds.options());
  if (!own.empty()) {
    auto index = torch::tensor(own, torch::kInt64).to(preds.device());
    part.narrow(0, 0, int64_t(own.size())).copy_(preds.index_select(0, index));
  }
  return part;
}

// The gathered slots: each rank's part in rank order, padded to the longest part (`per_rank` slots).
StepSlots gatheredSlots(const std::vector<StepSlots>& every_rank,
                        const std::vector<std::vector<int64_t>>& mine, size_t per_rank, bool everything) {
  StepSlots slots(per_rank * every_rank.size(), WindowSlot{});
  for (size_t r = 0; r < every_rank.size(); ++r) {
    const StepSlots& theirs = every_rank[r];
    auto into = slots.begin() + std::ptrdiff_t(r * per_rank);
    if (everything) {
      std::copy(theirs.begin(), theirs.begin() + std::ptrdiff_t(per_rank), into);
    } else {
      for (int64_t k : mine[r]) *into++ = theirs[size_t(k)];
    }
  }
  return slots;
}

}  // namespace

StepResult routePredictions(const std::vector<StepSlots>& every_rank, const torch::Tensor& preds,
                            const std::vector<int64_t>& window_sizes, const RouteContext& ctx,
                            const std::string& what) {
  const int W = ctx.world_size;
  const auto routes = routeSlots(every_rank, ctx.owners);
  std::vector<int64_t> ok(size_t(W), 0);
  for (int r = 0; r < W; ++r)
    for (const WindowSlot& slot : every_rank[size_t(r)]) ok[size_t(r)] += slot.ok();
  StepResult result;
  for (int owner = 0; owner < W; ++owner) {
    const auto& mine = routes[size_t(owner)];
    size_t most = 0;
    bool everything = true;  // every rank's windows of the step go to this owner
    for (int r = 0; r < W; ++r) {
      most = std::max(most, mine[size_t(r)].size());
      everything = everything && int64_t(mine[size_t(r)].size()) == ok[size_t(r)];
    }
    if (most == 0) continue;
    const torch::Tensor part = predictionPart(preds, mine[size_t(ctx.rank)], most, everything, window_sizes);
    auto gathered = ctx.gather(part, owner, gatherName("the predictions of " + what, owner, W));
    if (owner != ctx.rank) continue;
    result.slots = gatheredSlots(every_rank, mine, size_t(part.size(0)), everything);
    // One rank: its own tensors, not a copy (8 MB a step for two channels of 16 windows of 256 px).
    result.preds = gathered.contiguous();
  }
  return result;
}

StepResult routeRecords(const std::vector<StepSlots>& every_rank, const std::vector<std::string>& records,
                        const RouteContext& ctx, const std::string& what) {
  const int W = ctx.world_size;
  const auto routes = routeSlots(every_rank, ctx.owners);
  StepResult result;
  for (int owner = 0; owner < W; ++owner) {
    const auto& mine = routes[size_t(owner)];
    int64_t longest = 0;
    bool any = false;
    for (int r = 0; r < W; ++r) {
      int64_t bytes = 0;
      for (int64_t k : mine[size_t(r)]) bytes += every_rank[size_t(r)][size_t(k)].record_bytes;
      longest = std::max(longest, bytes);
      any = any || !mine[size_t(r)].empty();
    }
    if (!any) continue;
    auto part = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kUInt8);
    auto* to = reinterpret_cast<char*>(part.data_ptr<uint8_t>());
    for (int64_t k : mine[size_t(ctx.rank)]) {
      const std::string& record = records[size_t(k)];
      std::memcpy(to, record.data(), record.size());
      to += record.size();
    }
    const auto gathered = ctx.gather(part, owner, gatherName("the objects of " + what, owner, W));
    if (owner != ctx.rank) continue;
    const auto* base = reinterpret_cast<const char*>(gathered.data_ptr<uint8_t>());
    for (int r = 0; r < W; ++r) {
      const char* at = base + r * part.size(0);
      for (int64_t k : mine[size_t(r)]) {
        const WindowSlot& slot = every_rank[size_t(r)][size_t(k)];
        result.slots.push_back(slot);
        result.records.emplace_back(at, size_t(slot.record_bytes));
        at += slot.record_bytes;
      }
    }
  }
  return result;
}

}  // namespace tiler
