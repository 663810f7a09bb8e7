// view/server: `tiler view OUT_DIR`, a local web server over a finished job: its page (the viewer's assets),
// `GET /api/images` (the report's images and, for each, the IIIF id of its input and of each raster output),
// IIIF Image API 3.0 services at `/iiif/{image}/{layer}` (`info.json`, `{region}/{size}/0/default.png`) and
// `GET /api/objects` (an image's objects in a rectangle, from its annotation store). Promise: it answers only
// the files the report names and the viewer's own assets, by index and name, never by a path from the URL;
// a request whose path holds '%' (an encoded slash or dot), "..", "//" or a backslash, or names anything
// else, answers 4xx (no redirect, no fallback page); it reads, never writes; at most `threads` requests are
// worked on and `queue` wait, more answer 503. Binds 127.0.0.1 unless told otherwise. No LibTorch.
#pragma once

#include <cstdint>
#include <string>

namespace tiler {

struct ViewOptions {
  std::string output_dir;  // a job's output directory, holding its report.json
  std::string host = "127.0.0.1";
  int port = 8000;               // 0: a free port (printed)
  int threads = 4;               // requests worked on at once (reading, resampling, PNG encoding)
  int queue = 64;                // connections waiting beyond them; more answer 503
  int64_t cache_mb = 256;        // the tiles cache, in MiB (0: none)
  int64_t objects_limit = 2000;  // outlines an objects request returns; past it, centroids
  std::string assets_dir;        // the viewer's assets (default: found beside the binary)
};

// Serves `options` until the process is stopped. Throws ConfigError (no report, no images, no assets) or
// IoError (the address cannot be bound) before serving.
int runView(const ViewOptions& options);

// The viewer's assets for this binary: <dir of the binary>/share/tiler/viewer (the build tree), else
// <dir of the binary>/../share/tiler/viewer (installed); "" when neither holds index.html.
std::string viewerAssetsDir();

}  // namespace tiler
