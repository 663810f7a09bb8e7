// The reader registry: what each file's probe shows and which backend claims it, in order: OpenSlide for a
// vendor slide whatever its name, libtiff for other TIFFs, OpenSlide's own error for a slide name it cannot
// read, OpenCV for the rest, and a refusal for a .tif that is not a TIFF.
#include "tiler/readers.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "slide_util.hpp"
#include "test_util.hpp"
#include "tiler/error.hpp"
#include "tiler/platform.hpp"

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

}  // namespace
}  // namespace tiler
