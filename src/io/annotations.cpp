#include "tiler/io/annotations.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

namespace tiler {

AnnotationLabels AnnotationLabels::read(const std::string& file, const ImageInfo& info,
                                        const std::vector<std::string>& classes) {
  AnnotationLabels labels;
  std::vector<std::string> names;
  labels.polygons_ = readRoi(file, "", &names);
  roiToPixels(info, labels.polygons_);
  std::string known;
  for (const auto& c : classes) known += (known.empty() ? "" : ", ") + c;
  for (size_t i = 0; i < labels.polygons_.size(); ++i) {
    const auto it = std::find(classes.begin(), classes.end(), names[i]);
    TILER_CHECK(it != classes.end(), IoError,
                "annotations '" << file << "': class '" << (names[i].empty() ? "(none)" : names[i])
                                << "' is not one of --classes (" << known << ")");
    labels.class_ids_.push_back(int(it - classes.begin()));
    double x0 = std::numeric_limits<double>::infinity(), y0 = x0, x1 = -x0, y1 = -x0;
    for (const auto& ring : labels.polygons_[i])
      for (const auto& p : ring) {
        x0 = std::min(x0, p.x), y0 = std::min(y0, p.y), x1 = std::max(x1, p.x), y1 = std::max(y1, p.y);
      }
    labels.bounds_.emplace_back(x0, y0, x1 - x0, y1 - y0);
  }
  return labels;
}

void AnnotationLabels::rasterize(const Rect& window, double pixels_per_level0, cv::Mat& classes,
                                 cv::Mat& covered) const {
  const int w = int(window.w), h = int(window.h);
  classes = cv::Mat::zeros(h, w, CV_32F);
  covered = cv::Mat::zeros(h, w, CV_32F);
  const cv::Rect2d seen(double(window.x) / pixels_per_level0, double(window.y) / pixels_per_level0,
                        double(window.w) / pixels_per_level0, double(window.h) / pixels_per_level0);
  for (size_t i = 0; i < polygons_.size(); ++i) {
    const cv::Rect2d& b = bounds_[i];
    if (b.x > seen.x + seen.width || b.x + b.width < seen.x || b.y > seen.y + seen.height ||
        b.y + b.height < seen.y)
      continue;  // nowhere near the window
    // Drawn in the part of the window its bounding box covers only (a window may lie under thousands of
    // small annotations): window pixels px0..px1 x py0..py1, the polygon moved there.
    const double s = pixels_per_level0;
    // Clamped as doubles: a vast polygon's corners lie past any int.
    auto within = [](double v, int most) { return int(std::clamp(v, 0.0, double(most))); };
    const int px0 = within(std::floor((b.x - seen.x) * s), w),
              px1 = within(std::ceil((b.x + b.width - seen.x) * s) + 1, w),
              py0 = within(std::floor((b.y - seen.y) * s), h),
              py1 = within(std::ceil((b.y + b.height - seen.y) * s) + 1, h);
    if (px1 <= px0 || py1 <= py0) continue;
    RoiPolygon moved = polygons_[i];
    for (auto& ring : moved)
      for (auto& p : ring) p = {(p.x - seen.x) * s - px0, (p.y - seen.y) * s - py0};
    // File order: a later annotation overwrites an earlier one where they overlap.
    const cv::Mat inside = rasterizeRoi({moved}, px1 - px0, py1 - py0, 1.0, 1.0) > 0;
    const cv::Rect part(px0, py0, px1 - px0, py1 - py0);
    classes(part).setTo(double(class_ids_[i]), inside);
    covered(part).setTo(1.0, inside);
  }
}

namespace {

// The comma-separated fields of a CSV line, trimmed, double quotes removed ("" inside them is one quote).
std::vector<std::string> csvFields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (ch == '"' && quoted && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (ch == '"') {
      quoted = !quoted;
    } else if (ch == ',' && !quoted) {
      fields.emplace_back();
    } else if (ch != '\r') {
      fields.back() += ch;
    }
  }
  for (auto& f : fields) {
    const size_t a = f.find_first_not_of(" \t"), b = f.find_last_not_of(" \t");
    f = a == std::string::npos ? std::string() : f.substr(a, b - a + 1);
  }
  return fields;
}

bool parseNumber(const std::string& text, double& value) {
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return !text.empty() && *end == 0 && std::isfinite(value);
}

}  // namespace

std::vector<WindowLabel> readWindowLabels(const std::string& file, const std::vector<std::string>& classes) {
  std::string why;
  const auto text = readDocument(file, kMaxWindowLabelsBytes, why);
  TILER_CHECK(text, IoError, "window labels '" << file << "': " << why);
  std::istringstream in(*text);
  std::vector<WindowLabel> rows;
  std::set<std::tuple<std::string, double, double>> seen;
  std::string line;
  int number = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++number;
    // Excel's "CSV UTF-8" starts the file with a byte order mark.
    if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto f = csvFields(line);
    auto where = [&] { return "window labels '" + file + "' line " + std::to_string(number) + ": "; };
    if (!header) {
      TILER_CHECK(f == std::vector<std::string>({"image", "x", "y", "label"}), IoError,
                  where() << "the header must be 'image,x,y,label', not '" << line << "'");
      header = true;
      continue;
    }
    TILER_CHECK(f.size() == 4 && !f[0].empty(), IoError, where() << "4 fields (image,x,y,label) wanted");
    WindowLabel row;
    row.image = f[0];
    row.line = number;
    TILER_CHECK(
        parseNumber(f[1], row.x) && parseNumber(f[2], row.y), IoError,
        where() << "x and y must be numbers (level-0 pixels), not '" << f[1] << "', '" << f[2] << "'");
    const auto named = std::find(classes.begin(), classes.end(), f[3]);
    double index = 0;
    if (named != classes.end()) {
      row.label = int(named - classes.begin());
    } else {
      TILER_CHECK(parseNumber(f[3], index) && index >= 0 && index == std::floor(index) && index < 1e9,
                  IoError,
                  where() << "label '" << f[3] << "' is neither a class of --classes nor a class index");
      row.label = int(index);
    }
    TILER_CHECK(
        seen.insert({row.image, row.x, row.y}).second, IoError,
        where() << "the window (" << f[1] << ", " << f[2] << ") of '" << row.image << "' is labelled twice");
    rows.push_back(std::move(row));
  }
  TILER_CHECK(header, IoError, "window labels '" << file << "': empty (the header image,x,y,label first)");
  return rows;
}

}  // namespace tiler
