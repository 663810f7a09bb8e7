// zip_archive: minizip's unzip over the archive's central directory, and libcrypto's SHA-256 (see the
// header).
#include "tiler/io/zip_archive.hpp"

#include <openssl/evp.h>
#include <unzip.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

namespace fs = std::filesystem;

namespace tiler {

namespace {

constexpr const char* kSeparator = "!/";

unzFile handle(void* unz) {
  return static_cast<unzFile>(unz);
}

}  // namespace

bool zipMemberNameIsSafe(const std::string& name) {
  if (name.empty() || name[0] == '/' || name.find('\\') != std::string::npos ||
      name.find('\0') != std::string::npos)
    return false;
  // A drive letter ("C:...") is absolute on the systems that write one.
  if (name.size() >= 2 && name[1] == ':') return false;
  size_t at = 0;
  while (at <= name.size()) {
    const size_t end = std::min(name.find('/', at), name.size());
    if (name.compare(at, end - at, "..") == 0 && end - at == 2) return false;
    at = end + 1;
  }
  return true;
}

ZipArchive::ZipArchive(const std::string& path) : path_(path) {
  const std::string not_a_file = notARegularFile(path);
  TILER_CHECK(not_a_file.empty(), ConfigError, "'" << path << "': " << not_a_file);
  unz_ = unzOpen64(path.c_str());
  TILER_CHECK(unz_, ConfigError,
              "'" << path << "': not a zip archive, or a corrupt one (no central directory)");
  try {
    unz_global_info64 global{};
    TILER_CHECK(unzGetGlobalInfo64(handle(unz_), &global) == UNZ_OK, ConfigError,
                "'" << path << "': a corrupt zip archive (its central directory cannot be read)");
    TILER_CHECK(int64_t(global.number_entry) <= kMaxZipMembers, ConfigError,
                "'" << path << "': " << global.number_entry << " members, over the " << kMaxZipMembers
                    << " a model package may hold");
    int status = unzGoToFirstFile(handle(unz_));
    for (uint64_t k = 0; k < global.number_entry; ++k) {
      TILER_CHECK(status == UNZ_OK, ConfigError,
                  "'" << path << "': a corrupt zip archive (member " << k << " of " << global.number_entry
                      << " cannot be found)");
      unz_file_info64 info{};
      char name[4096];
      TILER_CHECK(
          unzGetCurrentFileInfo64(handle(unz_), &info, name, sizeof name, nullptr, 0, nullptr, 0) == UNZ_OK &&
              info.size_filename < sizeof name,
          ConfigError, "'" << path << "': a corrupt zip archive (member " << k << "'s entry)");
      const std::string member(name, info.size_filename);
      TILER_CHECK(zipMemberNameIsSafe(member), ConfigError,
                  "'" << path << "': member '" << member
                      << "' names a path outside the archive (absolute, '..' or '\\'); a model package's "
                         "members lie inside it");
      TILER_CHECK((info.flag & 1) == 0, ConfigError,
                  "'" << path << "': member '" << member << "' is encrypted; tiler reads plain archives");
      unz64_file_pos pos{};
      unzGetFilePos64(handle(unz_), &pos);
      const bool fresh = members_
                             .emplace(member, Member{pos.pos_in_zip_directory, pos.num_of_file,
                                                     info.uncompressed_size, info.compression_method})
                             .second;
      TILER_CHECK(fresh, ConfigError,
                  "'" << path << "': member '" << member << "' is in the archive twice; which one is meant "
                      << "is not known");
      status = unzGoToNextFile(handle(unz_));
    }
  } catch (...) {
    unzClose(handle(unz_));
    throw;
  }
}

ZipArchive::~ZipArchive() {
  if (unz_) unzClose(handle(unz_));
}

std::vector<std::string> ZipArchive::names() const {
  std::vector<std::string> out;
  for (const auto& kv : members_) out.push_back(kv.first);
  return out;
}

void ZipArchive::read(const std::string& member, int64_t max_bytes,
                      const std::function<void(const char*, size_t)>& sink) const {
  const std::string named = zipMemberPath(path_, member);
  const auto it = members_.find(member);
  TILER_CHECK(it != members_.end(), ConfigError,
              "'" << path_ << "': member '" << member << "' is not in the archive");
  TILER_CHECK(int64_t(it->second.size) <= max_bytes, ConfigError,
              "'" << named << "': " << byteSizeText(int64_t(it->second.size)) << ", over the "
                  << byteSizeText(max_bytes) << " such a member may hold");
  // LZMA, bzip2 or zstd members are valid zips minizip cannot decompress: said so, not "corrupt".
  TILER_CHECK(it->second.method == 0 || it->second.method == 8, ConfigError,
              "'" << named << "': compressed with method " << it->second.method << " ("
                  << (it->second.method == 14   ? "LZMA"
                      : it->second.method == 12 ? "bzip2"
                      : it->second.method == 93 ? "zstd"
                                                : "not deflate")
                  << "); tiler reads members stored or deflated: zip the package again with deflate");
  unz64_file_pos pos{it->second.pos_in_central_dir, it->second.num_of_file};
  TILER_CHECK(unzGoToFilePos64(handle(unz_), &pos) == UNZ_OK && unzOpenCurrentFile(handle(unz_)) == UNZ_OK,
              ConfigError, "'" << named << "': the member cannot be opened (a corrupt zip archive)");
  std::vector<char> buffer(1 << 20);
  int64_t total = 0;
  int got = 0;
  try {
    while ((got = unzReadCurrentFile(handle(unz_), buffer.data(), unsigned(buffer.size()))) > 0) {
      total += got;
      // The entry's size is the archive's word: the bytes are counted too.
      TILER_CHECK(total <= int64_t(it->second.size), ConfigError,
                  "'" << named << "': holds more bytes than its entry says (a corrupt zip archive)");
      sink(buffer.data(), size_t(got));
    }
  } catch (...) {
    unzCloseCurrentFile(handle(unz_));
    throw;
  }
  const int closed = unzCloseCurrentFile(handle(unz_));
  TILER_CHECK(got == 0 && total == int64_t(it->second.size), ConfigError,
              "'" << named << "': its bytes cannot be read (a corrupt zip archive: error " << got << ")");
  TILER_CHECK(closed == UNZ_OK, ConfigError,
              "'" << named << "': its bytes do not match their CRC (a corrupt zip archive)");
}

std::string ZipArchive::readAll(const std::string& member, int64_t max_bytes) const {
  std::string bytes;
  read(member, max_bytes, [&bytes](const char* data, size_t n) { bytes.append(data, n); });
  return bytes;
}

std::string zipMemberPath(const std::string& archive, const std::string& member) {
  return archive + kSeparator + member;
}

std::optional<std::pair<std::string, std::string>> splitZipMemberPath(const std::string& path) {
  for (size_t at = path.find(kSeparator); at != std::string::npos; at = path.find(kSeparator, at + 1)) {
    const std::string archive = path.substr(0, at);
    std::error_code ec;
    if (fs::is_regular_file(archive, ec)) return std::make_pair(archive, path.substr(at + 2));
  }
  return std::nullopt;
}

std::string readFileOrZipMember(const std::string& path, int64_t max_bytes) {
  if (const auto split = splitZipMemberPath(path); split && !isPlainFile(path))
    return ZipArchive(split->first).readAll(split->second, max_bytes);
  std::string why;
  const auto text = readDocument(path, max_bytes, why);
  TILER_CHECK(text, IoError, "'" << path << "': " << why);
  return *text;
}

namespace {

struct Sha256 {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx{EVP_MD_CTX_new(), EVP_MD_CTX_free};
  Sha256() {
    TILER_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, IoError,
                "OpenSSL's SHA-256 cannot be started");
  }
  void add(const char* data, size_t n) { EVP_DigestUpdate(ctx.get(), data, n); }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(ctx.get(), digest, &length);
    std::string out;
    char two[3];
    for (unsigned int i = 0; i < length; ++i) {
      std::snprintf(two, sizeof two, "%02x", digest[i]);
      out += two;
    }
    return out;
  }
};

}  // namespace

std::string sha256Hex(const std::string& bytes) {
  Sha256 sha;
  sha.add(bytes.data(), bytes.size());
  return sha.hex();
}

std::string sha256OfFileOrZipMember(const std::string& path, int64_t max_bytes) {
  Sha256 sha;
  if (const auto split = splitZipMemberPath(path); split && !isPlainFile(path)) {
    ZipArchive(split->first).read(split->second, max_bytes, [&sha](const char* d, size_t n) {
      sha.add(d, n);
    });
    return sha.hex();
  }
  const std::string not_a_file = notARegularFile(path);
  TILER_CHECK(not_a_file.empty(), IoError, "'" << path << "': " << not_a_file);
  std::ifstream in(path, std::ios::binary);
  TILER_CHECK(in, IoError, "'" << path << "': cannot be opened");
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), std::streamsize(buffer.size()));
    sha.add(buffer.data(), size_t(in.gcount()));
  }
  TILER_CHECK(in.eof(), IoError, "'" << path << "': cannot be read");
  return sha.hex();
}

void requireSha256(const std::string& file, const std::string& found, const std::string& expected,
                   const std::string& field, const std::string& card) {
  TILER_CHECK(found == expected, ConfigError,
              "'" << file << "': its sha256 is " << found << ", the card's " << field << ".sha256 is "
                  << expected << " ('" << card << "'): the file is not the one the card describes");
}

}  // namespace tiler
