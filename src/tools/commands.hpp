// The `tiler check-model` command: a tool for looking at a model, outside the library (`tiler info` and
// `tiler overlay` are the library's, infer/inspect.hpp).
#pragma once

#include <string>

namespace tiler::tools {

// `tiler check-model`: runs a bioimage.io card's test input through its model as infer runs it (the card's
// normalisation and activation, fp32 on `device`) and compares with its test output under the card's
// tolerance; prints the largest difference. Returns 0 when within it, 1 when not.
int checkModel(const std::string& card_path, const std::string& device);

}  // namespace tiler::tools
