// zip_archive: a zip read in place (a bioimage.io model package as the zoo ships it), through Debian's
// minizip (zlib's contrib/minizip: the bundle builds it from the zlib source it already has). Promise: a
// member is found by its exact name and read only by it, never extracted; an archive whose member names could
// leave it (an absolute name, a `..` segment, a backslash), that names one member twice, holds an encrypted
// member or is no zip at all is refused when opened, and a member larger than the reader's bound, missing, or
// whose bytes do not match their CRC is refused when read: each a ConfigError naming the archive and the
// member. A member is named outside the archive as ARCHIVE!/MEMBER (zipMemberPath), so a card's files keep
// one string each. Also SHA-256 (OpenSSL's libcrypto EVP), as bioimage.io cards state their files' digests.
// No LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tiler {

// The most members an archive may hold (a model package holds a few dozen).
constexpr int64_t kMaxZipMembers = 100000;
// The most a weights member may hold: it is read into memory to be loaded.
constexpr int64_t kMaxZipWeightsBytes = int64_t(4) << 30;

class ZipArchive {
 public:
  explicit ZipArchive(const std::string& path);
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  const std::string& path() const { return path_; }
  // The member names, sorted (directories end with '/').
  std::vector<std::string> names() const;
  bool has(const std::string& member) const { return members_.count(member) > 0; }
  // Streams the member's bytes to `sink` in pieces; over `max_bytes` is refused before a byte is read.
  void read(const std::string& member, int64_t max_bytes,
            const std::function<void(const char*, size_t)>& sink) const;
  std::string readAll(const std::string& member, int64_t max_bytes) const;

 private:
  struct Member {
    uint64_t pos_in_central_dir = 0, num_of_file = 0;
    uint64_t size = 0;
    uint64_t method = 0;  // 0 stored, 8 deflated: what minizip decompresses
  };
  std::string path_;
  void* unz_ = nullptr;
  std::map<std::string, Member> members_;
};

// "ARCHIVE!/MEMBER": how a member is named outside its archive.
std::string zipMemberPath(const std::string& archive, const std::string& member);
// ARCHIVE and MEMBER of such a name, where ARCHIVE is an existing regular file; nullopt for any other path.
std::optional<std::pair<std::string, std::string>> splitZipMemberPath(const std::string& path);
// Whether a member name stays inside its archive: relative, no `..` segment, no backslash, not empty.
bool zipMemberNameIsSafe(const std::string& name);

// A plain file's or a zip member's bytes (splitZipMemberPath), at most `max_bytes`: ConfigError naming it
// otherwise (a plain file: IoError, as readDocument says why).
std::string readFileOrZipMember(const std::string& path, int64_t max_bytes);

// SHA-256 as lowercase hex: of bytes, and of a plain file or zip member streamed (at most `max_bytes`).
std::string sha256Hex(const std::string& bytes);
std::string sha256OfFileOrZipMember(const std::string& path, int64_t max_bytes);
// A ConfigError where `found`, the sha256 of `file`, is not `expected`, the card `card`'s `field`.sha256
// (weights.torchscript): naming the file, saying sha256 and giving both digests.
void requireSha256(const std::string& file, const std::string& found, const std::string& expected,
                   const std::string& field, const std::string& card);

}  // namespace tiler
