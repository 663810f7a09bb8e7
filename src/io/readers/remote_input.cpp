#include "tiler/io/readers/remote_input.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

#if TILER_WITH_GDAL
#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_vsi.h>
#include <cpl_vsi_error.h>
#endif

namespace tiler {
namespace {

bool startsWith(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The URL without its query and fragment.
std::string withoutQuery(const std::string& url) {
  return url.substr(0, std::min(url.find('?'), url.find('#')));
}

#if TILER_WITH_GDAL
// GDAL's name for a remote input: its /vsicurl/ (HTTP), /vsis3/ or /vsigs/ file.
std::string vsiPath(const std::string& url) {
  if (startsWith(url, "s3://")) return "/vsis3/" + url.substr(5);
  if (startsWith(url, "gs://")) return "/vsigs/" + url.substr(5);
  return "/vsicurl/" + url;
}

// GDAL's messages go into tiler's errors, not to stderr.
struct QuietGdalErrors {
  QuietGdalErrors() {
    CPLPushErrorHandler(CPLQuietErrorHandler);
    CPLErrorReset();
    VSIErrorReset();
  }
  ~QuietGdalErrors() { CPLPopErrorHandler(); }
};

// GDAL's HTTP settings where the user has set none (environment or --config): a few retries with back-off
// (GDAL doubles the delay each time) on the errors GDAL retries (HTTP 429, 5xx), bounded waits, no listing of
// the URL's directory at each open (an object store's prefix can hold a cohort), a block cache of 256 MiB
// shared by the process's handles, and the network statistics remoteBytesFetched reads.
void configureOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* defaults[][2] = {
        {"GDAL_HTTP_MAX_RETRY", "4"},
        {"GDAL_HTTP_RETRY_DELAY", "1"},
        {"GDAL_HTTP_CONNECTTIMEOUT", "30"},
        {"GDAL_HTTP_TIMEOUT", "300"},
        // A server that trickles (a byte every few seconds) is cut off within 30 s, not at the 300 s above.
        {"GDAL_HTTP_LOW_SPEED_TIME", "30"},
        {"GDAL_HTTP_LOW_SPEED_LIMIT", "64"},
        {"GDAL_DISABLE_READDIR_ON_OPEN", "EMPTY_DIR"},
        {"CPL_VSIL_CURL_CACHE_SIZE", "268435456"},
    };
    for (const auto& [key, value] : defaults)
      if (CPLGetConfigOption(key, nullptr) == nullptr) CPLSetConfigOption(key, value);
    CPLSetConfigOption("CPL_VSIL_NETWORK_STATS_ENABLED", "YES");
  });
}

// What GDAL said of the last failure: its VSI error (an open's HTTP status), else its last message.
std::string lastGdalError() {
  std::string message = VSIGetLastErrorMsg();
  if (message.empty()) message = CPLGetLastErrorMsg();
  return message.empty() ? "no further detail from GDAL" : message;
}
#endif

}  // namespace

bool isRemoteInput(const std::string& input) {
  return startsWith(input, "https://") || startsWith(input, "http://") || startsWith(input, "s3://") ||
         startsWith(input, "gs://");
}

std::string inputFileName(const std::string& input) {
  const std::string path = isRemoteInput(input) ? withoutQuery(input) : input;
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string inputStem(const std::string& input) {
  const std::string name = inputFileName(input);
  const size_t dot = name.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

bool isInputList(const std::string& path) {
  return !isRemoteInput(path) && path.size() > 4 && path.compare(path.size() - 4, 4, ".txt") == 0;
}

std::vector<std::string> readInputList(const std::string& path) {
  std::string why;
  const auto text = readDocument(path, kMaxInputListBytes, why);
  TILER_CHECK(text, IoError, "the list of inputs '" << path << "': " << why);
  std::istringstream in(*text);
  std::vector<std::string> inputs;
  for (std::string line; std::getline(in, line);) {
    // A comment is a line of its own: '#' may be part of a URL.
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    inputs.push_back(line.substr(first, line.find_last_not_of(" \t\r") - first + 1));
  }
  return inputs;
}

#if TILER_WITH_GDAL

RemoteFile::RemoteFile(const std::string& url) : url_(url) {
  configureOnce();
  const QuietGdalErrors quiet;
  VSILFILE* f = VSIFOpenExL(vsiPath(url).c_str(), "rb", TRUE);
  TILER_CHECK(f != nullptr, IoError, "'" << url << "': cannot open it: " << lastGdalError());
  handle_ = f;
  if (VSIFSeekL(f, 0, SEEK_END) != 0) {
    VSIFCloseL(f);
    TILER_THROW(IoError, "'" << url << "': cannot learn its size: " << lastGdalError());
  }
  size_ = VSIFTellL(f);
}

RemoteFile::~RemoteFile() {
  if (handle_ != nullptr) VSIFCloseL(static_cast<VSILFILE*>(handle_));
}

int64_t RemoteFile::read(void* data, size_t n) {
  if (position_ >= size_) return 0;
  const size_t want = size_t(std::min<uint64_t>(n, size_ - position_));
  const QuietGdalErrors quiet;
  auto* f = static_cast<VSILFILE*>(handle_);
  const size_t got = VSIFSeekL(f, position_, SEEK_SET) == 0 ? VSIFReadL(data, 1, want, f) : 0;
  if (got < want) {
    // GDAL hands back what arrived before the connection was lost, often with no message of its own.
    error_ = "the server sent " + std::to_string(got) + " of " + std::to_string(want) + " bytes at offset " +
             std::to_string(position_) + " of its " + std::to_string(size_) +
             " (the connection was lost or the transfer cut short): " + lastGdalError();
    return -1;
  }
  position_ += got;
  return int64_t(got);
}

std::vector<int64_t> remoteBytesFetched(const std::vector<std::string>& inputs) {
  std::vector<int64_t> bytes(inputs.size(), 0);
  char* text = VSINetworkStatsGetAsSerializedJSON(nullptr);
  if (text == nullptr) return bytes;
  const nlohmann::json stats = nlohmann::json::parse(text, nullptr, false);
  CPLFree(text);
  if (!stats.is_object() || !stats.contains("handlers")) return bytes;
  std::map<std::string, int64_t> by_name;
  for (const auto& handler : stats["handlers"]) {
    if (!handler.is_object() || !handler.contains("files")) continue;
    for (const auto& [name, file] : handler["files"].items())
      for (const auto& method : file.value("methods", nlohmann::json::object()))
        by_name[name] += method.value("downloaded_bytes", int64_t(0));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!isRemoteInput(inputs[i])) continue;
    const auto it = by_name.find(vsiPath(inputs[i]));
    if (it != by_name.end()) bytes[i] = it->second;
  }
  return bytes;
}

#else

RemoteFile::RemoteFile(const std::string& url) : url_(url) {
  TILER_THROW(IoError, "'" << url
                           << "': a remote input needs GDAL (its /vsicurl/, /vsis3/ and /vsigs/ readers), "
                              "which this tiler was built without: rebuild with -DTILER_WITH_GDAL=ON with "
                              "libgdal-dev");
}

RemoteFile::~RemoteFile() = default;

int64_t RemoteFile::read(void*, size_t) {
  return -1;
}

std::vector<int64_t> remoteBytesFetched(const std::vector<std::string>& inputs) {
  return std::vector<int64_t>(inputs.size(), 0);
}

#endif

std::string RemoteFile::takeError() {
  std::string e;
  e.swap(error_);
  return e;
}

}  // namespace tiler
