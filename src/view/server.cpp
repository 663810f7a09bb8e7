#include "tiler/view/server.hpp"

#include <filesystem>

#include "tiler/core/error.hpp"

#if TILER_WITH_VIEW
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <optional>
#include <regex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/json_document.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/classes.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/readers/remote_input.hpp"
#include "tiler/view/iiif.hpp"
#include "tiler/view/layers.hpp"
#include "tiler/view/objects.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

constexpr int64_t kMaxReportBytes = int64_t(64) << 20;

// A connection handed to the pool past its queue is answered 503 on the accepting thread: the work a
// request may cause stays bounded, and every accepted socket is still closed by httplib.
thread_local bool t_overloaded = false;

class BoundedPool : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t queue) : queue_limit_(queue) {
    for (size_t k = 0; k < threads; ++k) threads_.emplace_back([this] { work(); });
  }
#if TILER_HTTPLIB_ENQUEUE_BOOL
  bool enqueue(std::function<void()> fn) override {
    take(std::move(fn));
    return true;
  }
#else
  void enqueue(std::function<void()> fn) override {
    take(std::move(fn));
  }
#endif
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cond_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void take(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (jobs_.size() < queue_limit_) {
        jobs_.push_back(std::move(fn));
        cond_.notify_one();
        return;
      }
    }
    t_overloaded = true;
    fn();
    t_overloaded = false;
  }
  void work() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cond_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (stop_ && jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }
  size_t queue_limit_;
  std::vector<std::thread> threads_;
  std::deque<std::function<void()>> jobs_;
  std::mutex mutex_;
  std::condition_variable cond_;
  bool stop_ = false;
};

// Served tiles (PNG bytes) by request, least recently used dropped first, bounded in bytes.
class TileCache {
 public:
  explicit TileCache(size_t bytes) : limit_(bytes) {}
  std::shared_ptr<const std::string> get(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }
  void put(const std::string& key, std::shared_ptr<const std::string> value) {
    if (value->size() > limit_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (index_.count(key)) return;
    order_.emplace_front(key, value);
    index_[key] = order_.begin();
    bytes_ += value->size();
    while (bytes_ > limit_) {
      bytes_ -= order_.back().second->size();
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const std::string>>;
  size_t limit_, bytes_ = 0;
  std::list<Entry> order_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  std::mutex mutex_;
};

struct Layer {
  std::string name;  // the URL's layer: "input", an output kind ('/' as '.'), "-K" for a class of scores
  std::string kind;  // the report's output kind ("input" for the input)
  std::shared_ptr<RasterLayer> raster;
  int band = 0;
};

struct Image {
  std::string name, input;
  int64_t width = 0, height = 0;
  std::optional<double> mpp;
  std::map<std::string, Layer> layers;
  nlohmann::json listing;  // /api/images' entry, less the ids (which name the host asked)
  std::unique_ptr<ObjectStore> objects;
};

std::string kindType(const std::string& kind) {
  const std::string last = kind.substr(kind.rfind('/') == std::string::npos ? 0 : kind.rfind('/') + 1);
  if (last == "labels" || last == "instances") return "labels";
  if (last == "probs") return "scores";
  if (last == "heatmap") return "grid";
  if (last == "objects_store") return "objects";
  return "";
}

// An output the report names, refused unless it is a regular file (not a link) inside the output directory.
std::string servedOutput(const fs::path& dir, const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  const auto status = fs::symlink_status(p, ec);
  TILER_CHECK(!ec && fs::is_regular_file(status), IoError,
              "'" << path << "': not served ("
                  << (ec ? "not found" : "not a regular file; a link is not followed") << ")");
  const fs::path real = fs::weakly_canonical(p, ec), root = fs::weakly_canonical(dir, ec);
  const std::string r = real.string(), d = root.string();
  TILER_CHECK(!ec && r.size() > d.size() && r.compare(0, d.size(), d) == 0 && r[d.size()] == '/', IoError,
              "'" << path << "': not served (outside the output directory '" << dir.string() << "')");
  return real.string();
}

std::string contentType(const std::string& name) {
  static const std::map<std::string, std::string> types{
      {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},   {".png", "image/png"},
      {".json", "application/json"},         {".svg", "image/svg+xml"},
      {".map", "application/json"}};
  const auto it = types.find(lowerExtension(name));
  return it == types.end() ? "application/octet-stream" : it->second;
}

class Viewer {
 public:
  explicit Viewer(const ViewOptions& o)
      : options_(o), cache_(size_t(std::max<int64_t>(o.cache_mb, 0)) << 20) {
    loadReport();
    loadAssets();
  }

  void serve() {
    httplib::Server server;
    const size_t threads = size_t(std::max(1, options_.threads)), queue = size_t(std::max(0, options_.queue));
    server.new_task_queue = [threads, queue] { return new BoundedPool(threads, queue); };
    server.set_keep_alive_timeout(1);
    server.set_keep_alive_max_count(100);
    // A response's header and body are two writes: without it, Nagle holds the second for the client's
    // delayed ACK (40 ms a request).
    server.set_tcp_nodelay(true);
    server.set_read_timeout(10);
    server.set_payload_max_length(0);
    server.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      if (t_overloaded) return fail(res, 503, "busy: too many requests at once");
      if (req.method != "GET" && req.method != "HEAD") return fail(res, 405, "read-only: GET only");
      const std::string path = req.target.substr(0, req.target.find('?'));
      if (path.find('%') != std::string::npos || path.find("..") != std::string::npos ||
          path.find("//") != std::string::npos || path.find('\\') != std::string::npos)
        return fail(res, 400, "refused path (encoded characters, '..', '//' or '\\')");
      return httplib::Server::HandlerResponse::Unhandled;
    });
    server.Get("/", [this](const httplib::Request&, httplib::Response& res) { asset("index.html", res); });
    server.Get(R"(/viewer/([A-Za-z0-9_./-]+))",
               [this](const httplib::Request& req, httplib::Response& res) { asset(req.matches[1], res); });
    server.Get("/api/images",
               [this](const httplib::Request& req, httplib::Response& res) { images(req, res); });
    server.Get("/api/objects",
               [this](const httplib::Request& req, httplib::Response& res) { objects(req, res); });
    server.Get(R"(/iiif/([0-9]{1,9})/([a-z0-9_.]+(?:-[0-9]{1,4})?)/info\.json)",
               [this](const httplib::Request& req, httplib::Response& res) { info(req, res); });
    server.Get(R"(/iiif/([0-9]{1,9})/([a-z0-9_.]+(?:-[0-9]{1,4})?)/([^/]+)/([^/]+)/([^/]+)/([^/]+))",
               [this](const httplib::Request& req, httplib::Response& res) { tile(req, res); });
    server.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.body.empty()) {
        res.set_content(res.status == 404 ? "not found\n" : "refused\n", "text/plain");
      }
    });
    int port = options_.port;
    if (port == 0) {
      port = server.bind_to_any_port(options_.host);
      TILER_CHECK(port > 0, IoError, "tiler view: cannot bind " << options_.host << " on any port");
    } else {
      TILER_CHECK(server.bind_to_port(options_.host, port), IoError,
                  "tiler view: cannot bind " << options_.host << ":" << port << " (in use? try --port 0)");
    }
    const std::string host =
        options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
    std::cout << "tiler view: " << images_.size() << " image(s) of '" << options_.output_dir << "' at http://"
              << host << ":" << port << "/ (Ctrl-C stops it)" << std::endl;
    TILER_CHECK(server.listen_after_bind(), IoError, "tiler view: the server stopped listening");
  }

 private:
  static httplib::Server::HandlerResponse fail(httplib::Response& res, int status, const std::string& why) {
    res.status = status;
    res.set_content(why + "\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  }

  void loadReport() {
    const fs::path dir(options_.output_dir);
    const std::string report_path = (dir / "report.json").string();
    std::string error;
    const auto text = readDocument(report_path, kMaxReportBytes, error);
    TILER_CHECK(text, ConfigError,
                "tiler view: '" << report_path << "' " << error << " (a job's output directory "
                                << "holds its report.json)");
    const auto report = parseJsonDocument(*text, error);
    TILER_CHECK(report && report->is_object() && report->contains("images") && (*report)["images"].is_array(),
                ConfigError, "tiler view: '" << report_path << "': not a tiler report (" << error << ")");
    // A relative input is the job's: relative to the directory it ran in, wherever the viewer runs.
    const fs::path job_dir =
        report->contains("working_directory") && (*report)["working_directory"].is_string()
            ? fs::path((*report)["working_directory"].get<std::string>())
            : fs::path();
    for (const auto& entry : (*report)["images"]) {
      if (!entry.is_object() || !entry.contains("input") || !entry["input"].is_string()) continue;
      auto image = std::make_unique<Image>();
      image->input = entry["input"].get<std::string>();
      if (!job_dir.empty() && !isRemoteInput(image->input) && fs::path(image->input).is_relative())
        image->input = (job_dir / image->input).string();
      image->name = fs::path(image->input).stem().string();
      try {
        addLayers(*image, dir, entry);
      } catch (const Error& e) {
        spdlog::warn("view: image '{}' is left out: {}", image->input, e.message());
        continue;
      }
      images_.push_back(std::move(image));
    }
    TILER_CHECK(!images_.empty(), ConfigError,
                "tiler view: '" << report_path << "' names no image whose input can be read");
  }

  void addLayers(Image& image, const fs::path& dir, const nlohmann::json& entry) {
    auto input = std::make_shared<RasterLayer>(image.input, LayerKind::kImage);
    image.width = input->info().width;
    image.height = input->info().height;
    if (entry.contains("source_mpp") && entry["source_mpp"].is_number())
      image.mpp = entry["source_mpp"].get<double>();
    else if (input->info().mpp)
      image.mpp = input->info().mpp;
    image.layers["input"] = {"input", "input", input, 0};
    nlohmann::json layers = nlohmann::json::array();
    const nlohmann::json outputs = entry.value("outputs", nlohmann::json::object());
    for (const auto& [kind, value] : outputs.items()) {
      const std::string type = kindType(kind);
      if (type.empty() || !value.is_string()) continue;
      try {
        const std::string path = servedOutput(dir, value.get<std::string>());
        std::string name = kind;
        std::replace(name.begin(), name.end(), '/', '.');
        nlohmann::json row{{"kind", kind}, {"type", type}, {"layer", name}};
        if (type == "objects") {
          image.objects = std::make_unique<ObjectStore>(path);
          row["count"] = image.objects->count();
        } else {
          auto raster = std::make_shared<RasterLayer>(path, type == "labels" ? LayerKind::kLabels
                                                            : type == "grid" ? LayerKind::kGrid
                                                                             : LayerKind::kScores);
          row["width"] = raster->info().width;
          row["height"] = raster->info().height;
          row["classes"] = classes(*raster, type);
          if (type == "grid") row["place"] = gridPlace(image, entry, *raster);
          if (type == "labels") {
            image.layers[name] = {name, kind, raster, 0};
          } else {
            for (int c = 0; c < raster->info().channels; ++c) {
              const std::string band = name + "-" + std::to_string(c);
              image.layers[band] = {band, kind, raster, c};
            }
          }
        }
        layers.push_back(std::move(row));
      } catch (const Error& e) {
        spdlog::warn("view: output '{}' of '{}' is left out: {}", kind, image.input, e.message());
      }
    }
    image.listing = {{"name", image.name},     {"input", redactSecrets(image.input)}, {"width", image.width},
                     {"height", image.height}, {"status", entry.value("status", "")}, {"layers", layers}};
    image.listing["mpp"] = image.mpp ? nlohmann::json(*image.mpp) : nlohmann::json();
  }

  // Where a classifier's heatmap lies over the input, in level-0 pixels: pixel (column, row) is the window
  // at (column, row) x its stride (processing pixels, its description says), drawn as the stride around the
  // window's centre.
  static nlohmann::json gridPlace(const Image& image, const nlohmann::json& entry, RasterLayer& raster) {
    std::string error;
    const auto d = parseJsonDocument(raster.info().description, error);
    TILER_CHECK(
        d && d->is_object() && d->contains("heatmap") && (*d)["heatmap"].is_object(), IoError,
        "'" << raster.info().path << "': a heatmap without its grid (ImageDescription's \"heatmap\")");
    const auto& h = (*d)["heatmap"];
    TILER_CHECK(h.contains("stride") && h["stride"].is_array() && h["stride"].size() == 2 &&
                    h.contains("window") && h["window"].is_array() && h["window"].size() == 2 &&
                    h["stride"][0].is_number() && h["window"][0].is_number(),
                IoError,
                "'" << raster.info().path << "': the heatmap's stride and window are not two numbers");
    const double processing_width = entry.value("width", 0.0);
    const double downsample = processing_width > 0 ? double(image.width) / processing_width : 1.0;
    const double stride = h["stride"][0].get<double>(), window = h["window"][0].get<double>();
    return {{"x", (window - stride) / 2 * downsample},
            {"y", (h["window"][1].get<double>() - h["stride"][1].get<double>()) / 2 * downsample},
            {"width", double(raster.info().width) * stride * downsample}};
  }

  // A raster's classes: names from the labels TIFF's description ({"classes": [...]}) or class_<k>; colours
  // from its palette.
  nlohmann::json classes(RasterLayer& raster, const std::string& type) {
    const ImageInfo& i = raster.info();
    std::vector<std::string> names;
    std::string error;
    if (!i.description.empty()) {
      const auto d = parseJsonDocument(i.description, error);
      // A labels TIFF's {"classes": [...]}; a heatmap's {"heatmap": {"classes": [...]}}.
      if (d && d->is_object()) {
        const nlohmann::json& from = d->contains("heatmap") ? d->at("heatmap") : *d;
        if (from.is_object() && from.contains("classes") && from.at("classes").is_array())
          for (const auto& n : from.at("classes"))
            names.push_back(n.is_string() ? n.get<std::string>() : defaultClassName(int(names.size())));
      }
    }
    const int count = type != "labels" ? i.channels : names.empty() ? 2 : int(names.size());
    nlohmann::json out = nlohmann::json::array();
    for (int k = 0; k < count; ++k) {
      nlohmann::json c{{"index", k},
                       {"name", size_t(k) < names.size() ? names[size_t(k)] : defaultClassName(k)}};
      if (i.colormap && size_t(k) < i.colormap->size()) {
        const auto& p = (*i.colormap)[size_t(k)];
        char hex[8];
        std::snprintf(hex, sizeof(hex), "#%02x%02x%02x", p[0] >> 8, p[1] >> 8, p[2] >> 8);
        c["color"] = hex;
      }
      out.push_back(std::move(c));
    }
    return out;
  }

  void loadAssets() {
    assets_dir_ = options_.assets_dir.empty() ? viewerAssetsDir() : options_.assets_dir;
    TILER_CHECK(
        !assets_dir_.empty() && fs::is_regular_file(fs::path(assets_dir_) / "index.html"), ConfigError,
        "tiler view: the viewer's assets (index.html) are not beside this binary (share/tiler/viewer): "
        "build the `viewer` target, or install tiler");
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(assets_dir_, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      const auto status = it->symlink_status(ec);
      if (!ec && fs::is_regular_file(status))
        assets_.insert(fs::relative(it->path(), assets_dir_, ec).generic_string());
    }
  }

  void asset(const std::string& name, httplib::Response& res) {
    if (!assets_.count(name)) {
      fail(res, 404, "no such asset");
      return;
    }
    std::string error;
    const auto text = readDocument((fs::path(assets_dir_) / name).string(), kMaxReportBytes, error);
    if (!text) {
      fail(res, 404, "no such asset");
      return;
    }
    res.set_content(*text, contentType(name).c_str());
  }

  static std::string base(const httplib::Request& req) {
    const std::string host = req.get_header_value("Host");
    return "http://" + (host.empty() ? std::string("127.0.0.1") : host);
  }

  Image* imageAt(const std::string& index) {
    const size_t k = std::stoul(index);
    return k < images_.size() ? images_[k].get() : nullptr;
  }

  void images(const httplib::Request& req, httplib::Response& res) {
    nlohmann::json list = nlohmann::json::array();
    const std::string root = base(req);
    for (size_t k = 0; k < images_.size(); ++k) {
      nlohmann::json j = images_[k]->listing;
      j["index"] = k;
      const std::string iiif = root + "/iiif/" + std::to_string(k) + "/";
      j["id"] = iiif + "input";
      for (auto& l : j["layers"]) {
        const std::string type = l["type"];
        if (type == "labels") l["id"] = iiif + l["layer"].get<std::string>();
        if (type == "scores" || type == "grid")
          for (auto& c : l["classes"])
            c["id"] = iiif + l["layer"].get<std::string>() + "-" + std::to_string(c["index"].get<int>());
        if (type == "objects") l["url"] = "/api/objects?image=" + std::to_string(k);
      }
      list.push_back(std::move(j));
    }
    nlohmann::json stops = nlohmann::json::array();
    for (const auto& s : heatmapStops()) stops.push_back({s.value, s.r, s.g, s.b});
    res.set_content(
        nlohmann::json{{"images", list}, {"heatmap", stops}, {"objects_limit", options_.objects_limit}}
            .dump(),
        "application/json");
  }

  Layer* layerOf(const httplib::Request& req, httplib::Response& res) {
    Image* image = imageAt(req.matches[1]);
    if (!image) {
      fail(res, 404, "no such image");
      return nullptr;
    }
    auto it = image->layers.find(req.matches[2]);
    if (it == image->layers.end()) {
      fail(res, 404, "no such layer");
      return nullptr;
    }
    return &it->second;
  }

  void info(const httplib::Request& req, httplib::Response& res) {
    Layer* layer = layerOf(req, res);
    if (!layer) return;
    const std::string id =
        base(req) + "/iiif/" + std::string(req.matches[1]) + "/" + std::string(req.matches[2]);
    const ImageInfo& i = layer->raster->info();
    res.set_header("Access-Control-Allow-Origin", "*");
    res.set_content(iiifInfo(id, i.width, i.height).dump(),
                    "application/ld+json;profile=\"http://iiif.io/api/image/3/context.json\"");
  }

  void tile(const httplib::Request& req, httplib::Response& res) {
    Layer* layer = layerOf(req, res);
    if (!layer) return;
    const ImageInfo& i = layer->raster->info();
    try {
      const IiifRequest q =
          parseIiif(req.matches[3], req.matches[4], req.matches[5], req.matches[6], i.width, i.height);
      const std::string key = std::string(req.matches[1]) + "/" + layer->name + "/" +
                              std::to_string(q.region.x) + "," + std::to_string(q.region.y) + "," +
                              std::to_string(q.region.w) + "," + std::to_string(q.region.h) + "/" +
                              std::to_string(q.width) + "," + std::to_string(q.height) + "." + q.format;
      auto png = cache_.get(key);
      if (!png) {
        const cv::Mat rgba = layer->raster->render(q, layer->band);
        cv::Mat bgr;
        std::vector<uint8_t> bytes;
        if (q.format == "png") {
          cv::cvtColor(rgba, bgr, cv::COLOR_RGBA2BGRA);
          // Speed over size: a tile is encoded for a viewer on this machine.
          cv::imencode(".png", bgr, bytes, {cv::IMWRITE_PNG_COMPRESSION, 1});
        } else {
          cv::cvtColor(rgba, bgr, cv::COLOR_RGBA2BGR);
          cv::imencode(".jpg", bgr, bytes, {cv::IMWRITE_JPEG_QUALITY, 90});
        }
        png = std::make_shared<const std::string>(bytes.begin(), bytes.end());
        cache_.put(key, png);
      }
      res.set_header("Access-Control-Allow-Origin", "*");
      res.set_header("Cache-Control", "max-age=3600");
      res.set_content(png->data(), png->size(), q.format == "png" ? "image/png" : "image/jpeg");
    } catch (const RequestError& e) {
      fail(res, 400, e.what());
    } catch (const std::exception& e) {
      spdlog::warn("view: {}: {}", req.path, e.what());
      fail(res, 500, redactSecrets(e.what()));
    }
  }

  void objects(const httplib::Request& req, httplib::Response& res) {
    auto number = [&req](const char* name, int64_t fallback) -> std::optional<int64_t> {
      if (!req.has_param(name)) return fallback;
      const std::string v = req.get_param_value(name);
      static const std::regex digits("-?[0-9]{1,10}");
      if (!std::regex_match(v, digits)) return std::nullopt;
      return std::stoll(v);
    };
    const auto image = number("image", -1), x = number("x", 0), y = number("y", 0), w = number("w", -1),
               h = number("h", -1), limit = number("limit", options_.objects_limit);
    if (!image || !x || !y || !w || !h || !limit || *image < 0 || *limit < 0) {
      fail(res, 400, "objects: image, x, y, w, h and limit are integers (image required)");
      return;
    }
    if (size_t(*image) >= images_.size()) {
      fail(res, 404, "no such image");
      return;
    }
    Image& i = *images_[size_t(*image)];
    if (!i.objects) {
      fail(res, 404, "this image has no objects store");
      return;
    }
    const Rect area{*x, *y, *w < 0 ? i.width : *w, *h < 0 ? i.height : *h};
    const int64_t cap = std::min(*limit, options_.objects_limit);
    const std::string key = "objects/" + std::to_string(*image) + "/" + std::to_string(area.x) + "," +
                            std::to_string(area.y) + "," + std::to_string(area.w) + "," +
                            std::to_string(area.h) + "/" + std::to_string(cap);
    try {
      auto body = cache_.get(key);
      if (!body) {
        body = std::make_shared<const std::string>(i.objects->query(area, cap).dump());
        cache_.put(key, body);
      }
      res.set_content(body->data(), body->size(), "application/json");
    } catch (const std::exception& e) {
      fail(res, 500, e.what());
    }
  }

  ViewOptions options_;
  std::vector<std::unique_ptr<Image>> images_;
  std::string assets_dir_;
  std::set<std::string> assets_;
  TileCache cache_;
};

}  // namespace

int runView(const ViewOptions& options) {
  if (options.host != "127.0.0.1" && options.host != "localhost" && options.host != "::1")
    spdlog::warn("view: serving on {}, not only this machine: anyone who reaches it reads the job's images",
                 options.host);
  Viewer viewer(options);
  viewer.serve();
  return 0;
}

}  // namespace tiler

#else

namespace tiler {

int runView(const ViewOptions&) {
  TILER_THROW(ConfigError,
              "tiler view: this tiler was built without the viewer (cpp-httplib and SQLite were not "
              "found; scripts/setup-deps.sh installs them)");
}

}  // namespace tiler

#endif  // TILER_WITH_VIEW

namespace tiler {

std::string viewerAssetsDir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  for (const fs::path& dir : {exe.parent_path() / "share" / "tiler" / "viewer",
                              exe.parent_path().parent_path() / "share" / "tiler" / "viewer"})
    if (fs::is_regular_file(dir / "index.html", ec)) return dir.string();
  return "";
}

}  // namespace tiler
