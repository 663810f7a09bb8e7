// Test slides made with the real clients users have: an Aperio-style SVS (a JPEG-tiled pyramid written by
// libvips whose first ImageDescription is Aperio's, with MPP and AppMag, which OpenSlide reads as vendor
// aperio) and the plain pyramidal TIFF it is made from.
#pragma once

#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>

#include "test_util.hpp"

namespace tiler::test {

inline bool haveSlideTools() {
  return runCommand("command -v vips && command -v tiffset && command -v openslide-show-properties").code ==
         0;
}

// `rgb` (RGB order) as a plain JPEG-tiled pyramidal TIFF at `plain` (tiles 256, levels down to one tile),
// and the same file with Aperio's description at `svs` (when not empty).
inline void makeSlide(const cv::Mat& rgb, const std::string& plain, const std::string& svs, double mpp = 0.25,
                      int app_mag = 40) {
  const std::string png = plain + ".src.png";
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  ASSERT_TRUE(cv::imwrite(png, bgr));
  auto r = runCommand("vips tiffsave " + png + " " + plain +
                      " --compression jpeg --Q 90 --tile --tile-width 256 --tile-height 256 --pyramid");
  ASSERT_EQ(r.code, 0) << r.output;
  std::filesystem::remove(png);
  if (svs.empty()) return;
  std::filesystem::copy_file(plain, svs, std::filesystem::copy_options::overwrite_existing);
  std::ostringstream description;
  description << "Aperio Image Library v12.0.5\n"
              << rgb.cols << "x" << rgb.rows << " [0,0 " << rgb.cols << "x" << rgb.rows
              << "] (256x256) JPEG/RGB Q=90|AppMag = " << app_mag << "|MPP = " << mpp
              << "|ScanScope ID = TILER";
  r = runCommand("tiffset -d 0 -s 270 '" + description.str() + "' " + svs);
  ASSERT_EQ(r.code, 0) << r.output;
}

}  // namespace tiler::test
