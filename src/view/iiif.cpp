#include "tiler/view/iiif.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

namespace tiler {
namespace {

// A decimal integer of digits alone (no sign, no spaces), at most 10 digits; nullopt otherwise.
std::optional<int64_t> integer(const std::string& text) {
  if (text.empty() || text.size() > 10) return std::nullopt;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// A non-negative decimal number ("12", "12.5", ".5"), as IIIF's percentages are; nullopt otherwise.
std::optional<double> decimal(const std::string& text) {
  if (text.empty() || text.size() > 16) return std::nullopt;
  bool dot = false, digit = false;
  for (char c : text) {
    if (c == '.' && !dot) {
      dot = true;
    } else if (c >= '0' && c <= '9') {
      digit = true;
    } else {
      return std::nullopt;
    }
  }
  if (!digit) return std::nullopt;
  return std::stod(text);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

[[noreturn]] void refuse(const std::string& part, const std::string& value, const std::string& why) {
  throw RequestError("IIIF " + part + " '" + value + "': " + why);
}

Rect parseRegion(const std::string& region, int64_t width, int64_t height) {
  if (region == "full") return {0, 0, width, height};
  if (region == "square") {
    const int64_t side = std::min(width, height);
    return {(width - side) / 2, (height - side) / 2, side, side};
  }
  const bool pct = region.rfind("pct:", 0) == 0;
  const auto parts = split(pct ? region.substr(4) : region, ',');
  if (parts.size() != 4) refuse("region", region, "not full, square, x,y,w,h nor pct:x,y,w,h");
  double v[4];
  for (int k = 0; k < 4; ++k) {
    const auto n = pct ? decimal(parts[size_t(k)]) : std::optional<double>(0);
    const auto i = pct ? std::optional<int64_t>(0) : integer(parts[size_t(k)]);
    if (!n || !i) refuse("region", region, "'" + parts[size_t(k)] + "' is not a non-negative number");
    v[k] = pct ? *n / 100.0 * double(k % 2 == 0 ? width : height) : double(*i);
  }
  int64_t x = int64_t(std::floor(v[0])), y = int64_t(std::floor(v[1]));
  int64_t w = int64_t(std::ceil(v[0] + v[2])) - x, h = int64_t(std::ceil(v[1] + v[3])) - y;
  if (v[2] <= 0 || v[3] <= 0) refuse("region", region, "has no area");
  if (x >= width || y >= height) refuse("region", region, "lies outside the image");
  w = std::min(w, width - x);
  h = std::min(h, height - y);
  return {x, y, w, h};
}

void parseSize(const std::string& size, const Rect& r, IiifRequest& q) {
  if (!size.empty() && size[0] == '^') refuse("size", size, "upscaling (^) is not offered");
  const double rw = double(r.w), rh = double(r.h);
  if (size == "max") {
    const double s = std::min({1.0, double(kIiifMaxSide) / rw, double(kIiifMaxSide) / rh});
    q.width = std::max<int64_t>(1, int64_t(std::floor(rw * s)));
    q.height = std::max<int64_t>(1, int64_t(std::floor(rh * s)));
  } else if (size.rfind("pct:", 0) == 0) {
    const auto n = decimal(size.substr(4));
    if (!n || *n <= 0) refuse("size", size, "not a positive percentage");
    q.width = std::max<int64_t>(1, int64_t(std::lround(rw * *n / 100.0)));
    q.height = std::max<int64_t>(1, int64_t(std::lround(rh * *n / 100.0)));
  } else {
    const bool confined = !size.empty() && size[0] == '!';
    const auto parts = split(confined ? size.substr(1) : size, ',');
    if (parts.size() != 2) refuse("size", size, "not max, w, ,h, pct:n, w,h nor !w,h");
    const auto w = parts[0].empty() ? std::optional<int64_t>() : integer(parts[0]);
    const auto h = parts[1].empty() ? std::optional<int64_t>() : integer(parts[1]);
    if ((!parts[0].empty() && !w) || (!parts[1].empty() && !h) || (!w && !h) || (w && *w == 0) ||
        (h && *h == 0))
      refuse("size", size, "needs positive integer sizes");
    if (confined) {
      if (!w || !h) refuse("size", size, "!w,h needs both sizes");
      const double s = std::min(double(*w) / rw, double(*h) / rh);
      q.width = std::max<int64_t>(1, int64_t(std::floor(rw * s + 1e-9)));
      q.height = std::max<int64_t>(1, int64_t(std::floor(rh * s + 1e-9)));
    } else if (w && h) {
      q.width = *w;
      q.height = *h;
    } else if (w) {
      q.width = *w;
      q.height = std::max<int64_t>(1, int64_t(std::lround(rh * double(*w) / rw)));
    } else {
      q.height = *h;
      q.width = std::max<int64_t>(1, int64_t(std::lround(rw * double(*h) / rh)));
    }
  }
  if (q.width > r.w || q.height > r.h) refuse("size", size, "is larger than the region (upscaling)");
  if (q.width > kIiifMaxSide || q.height > kIiifMaxSide)
    refuse("size", size, "is over the largest side offered, " + std::to_string(kIiifMaxSide));
}

}  // namespace

IiifRequest parseIiif(const std::string& region, const std::string& size, const std::string& rotation,
                      const std::string& quality_format, int64_t image_width, int64_t image_height) {
  IiifRequest q;
  q.region = parseRegion(region, image_width, image_height);
  parseSize(size, q.region, q);
  if (rotation != "0") refuse("rotation", rotation, "only 0 is offered");
  const size_t dot = quality_format.find('.');
  const std::string quality = quality_format.substr(0, dot);
  q.format = dot == std::string::npos ? "" : quality_format.substr(dot + 1);
  if ((quality != "default" && quality != "color") || (q.format != "png" && q.format != "jpg"))
    refuse("quality and format", quality_format, "default or color, png or jpg, are offered");
  return q;
}

nlohmann::json iiifInfo(const std::string& id, int64_t width, int64_t height) {
  std::vector<int64_t> factors{1};
  while (std::max(width, height) / factors.back() > kIiifTile) factors.push_back(factors.back() * 2);
  nlohmann::json sizes = nlohmann::json::array();
  for (auto it = factors.rbegin(); it != factors.rend(); ++it) {
    const int64_t w = (width + *it - 1) / *it, h = (height + *it - 1) / *it;
    if (w <= kIiifMaxSide && h <= kIiifMaxSide) sizes.push_back({{"width", w}, {"height", h}});
  }
  return {{"@context", "http://iiif.io/api/image/3/context.json"},
          {"id", id},
          {"type", "ImageService3"},
          {"protocol", "http://iiif.io/api/image"},
          {"profile", "level1"},
          {"width", width},
          {"height", height},
          {"maxWidth", kIiifMaxSide},
          {"maxHeight", kIiifMaxSide},
          {"tiles", {{{"width", kIiifTile}, {"height", kIiifTile}, {"scaleFactors", factors}}}},
          {"sizes", sizes},
          {"preferredFormats", {"png"}},
          {"extraFormats", {"png"}},
          {"extraFeatures", {"regionByPct", "sizeByPct", "sizeByConfinedWh"}}};
}

}  // namespace tiler
