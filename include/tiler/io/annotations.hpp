// annotations: vector labels for training (`tiler finetune --annotations`): the Polygon/MultiPolygon
// annotations of a GeoJSON file (QuPath's export read as --roi reads it: objectType annotation,
// classification.name; level-0 pixels, or a georeferenced image's CRS), each a class of --classes by name,
// drawn per window at the window's resolution; and window labels (`--window_labels`): a CSV of one class a
// window, for per-window ([B,K]) classification training.
// Promise: a pixel belongs to the class of the last annotation in the file whose polygon holds its centre
// (even-odd per polygon: holes are out), so where annotations overlap the later one wins; a pixel no
// annotation holds is unlabelled (coverage 0). A class name that is not one of the classes (an unclassified
// annotation too) is refused by name, with the file. Immutable once read: any thread may rasterise. No
// LibTorch. A window label's class is a name of the classes or a whole number >= 0; a row that is neither, a
// header that is not `image,x,y,label`, or a window labelled twice is refused with the file and the line.
#pragma once

#include <opencv2/core.hpp>
#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/mask.hpp"

namespace tiler {

class AnnotationLabels {
 public:
  // The annotations of `file` for the image `info` describes (its level 0), each mapped to its index in
  // `classes`. Throws IoError naming the file: what readRoi refuses, a class not in `classes`.
  static AnnotationLabels read(const std::string& file, const ImageInfo& info,
                               const std::vector<std::string>& classes);

  // The labels of `window`, a rectangle of a map whose pixels are 1/pixels_per_level0 level-0 pixels wide:
  // `classes` (CV_32F, the class index, 0 where unlabelled) and `covered` (CV_32F, 1 where an annotation
  // holds the pixel's centre), both window-sized.
  void rasterize(const Rect& window, double pixels_per_level0, cv::Mat& classes, cv::Mat& covered) const;
  size_t size() const { return polygons_.size(); }

 private:
  std::vector<RoiPolygon> polygons_;  // level-0 pixels, in file order
  std::vector<int> class_ids_;        // each polygon's class
  std::vector<cv::Rect2d> bounds_;    // each polygon's bounding box, level-0 pixels
};

// One row of a --window_labels CSV: the class of the window whose top-left corner is (x, y).
struct WindowLabel {
  std::string image;    // an image's file name or its stem
  double x = 0, y = 0;  // level-0 pixels
  int label = 0;        // index into the classes
  int line = 0;         // the row's line in the file, for messages
};

// The largest window labels CSV read (a row a window: millions of rows).
constexpr int64_t kMaxWindowLabelsBytes = int64_t(1) << 30;
// The rows of `file`: a header `image,x,y,label` (after a UTF-8 byte order mark, as Excel writes), then a
// row a window (blank lines skipped, fields trimmed, a field may be in double quotes); `label` a name of
// `classes` or a class index. Throws IoError naming the file and the line, or the file and why it is not
// read (not a regular file, over kMaxWindowLabelsBytes).
std::vector<WindowLabel> readWindowLabels(const std::string& file, const std::vector<std::string>& classes);

}  // namespace tiler
