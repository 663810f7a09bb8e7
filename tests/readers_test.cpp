// The reader registry: what each file's probe shows and which backend claims it, in order: OpenSlide for a
// vendor slide whatever its name, libtiff for other TIFFs, OpenSlide's own error for a slide name it cannot
// read, OpenCV for the rest, and a refusal for a .tif that is not a TIFF; remote inputs (URLs) go to libtiff
// by byte ranges through GDAL, served in these tests by tests/range_server.py.
#include "tiler/io/readers/readers.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "range_server.hpp"
#include "slide_util.hpp"
#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/readers/remote_input.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// The name of the first backend that claims `path`, or "" when none does.
std::string claimant(const std::string& path) {
  const FileProbe probe = probeFile(path);
  for (const ReaderBackend& b : readerBackends())
    if (b.claims(probe)) return b.name;
  return "";
}

TEST(Readers, TheBackendsAreAskedInTheirOrder) {
  std::vector<std::string> names;
  for (const ReaderBackend& b : readerBackends()) names.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"openslide", "tiff", "openslide", "jpeg", "opencv"}));
}

TEST(Readers, EachFileGoesToTheBackendThatClaimsItFirst) {
  TILER_SKIP_WITHOUT_FEATURE("openslide");
  const std::string dir = test::scratchDir("readers");
  const cv::Mat img(40, 50, CV_8UC3, cv::Scalar(10, 20, 30));
  ASSERT_TRUE(cv::imwrite(dir + "/a.png", img));
  ASSERT_TRUE(cv::imwrite(dir + "/b.tif", img));
  fs::copy_file(dir + "/b.tif", dir + "/plain.svs");
  fs::copy_file(dir + "/a.png", dir + "/png_named.tif");
  std::ofstream(dir + "/notes.ndpi") << "not a slide\n";

  const FileProbe png = probeFile(dir + "/a.png");
  EXPECT_FALSE(png.tiff);
  EXPECT_EQ(png.extension, ".png");
  EXPECT_EQ(png.slide_vendor, "") << "OpenSlide is not asked about a PNG";
  EXPECT_EQ(claimant(dir + "/a.png"), "opencv");
  EXPECT_EQ(ImageReader::open(dir + "/a.png")->info().reader, "opencv");

  EXPECT_TRUE(probeFile(dir + "/b.tif").tiff);
  EXPECT_EQ(claimant(dir + "/b.tif"), "tiff");
  EXPECT_EQ(claimant(dir + "/plain.svs"), "tiff") << "a plain TIFF stays with libtiff whatever its name";
  EXPECT_EQ(ImageReader::open(dir + "/plain.svs")->info().reader, "tiff");

  EXPECT_EQ(claimant(dir + "/notes.ndpi"), "openslide");
  try {
    ImageReader::open(dir + "/notes.ndpi");
    FAIL() << "opened a text file";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("notes.ndpi': not a whole-slide image OpenSlide can read"), std::string::npos)
        << e.message();
  }

  EXPECT_EQ(claimant(dir + "/png_named.tif"), "") << "no backend takes a .tif that is not a TIFF";
  try {
    ImageReader::open(dir + "/png_named.tif");
    FAIL() << "opened a PNG named .tif";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("png_named.tif': not a TIFF"), std::string::npos) << e.message();
  }
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
  EXPECT_TRUE(probeFile(dir + "/a.jpg").jpeg);
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
  try {
    ImageReader::open(dir + "/cut.jpg");
    FAIL() << "a truncated JPEG read as ok";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("cut.jpg': not a readable JPEG: Premature end of JPEG file"),
              std::string::npos)
        << e.message();
  }
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
  try {
    ImageReader::open(dir + "/forged.jpg");
    FAIL() << "decoded a forged 20000x20000 header";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("claims 20000x20000 pixels, more than its bytes can hold"), std::string::npos)
        << e.message();
  }
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
    const FileProbe p = probeFile(dir + name);
    EXPECT_TRUE(p.tiff);
    EXPECT_EQ(p.slide_vendor, "aperio") << name;
    EXPECT_EQ(claimant(dir + name), "openslide") << name;
    EXPECT_EQ(ImageReader::open(dir + name)->info().reader, "openslide") << name;
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
                                  {"pipe.txt", "is a FIFO (named pipe)"},
                                  {"zero.txt", "is a character device"}}) {
    try {
      readInputList(dir + "/" + name);
      ADD_FAILURE() << "read " << name;
    } catch (const IoError& e) {
      EXPECT_NE(e.message().find("the list of inputs '" + dir + "/" + name + "': " + why), std::string::npos)
          << e.message();
    }
  }
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
  try {
    remote->readRegion({0, 0, 1024, 1024});
    FAIL() << "a read the server cut short returned pixels";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("'" + url + "': TIFFReadTile failed at tile"), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find(url + ": the server sent"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("the connection was lost or the transfer cut short"), std::string::npos)
        << e.message();
  }
  removeTree(dir);
}

TEST(Readers, ARemoteInputIsATiffOrIsRefusedAndAMissingOneNamesTheServersAnswer) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = test::scratchDir("readers_remote_png");
  ASSERT_TRUE(cv::imwrite(dir + "/a.png", cv::Mat(20, 30, CV_8UC3, cv::Scalar(1, 2, 3))));
  test::RangeServer server(dir);
  try {
    ImageReader::open(server.url("a.png"));
    FAIL() << "opened a remote PNG";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("a.png': not a TIFF; remote inputs are read by byte ranges as TIFFs only"),
              std::string::npos)
        << e.message();
  }
  try {
    ImageReader::open(server.url("missing.tif"));
    FAIL() << "opened a missing URL";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("'" + server.url("missing.tif") + "': cannot open it: "), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("404"), std::string::npos) << e.message();
  }
  removeTree(dir);
}

TEST(Readers, ARemoteInputWithoutGdalSaysTheBuildLacksIt) {
  if (test::featureBuilt("gdal"))
    GTEST_SKIP() << "this build has GDAL (scripts/test.sh --features-off has not)";
  try {
    ImageReader::open("https://example.org/slide.svs");
    FAIL() << "a build without GDAL opened a URL";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("'https://example.org/slide.svs': a remote input needs GDAL"),
              std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("which this tiler was built without"), std::string::npos) << e.message();
  }
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
