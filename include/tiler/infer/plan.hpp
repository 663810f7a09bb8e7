// plan: `tiler infer`'s flags parsed and checked once, into typed values the job's phases read (no flag
// string is looked at again past planInfer: each task's own flags are parsed here into its settings).
// Promise: planInfer throws a ConfigError naming the flag for any value tiler cannot run; what depends on the
// model (the task --task auto becomes, each head's outputs) is settled by the job after the probe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/infer/options.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/mask.hpp"
#include "tiler/io/polygons.hpp"
#include "tiler/io/resolution.hpp"
#include "tiler/model/model.hpp"
#include "tiler/tasks/heads.hpp"
#include "tiler/tasks/task.hpp"

namespace tiler {

enum class StitchPlace { kAuto, kHost, kDevice };  // --stitch

// A head of a model with several outputs (--heads): its own task, flags and outputs, and where its values
// lie in each window's prediction (offset, values: set after the probe).
struct InferHead {
  HeadSpec spec;
  const Task* task = nullptr;  // its own, or --task (null: auto)
  // Its flags (the job's, with its --head_opt settings) and every task's settings of them; kinds: its
  // --save, or (after the probe) its task's defaults.
  TaskFlags flags;
  ModelProbe probe;
  int64_t offset = 0, values = 0;
};

struct InferPlan {
  GridSpec spec;
  PadMode pad = PadMode::kConstant;
  StitchPlace stitch_place = StitchPlace::kAuto;
  MaskSpec mask;
  std::vector<int> channels;  // --channels
  ResolutionSpec resolution;
  const Task* task = nullptr;  // --task (null: auto; the probe says what it becomes)
  // What every task reads (--activation, --classes, --tta, ...; kinds: --save, empty until the task's
  // defaults are known) and each task's own flags parsed into its settings.
  TaskFlags flags;
  bool abort_on_error = false;             // --on_error abort
  std::optional<Compression> compression;  // unset: each output's default
  std::vector<InferHead> heads;            // --heads; empty: one output
};

// Parses and checks `o`'s flags; caps its thread counts (usefulThreads) and fills its defaulted inputs and
// report path.
InferPlan planInfer(InferOptions& o);

}  // namespace tiler
