// zip_archive: members read by name without extracting, each refusal naming the archive and the member, and
// SHA-256 against the standard's own test vectors.
#include "tiler/io/zip_archive.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

namespace fs = std::filesystem;
using namespace tiler;
using test::configError;

namespace {

// A zip of `members` (name, text) written by Python's zipfile; `stored`: no compression.
std::string makeZip(const std::string& path, const std::vector<std::pair<std::string, std::string>>& members,
                    bool stored = false) {
  std::string script = "import zipfile, sys\nz = zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_" +
                       std::string(stored ? "STORED" : "DEFLATED") + ")\n";
  for (const auto& [name, text] : members) script += "z.writestr(" + name + ", " + text + ")\n";
  script += "z.close()\n";
  std::ofstream(path + ".py") << script;
  const auto r = test::runCommand("/usr/bin/python3 " + path + ".py " + path + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.output;
  return path;
}

}  // namespace

TEST(ZipArchive, MembersAreReadByNameInPlace) {
  const std::string dir = test::scratchDir("zip_read");
  const std::string zip = makeZip(
      dir + "/pkg.zip", {{"'top/rdf.yaml'", "'type: model\\n'"}, {"'top/weights.pt'", "b'\\x00' * 100000"}});
  const ZipArchive archive(zip);
  EXPECT_EQ(archive.names(), (std::vector<std::string>{"top/rdf.yaml", "top/weights.pt"}));
  EXPECT_EQ(archive.readAll("top/rdf.yaml", 100), "type: model\n");
  EXPECT_EQ(archive.readAll("top/weights.pt", 100000), std::string(100000, '\0'));
  EXPECT_EQ(readFileOrZipMember(zipMemberPath(zip, "top/rdf.yaml"), 100), "type: model\n");
  const auto split = splitZipMemberPath(zip + "!/top/weights.pt");
  ASSERT_TRUE(split);
  EXPECT_EQ(split->first, zip);
  EXPECT_EQ(split->second, "top/weights.pt");
  EXPECT_FALSE(splitZipMemberPath(dir + "/none.zip!/a"));
  EXPECT_TRUE(fs::directory_iterator(dir) != fs::directory_iterator());  // nothing extracted beside it:
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_TRUE(entry.path().extension() == ".zip" || entry.path().extension() == ".py") << entry.path();
}

TEST(ZipArchive, MembersThatLeaveTheArchiveCorruptionAndSizesAreRefusedNamingTheMember) {
  const std::string dir = test::scratchDir("zip_refusals");
  for (const std::string& name : {"../x", "/etc/x", "a/../../x", "a\\\\x"}) {
    const std::string zip = makeZip(dir + "/escape.zip", {{"'rdf.yaml'", "'a'"}, {"'" + name + "'", "'b'"}});
    const std::string error = configError([&] { ZipArchive archive(zip); });
    EXPECT_NE(error.find("escape.zip': member '"), std::string::npos) << error;
    EXPECT_NE(error.find("names a path outside the archive"), std::string::npos) << error;
  }
  // One name twice (zipfile warns, and writes it); an encrypted member (its flag set in the central
  // directory).
  const std::string twice = configError([&] {
    ZipArchive archive(makeZip(dir + "/twice.zip", {{"'rdf.yaml'", "'a'"}, {"'rdf.yaml'", "'b'"}}));
  });
  EXPECT_NE(twice.find("twice.zip': member 'rdf.yaml' is in the archive twice"), std::string::npos) << twice;
  std::string locked = test::slurp(makeZip(dir + "/plain.zip", {{"'rdf.yaml'", "'a'"}}));
  locked[locked.find("PK\x01\x02") + 8] |= 1;
  std::ofstream(dir + "/locked.zip", std::ios::binary) << locked;
  const std::string encrypted = configError([&] { ZipArchive archive(dir + "/locked.zip"); });
  EXPECT_NE(encrypted.find("locked.zip': member 'rdf.yaml' is encrypted"), std::string::npos) << encrypted;
  // More members than a package holds: refused before any is looked at.
  std::ofstream(dir + "/many.py") << "import zipfile, sys\nz = zipfile.ZipFile(sys.argv[1], 'w')\n"
                                     "for k in range("
                                  << kMaxZipMembers + 1 << "):\n    z.writestr(str(k), b'')\n";
  ASSERT_EQ(test::runCommand("/usr/bin/python3 " + dir + "/many.py " + dir + "/many.zip").code, 0);
  const std::string many = configError([&] { ZipArchive archive(dir + "/many.zip"); });
  EXPECT_NE(many.find("many.zip': 100001 members, over the 100000"), std::string::npos) << many;
  const std::string zip = makeZip(dir + "/pkg.zip", {{"'weights.pt'", "b'w' * 5000"}}, true);
  const ZipArchive archive(zip);
  const std::string missing = configError([&] { archive.readAll("test_input.npy", 100); });
  EXPECT_NE(missing.find("pkg.zip': member 'test_input.npy' is not in the archive"), std::string::npos)
      << missing;
  const std::string big = configError([&] { archive.readAll("weights.pt", 4096); });
  EXPECT_NE(big.find("pkg.zip!/weights.pt': 4.9 KiB, over the 4 KiB"), std::string::npos) << big;
  // A byte of a stored member changed: its CRC no longer matches.
  std::string bytes = test::slurp(zip);
  bytes[bytes.find("wwww") + 10] = 'x';
  std::ofstream(dir + "/crc.zip", std::ios::binary) << bytes;
  const std::string crc = configError([&] { ZipArchive(dir + "/crc.zip").readAll("weights.pt", 10000); });
  EXPECT_NE(crc.find("crc.zip!/weights.pt': its bytes do not match their CRC"), std::string::npos) << crc;
  // No zip at all, and a zip cut short (no central directory).
  std::ofstream(dir + "/text.zip") << "not a zip";
  const std::string text = configError([&] { ZipArchive archive(dir + "/text.zip"); });
  EXPECT_NE(text.find("text.zip': not a zip archive, or a corrupt one"), std::string::npos) << text;
  std::ofstream(dir + "/cut.zip", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  const std::string cut = configError([&] { ZipArchive archive(dir + "/cut.zip"); });
  EXPECT_NE(cut.find("cut.zip': not a zip archive, or a corrupt one"), std::string::npos) << cut;
  const std::string none = configError([&] { ZipArchive archive(dir + "/none.zip"); });
  EXPECT_NE(none.find("none.zip': not found"), std::string::npos) << none;
}

TEST(ZipArchive, Sha256MatchesTheStandardsVectors) {
  // FIPS 180-2's examples.
  EXPECT_EQ(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string dir = test::scratchDir("zip_sha");
  std::ofstream(dir + "/abc") << "abc";
  EXPECT_EQ(sha256OfFileOrZipMember(dir + "/abc", 100), sha256Hex("abc"));
  const std::string zip = makeZip(dir + "/p.zip", {{"'abc'", "'abc'"}});
  EXPECT_EQ(sha256OfFileOrZipMember(zipMemberPath(zip, "abc"), 100), sha256Hex("abc"));
}

// A member compressed with a method minizip cannot decompress (LZMA, as Python's zipfile writes it) is
// refused naming the member and the method when it is read; the archive's other members still read.
TEST(ZipArchive, AMemberInAnotherCompressionIsNamedNotCalledCorrupt) {
  const std::string dir = test::scratchDir("zip_lzma");
  std::ofstream(dir + "/make.py") << "import zipfile, sys\n"
                                     "z = zipfile.ZipFile(sys.argv[1], 'w')\n"
                                     "z.writestr('rdf.yaml', 'type: model\\n', zipfile.ZIP_DEFLATED)\n"
                                     "z.writestr('weights.pt', b'\\x00' * 1000, zipfile.ZIP_LZMA)\n"
                                     "z.close()\n";
  const auto r = test::runCommand("/usr/bin/python3 " + dir + "/make.py " + dir + "/pkg.zip 2>&1");
  ASSERT_EQ(r.code, 0) << r.output;
  const ZipArchive archive(dir + "/pkg.zip");
  EXPECT_EQ(archive.readAll("rdf.yaml", 100), "type: model\n");
  const std::string message = configError([&] { archive.readAll("weights.pt", 10000); });
  EXPECT_NE(message.find("pkg.zip!/weights.pt': compressed with method 14 (LZMA)"), std::string::npos)
      << message;
}
