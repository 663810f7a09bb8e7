// inspect: `tiler info` and `tiler overlay`, for looking at inputs and results: what the reader sees in an
// image, the resolution, window grid and mask a job would plan over it (the catalog's own description, so
// info and infer agree), and a colour overlay PNG of a labels output with its grid and mask.
// Promise: neither writes over a file it reads (PathRoles: a ConfigError naming both, before anything is
// read); info prints one block an image and goes on past an image it cannot read (kExitSomeFailed).
#pragma once

#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/io/mask.hpp"
#include "tiler/io/resolution.hpp"

namespace tiler {

struct InfoOptions {
  std::vector<std::string> paths;
  std::string window, overlap = "0.25";  // window given: the grid too
  std::string mask = "none";             // auto | PATH: the mask's coverage (and kept windows with a grid)
  double mask_fraction = 0.05;
  std::string roi, roi_class;  // a region of interest (as infer's --roi, --roi_class)
  std::string mask_preview;    // PNG of the coverage map (one input); never an image or mask read (PathRoles)
  ResolutionSpec resolution;   // chosen: the processing resolution, and grid and mask at it
};
// `tiler info`: what the reader sees, and the grid and mask when asked, on stdout (an image that cannot be
// read: a line on stderr naming it). Returns an exit code: kExitOk, or kExitSomeFailed.
int runInfo(const InfoOptions& options);

// A colour overlay PNG of `labels` on `image`, at most max_side pixels a side (for looking at results);
// with a grid, the outlines of its windows; with a mask, its outline. A ConfigError, before anything is
// read, when `out_path` is one of the files it reads (PathRoles).
void writeOverlay(const std::string& image_path, const std::string& labels_path, const std::string& out_path,
                  int max_side = 2048, const GridSpec* grid = nullptr, const MaskSpec* mask = nullptr);

}  // namespace tiler
