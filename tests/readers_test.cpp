// The reader registry: what each file's probe shows and which backend claims it, in order: OpenSlide for a
// vendor slide whatever its name, libtiff for other TIFFs, OpenSlide's own error for a slide name it cannot
// read, OpenCV for the rest, and a refusal for a .tif that is not a TIFF.
#include "tiler/readers.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>

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
  EXPECT_EQ(names, (std::vector<std::string>{"openslide", "tiff", "openslide", "opencv"}));
}

TEST(Readers, EachFileGoesToTheBackendThatClaimsItFirst) {
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

TEST(Readers, AVendorSlideGoesToOpenSlideWhateverItsName) {
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
