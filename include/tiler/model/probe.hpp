// model/probe: what a model's output is, as the tasks and the output stage see it, without the model: its
// precision, activation and test-time augmentation words, and a probe's result (channels in and out, the
// output's scale, its task). Promise: plain data and word parsing (ConfigError naming the flag); no LibTorch,
// so the tasks and the stitcher read a probe without depending on the model that made it.
#pragma once

#include <string>

#include "tiler/core/grid.hpp"

namespace tiler {

// What a model's output is for: a row of tasks/registry (tasks/task.hpp); null: --task auto, the output's
// shape decides.
class Task;

enum class Precision { kFp32, kFp16, kBf16 };
enum class Activation { kNone, kSoftmax, kSigmoid };
Activation parseActivation(const std::string& name);
// The score above which a one-channel map is label 1: 0.5 for sigmoid probabilities, 0 for logits.
float labelThreshold(Activation activation);
// Test-time augmentation: each window also runs mirrored (flip: left-right; d4: the 8 rotations and
// mirrors of a square), in the same batch; predictions are mapped back and averaged after the activation.
enum class Tta { kNone, kFlip, kD4 };
Tta parseTta(const std::string& name);
const char* ttaName(Tta tta);
const char* precisionName(Precision p);

struct ModelProbe {
  int input_channels = 0;      // what the model takes
  int output_channels = 0;     // segment: channels C; classify: classes K; embed: features D
  Scale scale;                 // output size / window size (segment)
  const Task* task = nullptr;  // the probe's (null: not probed)
};

}  // namespace tiler
