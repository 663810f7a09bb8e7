#include "tiler/writers/memory_output.hpp"

#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <variant>

#include "tiler/core/error.hpp"
#include "tiler/core/output_kinds.hpp"

namespace tiler {
namespace {

constexpr const char* kMemoryOutputScheme = "memory:out-";

struct Registry {
  std::mutex mutex;
  std::set<std::string> dirs;
  // Committed outputs by path.
  std::map<std::string, std::variant<MemoryArray, std::string>> kept;
  int64_t next = 0;
};
Registry& registry() {
  static Registry r;
  return r;
}

// The directory part of `path` ("memory:out-3" of "memory:out-3/a_labels.tif").
std::string directoryOf(const std::string& path) {
  return path.substr(0, path.find('/'));
}

void keep(const std::string& path, std::variant<MemoryArray, std::string> result) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  TILER_CHECK(r.dirs.count(directoryOf(path)), IoError,
              "'" << path << "': no such output directory in memory (it was released)");
  r.kept[path] = std::move(result);
}

template <typename Result>
std::optional<Result> take(const std::string& path) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.kept.find(path);
  if (it == r.kept.end() || !std::holds_alternative<Result>(it->second)) return std::nullopt;
  Result result = std::move(std::get<Result>(it->second));
  r.kept.erase(it);
  return result;
}

}  // namespace

std::string registerMemoryOutput() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string dir = kMemoryOutputScheme + std::to_string(r.next++);
  r.dirs.insert(dir);
  return dir;
}

void unregisterMemoryOutput(const std::string& dir) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.dirs.erase(dir);
  for (auto it = r.kept.begin(); it != r.kept.end();)
    it = directoryOf(it->first) == dir ? r.kept.erase(it) : std::next(it);
}

bool isMemoryOutput(const std::string& path) {
  return path.compare(0, std::strlen(kMemoryOutputScheme), kMemoryOutputScheme) == 0;
}

std::string memoryKindRefusal(const std::string& kind) {
  // Labels and probabilities as arrays; the formats that stream text through a TextFile as their bytes.
  static const std::set<std::string> kept = {"labels", "probs",       "objects",         "objects_csv", "csv",
                                             "tiles",  "wsinfer_csv", "wsinfer_geojson", "coco"};
  if (kept.count(bareKind(kind))) return "";
  return "--save " + kind +
         " is written through files of its own and is not kept in memory; in memory: labels, probs, "
         "objects, objects_csv, csv, tiles, wsinfer_csv, wsinfer_geojson, coco (tiler.infer writes every "
         "output to a directory)";
}

std::optional<MemoryArray> takeMemoryArray(const std::string& path) {
  return take<MemoryArray>(path);
}

std::optional<std::string> takeMemoryText(const std::string& path) {
  return take<std::string>(path);
}

void keepMemoryText(const std::string& path, std::string bytes) {
  keep(path, std::move(bytes));
}

void keepMemoryArray(const std::string& path, MemoryArray array) {
  keep(path, std::move(array));
}

}  // namespace tiler
