// finetune: `tiler finetune`, data-parallel training of a TorchScript model on tiles of image/label pairs,
// over the same catalog, loader (with read-ahead), sampler and step exchange as inference, and fed exactly as
// inference feeds it (the shared JobOptions: scale, mean, std, output key). Its flags and entry point; the
// job is a plan (plan.hpp) and parts: label sources (label_source.hpp: label images, annotations, window
// labels), the data and its split (training_data.hpp), batches (batches.hpp), losses (losses.hpp), validation
// (validation.hpp), checkpoints and the model file (checkpoint.hpp), and the trainer's phases (trainer.hpp).
// Promise: parameters and buffers are broadcast from rank 0 at start, and every rank holds identical
// parameters after each step; an error on any rank ends every rank at that step with its message; --resume
// continues from the epoch rank 0 finds, to the same parameters as an uninterrupted run; the output is a
// TorchScript file that `tiler infer` loads as it is, and that records the window, the µm/px and the classes
// it was trained with (readTrainedSettings) for infer to take. Validation reports per-class IoU and Dice
// every epoch (and accuracy for window labels), in the report, a CSV and a PNG plot beside -o.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tiler/finetune/options.hpp"

namespace tiler {

int runFinetune(const FinetuneOptions& options);

}  // namespace tiler
