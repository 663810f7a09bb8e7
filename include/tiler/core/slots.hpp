// slots: a step's window slots, the value every stage of a step speaks. The loader fills one per slot of a
// batch, the step exchange sends them to every rank, the outputs stitch by them. No torch, no I/O.
// Promise: a slot that holds a window names its image and its global window index (catalog order); a
// padding slot names neither (-1, kPadded).
#pragma once

#include <cstdint>
#include <vector>

namespace tiler {

// What became of a slot's window. The values travel between ranks: do not renumber them.
enum class SlotStatus : int64_t {
  kOk = 0,       // read (and, once forwarded, predicted)
  kPadded = 1,   // no window: the batch's tail past the shard, or a pad slot of the deal
  kFailed = 2,   // its image failed here (a read or a forward)
  kSkipped = 3,  // its image had already failed: not read
};

struct WindowSlot {
  int image = -1;       // catalog image id
  int64_t window = -1;  // global window index
  SlotStatus status = SlotStatus::kPadded;
  int64_t record_bytes = 0;  // a task that exchanges records (instances): the bytes of this slot's record

  bool ok() const { return status == SlotStatus::kOk; }
};

using StepSlots = std::vector<WindowSlot>;

}  // namespace tiler
