// The reader registry: which row identifies a file from its head (first bytes and name), in order: OpenSlide
// for a vendor slide whatever its name and for a slide name that is no TIFF, libtiff for other TIFFs and for
// every .tif (refusing one that is not a TIFF), libjpeg for JPEG bytes, OpenCV for the rest; the extensions
// the rows declare are what directory discovery lists, and their traits what other code asks of an image;
// remote inputs (URLs) go to libtiff by byte ranges through GDAL, served in these tests by
// tests/range_server.py; an in-memory image (the Python module's arrays) is read through its strides,
// whatever its axis order, by its name alone. Errors are checked for what they must say (the file, the
// problem's key word), not for their whole sentence.
#include "tiler/io/readers/readers.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <stdexcept>

#include "range_server.hpp"
#include "slide_util.hpp"
#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// The name of the row that identifies `path`, or "" when none does.
std::string claimant(const std::string& path) {
  const ReaderBackend* backend = identifyReader(readFileHead(path));
  return backend ? backend->name : "";
}

const ReaderBackend& rowNamed(const std::string& name) {
  for (const ReaderBackend& b : readerBackends())
    if (b.name == name) return b;
  throw std::runtime_error("no reader row " + name);
}

// `run` throws an IoError whose message names `file` and says `word`.
template <typename Run>
void expectErrorNaming(Run run, const std::string& file, const std::string& word) {
  try {
    run();
    ADD_FAILURE() << "no error for " << file;
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find(file), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(word), std::string::npos) << e.message();
  }
}

void expectOpenFails(const std::string& dir, const std::string& file, const std::string& word) {
  expectErrorNaming([&] { ImageReader::open(dir + "/" + file); }, "/" + file, word);
}

// The same pixels held H x W x C and C x H x W read the same regions, as a cv::Mat of their own; a name that
// is no registered image (or no longer) is refused naming it, even where a file of that name exists.
TEST(Readers, AnInMemoryImageIsReadThroughItsStrides) {
  const int64_t H = 5, W = 7;
  const int C = 3;
  std::vector<uint16_t> hwc(size_t(H * W * C)), chw(hwc.size());
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x)
      for (int c = 0; c < C; ++c) {
        const auto v = uint16_t(1000 * c + 10 * y + x);
        hwc[size_t((y * W + x) * C + c)] = v;
        chw[size_t((c * H + y) * W + x)] = v;
      }
  const int64_t s = sizeof(uint16_t);
  const std::string packed =
      registerMemoryImage({hwc.data(), SampleType::kU16, W, H, C, W * C * s, C * s, s}, "packed");
  const std::string planar =
      registerMemoryImage({chw.data(), SampleType::kU16, W, H, C, W * s, s, H * W * s}, "planar");
  EXPECT_TRUE(isMemoryInput(packed));
  EXPECT_EQ(identifyReader(FileHead{planar, "", ""})->name, std::string("memory"));
  EXPECT_EQ(inputStem(planar), "planar");
  auto a = ImageReader::open(packed), b = ImageReader::open(planar);
  EXPECT_EQ(b->info().reader, "memory");
  EXPECT_EQ(b->info().width, W);
  EXPECT_EQ(b->info().height, H);
  EXPECT_EQ(b->info().channels, C);
  EXPECT_EQ(b->info().type, SampleType::kU16);
  const Rect region{2, 1, 4, 3};
  const cv::Mat from_packed = a->readRegion(region), from_planar = b->readRegion(region);
  ASSERT_EQ(from_planar.type(), CV_16UC3);
  EXPECT_EQ(cv::norm(from_packed, from_planar, cv::NORM_INF), 0.0);
  EXPECT_EQ(from_planar.at<cv::Vec3w>(0, 0)[2], 2000 + 10 * 1 + 2);
  EXPECT_NE(from_planar.data, reinterpret_cast<const uchar*>(chw.data()));
  unregisterMemoryImage(planar);
  expectErrorNaming([&] { ImageReader::open(planar); }, planar, "no such in-memory image");
  unregisterMemoryImage(packed);
}

TEST(Readers, TheBackendsAreAskedInTheirOrder) {
  std::vector<std::string> names;
  for (const ReaderBackend& b : readerBackends()) names.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"memory", "openslide", "tiff", "jpeg", "opencv"}));
}

// Each row's identify takes the heads of its own samples and none of the others' (whatever their names: the
// samples are named .bin here), but for a vendor slide, which is a TIFF too; OpenCV, the last row, takes
// whatever reaches it and decodes by the bytes.
TEST(Readers, EachRowIdentifiesItsOwnSamplesAndNoneOfTheOthers) {
  const std::string dir = test::scratchDir("readers_identify");
  const cv::Mat img(24, 32, CV_8UC3, cv::Scalar(10, 20, 30));
  std::map<std::string, std::vector<std::string>> samples;  // row -> heads of its samples
  auto encoded = [&](const std::string& ext) {
    std::vector<uchar> bytes;
    EXPECT_TRUE(cv::imencode(ext, img, bytes)) << ext;
    return std::string(bytes.begin(), bytes.end()).substr(0, kHeadBytes);
  };
  samples["tiff"] = {encoded(".tif"), std::string("MM\0*\0\0\0\x08", 8), std::string("II+\0\x08\0\0\0", 8)};
  samples["jpeg"] = {encoded(".jpg")};
  samples["opencv"] = {encoded(".png"), encoded(".bmp"), "P6\n32 24\n255\n"};
  if (test::featureBuilt("openslide") && test::haveSlideTools()) {
    test::makeSlide(cv::Mat(300, 400, CV_8UC3, cv::Scalar(200, 120, 180)), dir + "/plain.tif",
                    dir + "/a.svs");
    fs::copy_file(dir + "/a.svs", dir + "/aperio.bin");
    samples["openslide"] = {test::slurp(dir + "/aperio.bin").substr(0, kHeadBytes)};
  }
  for (const auto& [owner, heads] : samples) {
    for (const std::string& bytes : heads) {
      // The bytes on disk, for the row that asks OpenSlide about the file itself.
      const std::string path = dir + "/" + owner + ".bin";
      if (owner != "openslide") std::ofstream(path, std::ios::binary) << bytes;
      const FileHead head{owner == "openslide" ? dir + "/aperio.bin" : path, ".bin", bytes};
      for (const ReaderBackend& b : readerBackends()) {
        if (std::string(b.name) == "opencv") continue;
        // A vendor slide is a TIFF too (libtiff reads a remote one), so OpenSlide's row comes first.
        const bool also_tiff = owner == "openslide" && std::string(b.name) == "tiff";
        EXPECT_EQ(b.identify(head), b.name == owner || also_tiff) << b.name << " on a sample of " << owner;
      }
      EXPECT_EQ(identifyReader(head)->name, owner);
    }
  }
  EXPECT_TRUE(rowNamed("opencv").identify(FileHead{dir + "/x.bin", ".bin", "anything"}));
  EXPECT_EQ(&readerBackends().back(), &rowNamed("opencv")) << "the row that takes the rest comes last";
  removeTree(dir);
}

// Directory discovery lists a file by its name alone: exactly the extensions some row declares, in any case.
TEST(Readers, DirectoryDiscoveryFindsExactlyTheExtensionsTheRowsDeclare) {
  const std::string dir = test::scratchDir("readers_discovery");
  std::set<std::string> declared;
  for (const ReaderBackend& b : readerBackends()) {
    // Every row that reads files names them (the in-memory row reads none).
    EXPECT_EQ(b.extensions.empty(), std::string(b.name) == "memory") << b.name;
    for (const std::string& ext : b.extensions) {
      EXPECT_TRUE(declared.insert(ext).second) << ext << " is declared by two rows";
      std::ofstream(dir + "/lower" + ext) << "";
      std::string upper = ext;
      for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
      std::ofstream(dir + "/upper" + upper) << "";
    }
  }
  for (const char* other : {".txt", ".npy", ".json", ".csv", ".partial", ".tif.partial", ".zarr", ""})
    std::ofstream(dir + "/other" + std::string(other)) << "";
  std::set<std::string> listed;
  for (const std::string& path : listImages({dir}, false)) listed.insert(lowerExtension(path));
  EXPECT_EQ(listed, declared);
  for (const ReaderBackend& b : readerBackends())
    for (const std::string& ext : b.extensions)
      EXPECT_EQ(isWholeSlideExtension("a" + ext), (b.traits & kWholeSlide) != 0) << ext;
  removeTree(dir);
}

// A name that lies: the bytes decide where a row identifies them (a TIFF or JPEG named otherwise), except
// that a .tif is libtiff's whatever it holds (refused when it is not a TIFF) and a slide name that is no TIFF
// is OpenSlide's (its error says why); the traits follow the row that read it.
TEST(Readers, AFileWhoseExtensionLiesIsIdentifiedByItsBytes) {
  const std::string dir = test::scratchDir("readers_lies");
  const cv::Mat img(40, 50, CV_8UC3, cv::Scalar(10, 20, 30));
  ASSERT_TRUE(cv::imwrite(dir + "/tiff.tif", img));
  ASSERT_TRUE(cv::imwrite(dir + "/jpeg.jpg", img));
  ASSERT_TRUE(cv::imwrite(dir + "/png.png", img));
  fs::copy_file(dir + "/tiff.tif", dir + "/tiff_named.png");
  fs::copy_file(dir + "/jpeg.jpg", dir + "/jpeg_named.png");
  fs::copy_file(dir + "/png.png", dir + "/png_named.jpg");
  fs::copy_file(dir + "/jpeg.jpg", dir + "/jpeg_named.tif");
  fs::copy_file(dir + "/png.png", dir + "/png_named.tiff");
  EXPECT_EQ(claimant(dir + "/tiff_named.png"), "tiff");
  EXPECT_EQ(claimant(dir + "/jpeg_named.png"), "jpeg");
  EXPECT_EQ(claimant(dir + "/png_named.jpg"), "opencv");
  auto tiff = ImageReader::open(dir + "/tiff_named.png");
  EXPECT_TRUE(readerHas(tiff->info(), kTiffTags));
  EXPECT_FALSE(readerHas(tiff->info(), kDecodedWhole));
  auto jpeg = ImageReader::open(dir + "/jpeg_named.png");
  EXPECT_EQ(jpeg->info().reader, "jpeg");
  EXPECT_TRUE(readerHas(jpeg->info(), kDecodedWhole));
  EXPECT_FALSE(readerHas(jpeg->info(), kTiffTags));
  EXPECT_EQ(ImageReader::open(dir + "/png_named.jpg")->info().reader, "opencv");
  for (const char* name : {"jpeg_named.tif", "png_named.tiff"}) {
    EXPECT_EQ(claimant(dir + "/" + name), "tiff") << name;
    expectOpenFails(dir, name, "TIFF");
  }
  ImageInfo unread;
  EXPECT_FALSE(readerHas(unread, kTiffTags)) << "an image no reader opened has no traits";
  removeTree(dir);
}

TEST(Readers, EachFileGoesToTheBackendThatClaimsItFirst) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  const std::string dir = test::scratchDir("readers");
  const cv::Mat img(40, 50, CV_8UC3, cv::Scalar(10, 20, 30));
  ASSERT_TRUE(cv::imwrite(dir + "/a.png", img));
  ASSERT_TRUE(cv::imwrite(dir + "/b.tif", img));
  fs::copy_file(dir + "/b.tif", dir + "/plain.svs");
  fs::copy_file(dir + "/a.png", dir + "/png_named.tif");
  fs::copy_file(dir + "/a.png", dir + "/png_named.svs");
  std::ofstream(dir + "/notes.ndpi") << "not a slide\n";

  const FileHead png = readFileHead(dir + "/a.png");
  EXPECT_EQ(png.extension, ".png");
  EXPECT_EQ(png.bytes.substr(1, 3), "PNG");
  EXPECT_EQ(claimant(dir + "/a.png"), "opencv");
  EXPECT_EQ(ImageReader::open(dir + "/a.png")->info().reader, "opencv");

  EXPECT_EQ(claimant(dir + "/b.tif"), "tiff");
  EXPECT_EQ(claimant(dir + "/plain.svs"), "tiff") << "a plain TIFF stays with libtiff whatever its name";
  EXPECT_EQ(ImageReader::open(dir + "/plain.svs")->info().reader, "tiff");

  for (const char* name : {"notes.ndpi", "png_named.svs"}) {
    EXPECT_EQ(claimant(dir + "/" + name), "openslide") << name;
    expectOpenFails(dir, name, "OpenSlide");
  }
  EXPECT_EQ(claimant(dir + "/png_named.tif"), "tiff") << "a .tif is libtiff's, which refuses what is no TIFF";
  expectOpenFails(dir, "png_named.tif", "not a TIFF");
  removeTree(dir);
}

// JPEGs go to libjpeg: the same pixels OpenCV decodes, but a file cut short or a header that claims more
// pixels than its bytes can hold fails the image instead of reading as grey.
TEST(Readers, JpegsAreDecodedByLibjpegAndTruncatedOrForgedOnesFail) {
  const std::string dir = test::scratchDir("readers_jpeg");
  cv::Mat img(120, 160, CV_8UC3);
  cv::randu(img, 0, 255);
  cv::GaussianBlur(img, img, cv::Size(5, 5), 2);
  ASSERT_TRUE(cv::imwrite(dir + "/a.jpg", img));
  cv::Mat grey;
  cv::cvtColor(img, grey, cv::COLOR_BGR2GRAY);
  ASSERT_TRUE(cv::imwrite(dir + "/g.jpeg", grey));
  EXPECT_EQ(claimant(dir + "/a.jpg"), "jpeg");
  auto reader = ImageReader::open(dir + "/a.jpg");
  EXPECT_EQ(reader->info().reader, "jpeg");
  EXPECT_EQ(reader->info().channels, 3);
  cv::Mat rgb, by_opencv = cv::imread(dir + "/a.jpg");
  cv::cvtColor(by_opencv, rgb, cv::COLOR_BGR2RGB);
  EXPECT_EQ(cv::norm(reader->readRegion({0, 0, 160, 120}), rgb, cv::NORM_INF), 0) << "OpenCV's pixels";
  EXPECT_EQ(ImageReader::open(dir + "/g.jpeg")->info().channels, 1);
  // Cut to a third of its bytes: libjpeg warns "Premature end of JPEG file" and fills with grey.
  const std::string bytes = test::slurp(dir + "/a.jpg");
  std::ofstream(dir + "/cut.jpg", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  expectOpenFails(dir, "cut.jpg", "Premature end");
  // A header claiming 20000x20000 in a few hundred bytes (SOF0's height and width patched).
  cv::Mat small(16, 16, CV_8UC3, cv::Scalar(128, 128, 128));
  std::vector<uchar> encoded;
  ASSERT_TRUE(cv::imencode(".jpg", small, encoded));
  bool patched = false;
  for (size_t i = 0; i + 8 < encoded.size() && !patched; ++i) {
    if (encoded[i] == 0xFF && encoded[i + 1] == 0xC0) {  // SOF0: length(2) precision(1) height(2) width(2)
      encoded[i + 5] = encoded[i + 7] = 20000 >> 8;
      encoded[i + 6] = encoded[i + 8] = 20000 & 0xFF;
      patched = true;
    }
  }
  ASSERT_TRUE(patched);
  std::ofstream(dir + "/forged.jpg", std::ios::binary)
      .write(reinterpret_cast<const char*>(encoded.data()), std::streamsize(encoded.size()));
  expectOpenFails(dir, "forged.jpg", "20000x20000");
  removeTree(dir);
}

TEST(Readers, AVendorSlideGoesToOpenSlideWhateverItsName) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = test::scratchDir("readers_slide");
  cv::Mat rgb(300, 400, CV_8UC3, cv::Scalar(200, 120, 180));
  test::makeSlide(rgb, dir + "/plain.tif", dir + "/aperio.svs");
  fs::copy_file(dir + "/aperio.svs", dir + "/aperio_named.tif");
  for (const char* name : {"/aperio.svs", "/aperio_named.tif"}) {
    EXPECT_EQ(slideVendor(dir + name), "aperio") << name;
    EXPECT_EQ(claimant(dir + name), "openslide") << name;
    auto reader = ImageReader::open(dir + name);
    EXPECT_EQ(reader->info().reader, "openslide") << name;
    EXPECT_TRUE(readerHas(reader->info(), kWholeSlide)) << name;
    EXPECT_FALSE(readerHas(reader->info(), kTiffTags)) << name;
  }
  EXPECT_EQ(claimant(dir + "/plain.tif"), "tiff");
  removeTree(dir);
}

TEST(Readers, UrlsNameTheirOutputsByTheLastPathElementAndListsHoldInputs) {
  for (const char* url : {"https://host/a/slide.svs", "http://h:8080/slide.svs", "s3://bucket/x/slide.svs",
                          "gs://bucket/slide.svs"})
    EXPECT_TRUE(isRemoteInput(url)) << url;
  for (const char* local : {"/data/slide.svs", "slide.svs", "https:/x.tif", "ftp://h/x.tif", "S3/x.tif"})
    EXPECT_FALSE(isRemoteInput(local)) << local;
  EXPECT_EQ(inputFileName("https://host/a/b/slide.svs?X-Amz-Signature=a/b.c#part"), "slide.svs");
  EXPECT_EQ(inputStem("https://host/a/b/slide.svs?X-Amz-Signature=a/b.c"), "slide");
  EXPECT_EQ(inputStem("s3://bucket/cohort/scene.cog.tif"), "scene.cog");
  EXPECT_EQ(inputStem("/data/in/a_large.tif"), "a_large");
  EXPECT_EQ(inputStem("/data/in/.hidden"), ".hidden");

  const std::string dir = test::scratchDir("readers_list");
  std::ofstream(dir + "/inputs.txt")
      << "# the cohort\n\n  https://host/a.svs  \r\n"
      << "\t# s3 too\ns3://bucket/b.tif\nhttps://host/c.tif#frag\n/local/d.tif\n";
  EXPECT_TRUE(isInputList(dir + "/inputs.txt"));
  EXPECT_FALSE(isInputList(dir + "/a.tif"));
  EXPECT_FALSE(isInputList("https://host/list.txt")) << "a remote list is not read";
  EXPECT_EQ(readInputList(dir + "/inputs.txt"),
            (std::vector<std::string>{"https://host/a.svs", "s3://bucket/b.tif", "https://host/c.tif#frag",
                                      "/local/d.tif"}));
  // Not there, a FIFO (it would block for ever), a link to /dev/zero (it never ends): refused at once.
  ASSERT_EQ(mkfifo((dir + "/pipe.txt").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir + "/zero.txt");
  for (const auto& [name, why] : {std::pair<std::string, std::string>{"missing.txt", "not found"},
                                  {"pipe.txt", "FIFO"},
                                  {"zero.txt", "character device"}})
    expectErrorNaming([&, name = name] { readInputList(dir + "/" + name); }, dir + "/" + name, why);
  removeTree(dir);
}

TEST(Readers, ARemoteTiffIsReadByByteRangesAsTheLocalFileIs) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = test::scratchDir("readers_remote");
  test::writeNoiseTiff(dir + "/noise.tif", 1024);
  const auto file_size = int64_t(fs::file_size(dir + "/noise.tif"));
  test::RangeServer server(dir);
  const std::string url = server.url("noise.tif");
  auto local = ImageReader::open(dir + "/noise.tif");
  auto remote = ImageReader::open(url);
  EXPECT_EQ(remote->info().reader, "tiff");
  EXPECT_EQ(remote->info().path, url);
  EXPECT_EQ(remote->info().width, 1024);
  ASSERT_EQ(remote->info().levels.size(), local->info().levels.size());
  // A corner: only its tiles (and the header) come over the network.
  const Rect corner{0, 0, 200, 200};
  EXPECT_EQ(cv::norm(remote->readRegion(corner), local->readRegion(corner), cv::NORM_INF), 0);
  const int64_t fetched = remoteBytesFetched({url}).at(0);
  EXPECT_GT(fetched, 200 * 200 * 3);
  EXPECT_LT(fetched, file_size / 8) << "a corner fetched " << fetched << " of " << file_size << " bytes";
  EXPECT_LE(server.bytesSent(), fetched + 4096) << "GDAL counts what the server sent";
  for (const Rect r : {Rect{300, 517, 700, 300}, Rect{0, 0, 1024, 1024}})
    EXPECT_EQ(cv::norm(remote->readRegion(r), local->readRegion(r), cv::NORM_INF), 0);
  const Rect half{0, 0, 512, 512};
  EXPECT_EQ(cv::norm(remote->readRegion(half, 1), local->readRegion(half, 1), cv::NORM_INF), 0) << "level 1";
  const auto both = remoteBytesFetched({dir + "/noise.tif", url, url});
  EXPECT_EQ(both, (std::vector<int64_t>{0, remoteBytesFetched({url}).at(0), both[1]}));
  EXPECT_GT(both[1], fetched) << "the later reads counted too";
  removeTree(dir);
}

TEST(Readers, AConnectionLostMidReadFailsTheReadNamingTheUrlNeverWithZeros) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = test::scratchDir("readers_drop");
  test::writeNoiseTiff(dir + "/noise.tif", 1024);
  // The header and the first tiles arrive; the connection is lost a quarter of the way in.
  test::RangeServer server(dir, long(fs::file_size(dir + "/noise.tif") / 4));
  const std::string url = server.url("noise.tif");
  auto remote = ImageReader::open(url);
  expectErrorNaming([&] { remote->readRegion({0, 0, 1024, 1024}); }, url, "TIFFReadTile");
  expectErrorNaming([&] { remote->readRegion({0, 0, 1024, 1024}); }, url, "connection was lost");
  removeTree(dir);
}

TEST(Readers, ARemoteInputIsATiffOrIsRefusedAndAMissingOneNamesTheServersAnswer) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = test::scratchDir("readers_remote_png");
  ASSERT_TRUE(cv::imwrite(dir + "/a.png", cv::Mat(20, 30, CV_8UC3, cv::Scalar(1, 2, 3))));
  test::RangeServer server(dir);
  expectErrorNaming([&] { ImageReader::open(server.url("a.png")); }, server.url("a.png"), "TIFFs only");
  expectErrorNaming([&] { ImageReader::open(server.url("missing.tif")); }, server.url("missing.tif"), "404");
  removeTree(dir);
}

TEST(Readers, ARemoteInputWithoutGdalSaysTheBuildLacksIt) {
  if (test::featureBuilt("gdal"))
    GTEST_SKIP() << "this build has GDAL (scripts/test.sh --features-off has not)";
  expectErrorNaming([] { ImageReader::open("https://example.org/slide.svs"); },
                    "https://example.org/slide.svs", "GDAL");
}

// An Aperio SVS on a server is read by libtiff (OpenSlide reads local files only) as OpenSlide reads it here:
// the same size, levels, µm/px, magnification and pixels.
TEST(Readers, ARemoteSvsReadsAsOpenSlideReadsItLocally) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  if (!test::haveSlideTools()) GTEST_SKIP() << "vips/openslide-tools not installed (scripts/setup-deps.sh)";
  const std::string dir = test::scratchDir("readers_remote_svs");
  cv::Mat rgb(600, 700, CV_8UC3);
  cv::randu(rgb, 0, 255);
  cv::GaussianBlur(rgb, rgb, cv::Size(5, 5), 2);
  test::makeSlide(rgb, dir + "/plain.tif", dir + "/slide.svs", 0.5, 20);
  test::RangeServer server(dir);
  auto local = ImageReader::open(dir + "/slide.svs");
  auto remote = ImageReader::open(server.url("slide.svs"));
  ASSERT_EQ(local->info().reader, "openslide");
  EXPECT_EQ(remote->info().reader, "tiff");
  EXPECT_EQ(remote->info().mpp, std::optional<double>(0.5));
  EXPECT_EQ(remote->info().objective_power, std::optional<double>(20));
  ASSERT_EQ(remote->info().levels.size(), local->info().levels.size());
  for (size_t l = 0; l < local->info().levels.size(); ++l) {
    const auto& level = local->info().levels[l];
    EXPECT_EQ(remote->info().levels[l].width, level.width);
    const Rect all{0, 0, level.width, level.height};
    EXPECT_EQ(cv::norm(remote->readRegion(all, int(l)), local->readRegion(all, int(l)), cv::NORM_INF), 0)
        << "level " << l;
  }
  removeTree(dir);
}

}  // namespace
}  // namespace tiler
