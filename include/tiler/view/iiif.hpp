// view/iiif: the IIIF Image API 3.0 requests `tiler view` answers
// (`{region}/{size}/{rotation}/{quality}.{format}`), parsed and checked against an image's size, and the
// info.json that describes an image service. Promise: a request is either a region inside the image with an
// output size no larger than the region (nor than kIiifMaxSide a side), or a RequestError (answered 400);
// nothing here reads a file. No LibTorch.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tiler/core/grid.hpp"

namespace tiler {

// A request the server answers 400 (malformed, or outside the image).
class RequestError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The largest output side a request may ask (info.json's maxWidth/maxHeight): a bound on one request's
// memory.
constexpr int64_t kIiifMaxSide = 4096;
// The tile edge info.json offers.
constexpr int64_t kIiifTile = 256;

struct IiifRequest {
  Rect region;                    // level-0 pixels, inside the image
  int64_t width = 0, height = 0;  // the output's size
  std::string format = "png";     // png or jpg
};

// Region "full" | "square" | "x,y,w,h" | "pct:x,y,w,h"; size "max" | "w," | ",h" | "pct:n" | "w,h" | "!w,h";
// rotation "0"; quality "default" or "color" with format "png" or "jpg" (level 1's). A region partly outside
// the image is clipped to it (the API's rule); one wholly outside, empty, an upscaled size ("^") or anything
// else is a RequestError naming the part.
IiifRequest parseIiif(const std::string& region, const std::string& size, const std::string& rotation,
                      const std::string& quality_format, int64_t image_width, int64_t image_height);

// info.json of the image service `id` (its base URL) for an image of width x height: the fields IIIF 3.0
// requires, level 1's features, tiles of kIiifTile at power-of-two scale factors down to one tile, PNG
// preferred (lossless: a label's colour is its class).
nlohmann::json iiifInfo(const std::string& id, int64_t width, int64_t height);

}  // namespace tiler
