// json_document: JSON documents that come from outside (an ROI, finetune's annotations, a WSInfer config)
// parsed within bounds. Promise: nesting deeper than kMaxJsonDepth is refused as the parse reaches it (a
// document nested 100000 deep would otherwise crash the first recursive copy of it), and objects that `keep`
// turns down are dropped while the text streams, so they are never held (a QuPath export's 300000
// detections, read for its few annotations). Failures are returned as messages; each caller names the file
// in its own error type. No LibTorch.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace tiler {

constexpr int kMaxJsonDepth = 64;

// Whether to keep an object the parse has just completed at `depth` (0: the document itself).
using JsonKeep = std::function<bool(int depth, const nlohmann::json& object)>;

// The document in `text`, or nullopt with `error` set: nlohmann's parse error, or the nesting limit.
std::optional<nlohmann::json> parseJsonDocument(const std::string& text, std::string& error,
                                                const JsonKeep& keep = {});

}  // namespace tiler
