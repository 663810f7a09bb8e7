#include "tiler/dist/report.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace fs = std::filesystem;

namespace tiler {

namespace {

// A percentile's key: the number as a card writes it ("99.8", "0").
std::string percentileKey(double q) {
  std::ostringstream text;
  text << q;
  return text.str();
}

// An image's statistics under plain keys: per channel lists (count, mean, std, percentiles by key) and the
// same over all channels ("all").
nlohmann::json statisticsJson(const ImageStatistics& s) {
  auto one = [](const ValueStatistics& v) {
    nlohmann::json p = nlohmann::json::object();
    for (const auto& [q, value] : v.percentiles) p[percentileKey(q)] = value;
    return nlohmann::json{{"count", v.count}, {"mean", v.mean}, {"std", v.std}, {"percentiles", p}};
  };
  nlohmann::json j = {{"count", nlohmann::json::array()},
                      {"mean", nlohmann::json::array()},
                      {"std", nlohmann::json::array()},
                      {"percentiles", nlohmann::json::object()}};
  for (const ValueStatistics& c : s.channels) {
    j["count"].push_back(c.count);
    j["mean"].push_back(c.mean);
    j["std"].push_back(c.std);
    for (const auto& [q, value] : c.percentiles) j["percentiles"][percentileKey(q)].push_back(value);
  }
  j["all"] = one(s.all);
  return j;
}

}  // namespace

std::vector<double> RankStats::pack() const {
  return {double(windows),       read_seconds,  forward_seconds,       gather_seconds,       peak_rss_mb,
          double(tiles_decoded), write_seconds, double(bytes_written), double(images_owned), startup_seconds};
}

RankStats RankStats::unpack(const std::vector<double>& v) {
  TILER_CHECK(v.size() == 10, ConfigError, "rank statistics: expected 10 values, got " << v.size());
  return RankStats{int64_t(v[0]), v[1], v[2],          v[3],          v[4],
                   int64_t(v[5]), v[6], int64_t(v[7]), int64_t(v[8]), v[9]};
}

nlohmann::json inferReport(const RunSummary& run, const WindowCatalog& catalog,
                           const std::vector<RankStats>& per_rank) {
  nlohmann::json j;
  j["world_size"] = run.world_size;
  j["backend"] = run.backend;
  j["device"] = run.device;
  j["precision"] = run.precision;
  j["seconds"] = run.seconds;
  j["windows_total"] = catalog.totalWindows();
  j["windows_per_second"] = run.seconds > 0 ? double(catalog.totalWindows()) / run.seconds : 0.0;
  j["model"] = run.model;
  // Inputs and -m are named as given, relative ones to this directory (where `tiler view` finds them).
  std::error_code cwd_error;
  const std::filesystem::path cwd = std::filesystem::current_path(cwd_error);
  if (!cwd_error) j["working_directory"] = cwd.string();
  j["runtime"] = run.runtime;
  j["stitch"] = run.stitch;
  if (!run.model_card.empty()) {
    j["model_card"] = run.model_card;
    j["settings_from"] = nlohmann::json::object();
    for (const auto& [setting, from] : run.settings_from) j["settings_from"][setting] = from;
  }
  j["window"] = {run.window.window_w, run.window.window_h};
  j["output_scale"] = run.output_scale;
  j["halo"] = run.halo;
  j["tta"] = run.tta;
  j["task"] = run.task;
  j["feature_dim"] = run.feature_dim;
  j["replicas"] = run.replicas;
  j["read_threads"] = run.read_threads;
  j["shard_run"] = run.shard_run;
  j["threads"] = run.threads;
  j["cpu_blas"] = run.cpu_blas;
  j["gather"] = run.gather;
  j["per_rank"] = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const RankStats& s = per_rank[r];
    j["per_rank"].push_back({{"rank", int(r)},
                             {"windows", s.windows},
                             {"read_seconds", s.read_seconds},
                             {"forward_seconds", s.forward_seconds},
                             {"gather_seconds", s.gather_seconds},
                             {"peak_rss_mb", s.peak_rss_mb},
                             {"tiles_decoded", s.tiles_decoded},
                             {"write_seconds", s.write_seconds},
                             {"bytes_written", s.bytes_written},
                             {"images_owned", s.images_owned},
                             {"startup_seconds", s.startup_seconds}});
  }
  double startup = 0;
  for (const RankStats& s : per_rank) startup = std::max(startup, s.startup_seconds);
  j["startup_seconds"] = startup;  // the slowest rank's
  j["images"] = nlohmann::json::array();
  for (const auto& img : catalog.images()) {
    nlohmann::json e;
    e["input"] = redactSecrets(img.input);
    const std::string status = img.status == "done" ? "ok" : img.status == "ok" ? "error" : img.status;
    e["status"] = status;
    if (status == "error")
      e["error"] =
          redactSecrets(img.error.empty() ? "'" + img.input + "': not all windows were stitched" : img.error);
    if (img.info.width > 0) {
      e["width"] = img.info.width;
      e["height"] = img.info.height;
      e["windows"] = img.grid.count();
      e["windows_processed"] = img.first_window >= 0 ? img.plannedWindows() : 0;
      e["windows_skipped"] = img.grid.count() - img.plannedWindows();
      if (img.masked) e["mask"] = {{"method", img.mask_method}, {"coverage", img.mask_coverage}};
      e["level"] = img.resolution.level;
      e["mpp"] = img.resolution.mpp ? nlohmann::json(*img.resolution.mpp) : nlohmann::json(nullptr);
      e["source_mpp"] =
          img.resolution.source_mpp ? nlohmann::json(*img.resolution.source_mpp) : nlohmann::json(nullptr);
      e["reader"] = img.info.reader;
      if (img.resolution.upsampleFactor() > 1.0) e["upsample_factor"] = img.resolution.upsampleFactor();
      if (img.non_finite_values > 0) e["non_finite_values"] = img.non_finite_values;
      if (img.f16_overflow_values > 0) e["f16_overflow_values"] = img.f16_overflow_values;
      if (img.objects >= 0) {
        e["objects"] = img.objects;
        e["objects_at_window_edge"] = img.objects_at_window_edge;
      }
    }
    if (img.input_statistics) e["input_statistics"] = statisticsJson(*img.input_statistics);
    if (!img.input_affine.gain.empty())
      e["input_normalisation"] = {{"gain", img.input_affine.gain}, {"offset", img.input_affine.offset}};
    if (img.output_statistics) e["output_statistics"] = statisticsJson(*img.output_statistics);
    if (!img.output_affine.gain.empty())
      e["output_normalisation"] = {{"gain", img.output_affine.gain}, {"offset", img.output_affine.offset}};
    if (isRemoteInput(img.input)) e["remote_bytes_read"] = img.remote_bytes_read;
    if (status == "ok" || status == "skipped") e["outputs"] = img.outputs;
    j["images"].push_back(e);
  }
  return j;
}

bool anyRemoteInput(const WindowCatalog& catalog) {
  for (const auto& img : catalog.images())
    if (isRemoteInput(img.input)) return true;
  return false;
}

std::vector<double> fetchedBytesPerImage(const WindowCatalog& catalog) {
  std::vector<std::string> inputs;
  for (const auto& img : catalog.images()) inputs.push_back(img.input);
  std::vector<double> bytes;
  for (const int64_t b : remoteBytesFetched(inputs)) bytes.push_back(double(b));
  return bytes;
}

void addFetchedBytes(WindowCatalog& catalog, const std::vector<double>& per_image) {
  TILER_CHECK(
      per_image.size() == catalog.images().size(), ConfigError,
      "bytes fetched: " << per_image.size() << " images, the catalog has " << catalog.images().size());
  for (size_t id = 0; id < per_image.size(); ++id)
    catalog.image(int(id)).remote_bytes_read += int64_t(per_image[id]);
}

int exitCodeOf(const nlohmann::json& report) {
  for (const auto& e : report["images"])
    if (e["status"] == "error") return kExitSomeFailed;
  return kExitOk;
}

namespace {

// Every string of `j` (names of inputs and outputs, messages) as valid UTF-8: JSON has no other strings, and
// a report that cannot be written loses the run.
nlohmann::json utf8SafeJson(const nlohmann::json& j) {
  if (j.is_string()) return utf8Safe(j.get<std::string>());
  if (!j.is_structured()) return j;
  nlohmann::json out = j.is_array() ? nlohmann::json::array() : nlohmann::json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (j.is_array())
      out.push_back(utf8SafeJson(*it));
    else
      out[utf8Safe(it.key())] = utf8SafeJson(it.value());
  }
  return out;
}

}  // namespace

void writeJsonAtomically(const std::string& path, const nlohmann::json& j) {
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  const nlohmann::json safe = utf8SafeJson(j);
  const std::string error =
      writeFileAtomically(path, [&](std::ostream& out) { out << safe.dump(2) << "\n"; });
  TILER_CHECK(error.empty(), IoError, error);
}

Progress::Progress(int64_t total, std::string unit, bool enabled)
    : total_(total),
      unit_(std::move(unit)),
      enabled_(enabled),
      tty_(isatty(STDOUT_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void Progress::update(int64_t done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = done >= total_;
  // A bar redrawn 5 times a second on a terminal; a plain line every 5 seconds in a log.
  if (!last && now - last_ < (tty_ ? std::chrono::milliseconds(200) : std::chrono::seconds(5))) return;
  last_ = now;
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double rate = secs > 0 ? double(done) / secs : 0.0;
  const double eta = rate > 0 ? double(total_ - done) / rate : 0.0;
  char line[256];
  if (tty_) {
    const int width = 30;
    const int filled = total_ > 0 ? int(width * std::min(done, total_) / total_) : width;
    std::string bar(size_t(filled), '#');
    bar.resize(size_t(width), '.');
    std::snprintf(line, sizeof line, "\r[%s] %lld/%lld %s  %.1f/s  ETA %.0fs ", bar.c_str(), (long long)done,
                  (long long)total_, unit_.c_str(), rate, eta);
    std::cout << line << (last ? "\n" : "") << std::flush;
  } else {
    std::snprintf(line, sizeof line, "progress: %lld/%lld %s, %.1f/s, ETA %.0fs", (long long)done,
                  (long long)total_, unit_.c_str(), rate, eta);
    std::cout << line << std::endl;
  }
}

}  // namespace tiler
