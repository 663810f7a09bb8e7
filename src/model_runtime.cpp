#include "tiler/model_runtime.hpp"

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

}  // namespace

std::optional<std::string> findZipEntry(const std::string& path,
                                        const std::function<bool(const std::string&)>& matches,
                                        int max_entries) {
  std::ifstream in(path, std::ios::binary);
  for (int entry = 0; entry < max_entries; ++entry) {
    unsigned char h[30];
    if (!in.read(reinterpret_cast<char*>(h), sizeof h)) return std::nullopt;
    if (h[0] != 'P' || h[1] != 'K' || h[2] != 3 || h[3] != 4) return std::nullopt;
    const auto u16 = [&h](int at) { return uint32_t(h[at]) | uint32_t(h[at + 1]) << 8; };
    const uint32_t flags = u16(6), method = u16(8), size = u16(18) | u16(20) << 16;
    const uint32_t name_length = u16(26), extra_length = u16(28);
    std::string name(name_length, '\0');
    if (!in.read(name.data(), std::streamsize(name_length))) return std::nullopt;
    in.seekg(std::streamoff(extra_length), std::ios::cur);
    // Sizes after the data (a streamed zip) or in a zip64 extra field: the next header cannot be found.
    if ((flags & 8) != 0 || size == 0xffffffffu) return std::nullopt;
    if (matches(name)) {
      if (method != 0) return std::string();
      std::string data(size, '\0');
      if (!in.read(data.data(), std::streamsize(size))) return std::nullopt;
      return data;
    }
    in.seekg(std::streamoff(size), std::ios::cur);
  }
  return std::nullopt;
}

bool isPt2Package(const std::string& path) {
  // Python's zipfile writes a package's `version` and then its `archive_format` first; a TorchScript file's
  // entries all sit under one folder, its first is data.pkl.
  const auto format = findZipEntry(
      path,
      [](const std::string& name) {
        return name == "archive_format" || nameEndsWith(name, "/archive_format");
      },
      8);
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
