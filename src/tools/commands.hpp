// The `tiler info` and `tiler overlay` commands: tools for looking at inputs and results, outside the
// library.
#pragma once

#include <string>
#include <vector>

#include "tiler/grid.hpp"

namespace tiler::tools {

// `tiler info`: what the reader sees, and the grid when window is given. Returns an exit code.
int runInfo(const std::vector<std::string>& paths, const std::string& window, const std::string& overlap);

// A colour overlay PNG of `labels` on `image`, at most max_side pixels a side (for looking at results);
// with a grid, the outlines of its windows too.
void writeOverlay(const std::string& image_path, const std::string& labels_path, const std::string& out_path,
                  int max_side = 2048, const GridSpec* grid = nullptr);

}  // namespace tiler::tools
