#include "tiler/infer/forward.hpp"

#include <spdlog/spdlog.h>

#include <set>

#include "tiler/core/error.hpp"

namespace tiler {

std::vector<int64_t> BatchForward::sizesOf(int64_t windows) const {
  std::vector<int64_t> sizes = {windows};
  sizes.insert(sizes.end(), spec_.window_sizes.begin(), spec_.window_sizes.end());
  return sizes;
}

torch::Tensor BatchForward::zeros() const {
  return torch::zeros(sizesOf(spec_.batch_size), torch::TensorOptions(spec_.to).dtype(spec_.type));
}

torch::Tensor BatchForward::toDestination(const torch::Tensor& preds) const {
  if (preds.device() == spec_.to) return preds.contiguous();
  // To a CPU from a GPU: into page-locked memory, queued on the stream (the forward's synchronize() waits).
  // A pageable copy stops the stream and goes through the driver's staging buffer, a large part of a small
  // model's forward (docs/gpu.md).
  auto host = torch::empty(preds.sizes(), preds.options().device(spec_.to).pinned_memory(spec_.to.is_cpu()));
  host.copy_(preds, /*non_blocking=*/true);
  return host;
}

torch::Tensor BatchForward::run(ModelRunner& model, WindowBatch& batch, int64_t fault_slot) {
  torch::Tensor out;  // the forward's own output when one forward covers the batch, else zeros filled in
  if (batch.valid > 0) forwardSlots(model, batch, 0, spec_.batch_size, fault_slot, out);
  return out.defined() ? out : zeros();
}

void BatchForward::forwardSlots(ModelRunner& model, WindowBatch& batch, int64_t first, int64_t count,
                                int64_t fault_slot, torch::Tensor& out) {
  bool any = false;
  for (int64_t j = first; j < first + count; ++j) any = any || batch.slots[size_t(j)].ok();
  if (!any) return;
  std::string message;
  try {
    if (fault_slot >= first && fault_slot < first + count) faults_.in_forward();
    auto preds =
        model.forward(batch.pixels.narrow(0, first, count), batch.scales.narrow(0, first, count),
                      batch.affine.defined() ? batch.affine.narrow(0, first, count) : torch::Tensor());
    TILER_CHECK(preds.sizes() == torch::IntArrayRef(sizesOf(count)), ModelError,
                "the model's output is " << preds.sizes() << " for " << count << " windows, not "
                                         << torch::IntArrayRef(sizesOf(count)) << " as for the first");
    if (!out.defined() && count == spec_.batch_size) {
      out = toDestination(preds);
      return;
    }
    out.narrow(0, first, count).copy_(preds);
    return;
  } catch (const std::exception& e) {
    if (count > 1 && isOutOfMemory(e)) {
      // Out of memory: the same windows in halves, down to one at a time; the outputs do not change.
      if (!oom_logged_.exchange(true))
        spdlog::warn("[rank {}] out of memory in a forward of {} windows: retrying in halves", spec_.rank,
                     count);
      const int64_t half = count / 2;
      if (!out.defined()) out = zeros();
      forwardSlots(model, batch, first, half, fault_slot, out);
      forwardSlots(model, batch, first + half, count - half, fault_slot, out);
      return;
    }
    message = describeException(std::current_exception());
  } catch (...) {
    message = describeException(std::current_exception());
  }
  failSlots(batch, first, count, message);
}

// The images of these slots fail, wherever their other windows are; the run goes on.
void BatchForward::failSlots(WindowBatch& batch, int64_t first, int64_t count,
                             const std::string& message) const {
  std::set<int> images;
  for (int64_t j = first; j < first + count; ++j) {
    WindowSlot& slot = batch.slots[size_t(j)];
    if (!slot.ok()) continue;
    slot.status = SlotStatus::kFailed;
    if (images.insert(slot.image).second)
      batch.failures.emplace_back(slot.image, errorRankPrefix() + "'" + catalog_.image(slot.image).input +
                                                  "': the model's forward failed: " + message);
  }
}

}  // namespace tiler
