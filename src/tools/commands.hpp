// The `tiler info`, `tiler overlay` and `tiler check-model` commands: tools for looking at inputs, results
// and models, outside the library.
#pragma once

#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/io/mask.hpp"
#include "tiler/io/resolution.hpp"

namespace tiler::tools {

struct InfoOptions {
  std::vector<std::string> paths;
  std::string window, overlap = "0.25";  // window given: the grid too
  std::string mask = "none";             // auto | PATH: the mask's coverage (and kept windows with a grid)
  double mask_fraction = 0.05;
  std::string roi, roi_class;  // a region of interest (as infer's --roi, --roi_class)
  std::string mask_preview;    // PNG of the coverage map (one input); never an image or mask read (PathRoles)
  ResolutionSpec resolution;   // chosen: the processing resolution, and grid and mask at it
};
// `tiler info`: what the reader sees, and the grid and mask when asked. Returns an exit code.
int runInfo(const InfoOptions& options);

// `tiler check-model`: runs a bioimage.io card's test input through its model as infer runs it (the card's
// normalisation and activation, fp32 on `device`) and compares with its test output under the card's
// tolerance; prints the largest difference. Returns 0 when within it, 1 when not.
int checkModel(const std::string& card_path, const std::string& device);

// A colour overlay PNG of `labels` on `image`, at most max_side pixels a side (for looking at results);
// with a grid, the outlines of its windows; with a mask, its outline. A ConfigError, before anything is
// read, when `out_path` is one of the files it reads (PathRoles).
void writeOverlay(const std::string& image_path, const std::string& labels_path, const std::string& out_path,
                  int max_side = 2048, const GridSpec* grid = nullptr, const MaskSpec* mask = nullptr);

}  // namespace tiler::tools
