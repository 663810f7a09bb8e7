#include "tiler/model_runtime.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "tiler/error.hpp"

namespace tiler {

namespace {

struct RuntimeBackend {
  bool (*claims)(const std::string& path);
  std::unique_ptr<ModelRuntime> (*open)(const RuntimeOptions& options);
};

bool anyFile(const std::string&) {
  return true;
}

// Little-endian fields of a zip's records.
uint64_t le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

bool readAt(std::ifstream& in, uint64_t offset, void* into, size_t bytes) {
  in.clear();
  in.seekg(std::streamoff(offset));
  return bool(in.read(static_cast<char*>(into), std::streamsize(bytes)));
}

// Where a zip's central directory lies and how long it is, from its end records (zip64's where the classic
// fields are saturated); nullopt if the file does not end as a zip does.
struct CentralDirectory {
  uint64_t offset = 0, bytes = 0;
};
std::optional<CentralDirectory> findCentralDirectory(std::ifstream& in, uint64_t file_size) {
  // The end record is the last 22 bytes unless a comment (at most 65535 bytes) follows it.
  const uint64_t tail_bytes = std::min<uint64_t>(file_size, 22 + 65535);
  std::vector<unsigned char> tail(tail_bytes);
  if (tail_bytes < 22 || !readAt(in, file_size - tail_bytes, tail.data(), tail_bytes)) return std::nullopt;
  for (uint64_t at = tail_bytes - 22 + 1; at-- > 0;) {
    const unsigned char* end = tail.data() + at;
    if (le(end, 4) != 0x06054b50) continue;
    CentralDirectory cd{le(end + 16, 4), le(end + 12, 4)};
    const uint64_t end_offset = file_size - tail_bytes + at;
    if ((cd.offset == 0xffffffffu || cd.bytes == 0xffffffffu) && end_offset >= 20) {
      unsigned char locator[20], end64[56];
      if (!readAt(in, end_offset - 20, locator, sizeof locator) || le(locator, 4) != 0x07064b50 ||
          !readAt(in, le(locator + 8, 8), end64, sizeof end64) || le(end64, 4) != 0x06064b50)
        return std::nullopt;
      cd = {le(end64 + 48, 8), le(end64 + 40, 8)};
    }
    if (cd.offset > file_size || cd.bytes > file_size - cd.offset) return std::nullopt;
    return cd;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> findZipEntry(const std::string& path,
                                        const std::function<bool(const std::string&)>& matches,
                                        size_t max_bytes) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) return std::nullopt;
  const auto cd = findCentralDirectory(in, file_size);
  // A package's directory is a few kB; a bound keeps a hostile file's claim from allocating gigabytes.
  if (!cd || cd->bytes > (64u << 20)) return std::nullopt;
  std::vector<unsigned char> dir(cd->bytes);
  if (!readAt(in, cd->offset, dir.data(), dir.size())) return std::nullopt;
  for (size_t at = 0; at + 46 <= dir.size() && le(&dir[at], 4) == 0x02014b50;) {
    const unsigned char* entry = &dir[at];
    const uint64_t method = le(entry + 10, 2), name_length = le(entry + 28, 2),
                   extra_length = le(entry + 30, 2);
    const size_t next = at + 46 + name_length + extra_length + le(entry + 32, 2);
    if (next > dir.size()) return std::nullopt;
    const std::string name(reinterpret_cast<const char*>(entry + 46), name_length);
    if (!matches(name)) {
      at = next;
      continue;
    }
    // Saturated sizes and offset are in the zip64 extra field (id 1), in this order, each only if saturated.
    uint64_t size = le(entry + 20, 4), local = le(entry + 42, 4);
    const bool size64 = size == 0xffffffffu, local64 = local == 0xffffffffu;
    for (size_t x = at + 46 + name_length; x + 4 <= at + 46 + name_length + extra_length;) {
      const uint64_t id = le(&dir[x], 2), length = le(&dir[x + 2], 2);
      if (id == 1) {
        size_t field = x + 4 + (le(entry + 24, 4) == 0xffffffffu ? 8 : 0);  // the uncompressed size first
        if (size64 && field + 8 <= dir.size()) size = le(&dir[field], 8), field += 8;
        if (local64 && field + 8 <= dir.size()) local = le(&dir[field], 8);
      }
      x += 4 + length;
    }
    if (method != 0 || size > max_bytes) return std::string();
    unsigned char header[30];
    if (!readAt(in, local, header, sizeof header) || le(header, 4) != 0x04034b50) return std::nullopt;
    const uint64_t data = local + 30 + le(header + 26, 2) + le(header + 28, 2);
    if (data > file_size || size > file_size - data) return std::nullopt;
    std::string bytes(size, '\0');
    if (!readAt(in, data, bytes.data(), bytes.size())) return std::nullopt;
    return bytes;
  }
  return std::nullopt;
}

bool isPt2Package(const std::string& path) {
  // Wherever the writer put it (PyTorch 2.6's Python zipfile: second; 2.11's C++ writer: after its data); a
  // TorchScript file has no such entry.
  const auto format = findZipEntry(
      path,
      [](const std::string& name) {
        return name == "archive_format" || nameEndsWith(name, "/archive_format");
      },
      64);
  return format && (format->empty() || *format == "pt2");  // empty: compressed, the name says enough
}

std::unique_ptr<ModelRuntime> openModelRuntime(const RuntimeOptions& options) {
  // TorchScript last: anything else (a directory, a missing file too) goes to loadTorchScript, whose errors
  // say what the file is not.
  static const std::vector<RuntimeBackend> backends = {{isPt2Package, openPt2Runtime},
                                                       {anyFile, openTorchScriptRuntime}};
  for (const auto& backend : backends)
    if (backend.claims(options.path)) return backend.open(options);
  TILER_THROW(ModelError, "'" << options.path << "': no runtime takes this file");
}

}  // namespace tiler
