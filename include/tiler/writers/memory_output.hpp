// writers/memory_output: an output directory in memory, for a caller in the same process (the Python module's
// predict): the job writes into "memory:out-<n>" as into any directory, and nothing reaches the disk. A
// stitched map's labels and probabilities are kept as arrays (map_writers' memory writer: the values the
// labels and probs files hold, labels H x W, probabilities C x H x W of the stored type), a text output
// (GeoJSON, CSV, COCO: a TextFile) as the bytes its file would hold, and the run's report as its JSON. The
// job takes no lock and leaves no reading mark there; a format whose writer needs files is refused
// (memoryKindRefusal). No LibTorch. Promise: thread safe; a result is kept from its writer's commit until
// taken or its directory unregistered; an uncommitted writer keeps nothing; an array is allocated once, at
// its final size, and filled in place.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tiler/io/image_io.hpp"

namespace tiler {

// One kept array: `shape` ({H, W} or {C, H, W}) of `type`, row-major in `data`.
struct MemoryArray {
  SampleType type = SampleType::kU8;
  std::vector<int64_t> shape;
  std::unique_ptr<uint8_t[]> data;  // new[]: a caller may take it (release) and delete[] it
};

// A new output directory in memory, "memory:out-<n>", until unregistered (what is left there is dropped).
std::string registerMemoryOutput();
void unregisterMemoryOutput(const std::string& dir);
// `path` names an output directory in memory, or a file in one: never the disk.
bool isMemoryOutput(const std::string& path);
// "" when output kind `kind` (--save's word, a head's too) can be kept in memory, else why not.
std::string memoryKindRefusal(const std::string& kind);

// A committed output at `path`, taken (nullopt: none, or another kind of result).
std::optional<MemoryArray> takeMemoryArray(const std::string& path);
std::optional<std::string> takeMemoryText(const std::string& path);
// Keeps `bytes` (a TextFile's commit, the report) or `array` (the map writers') as the committed output at
// `path`; an IoError when its directory is not registered.
void keepMemoryText(const std::string& path, std::string bytes);
void keepMemoryArray(const std::string& path, MemoryArray array);

}  // namespace tiler
