// view/iiif: IIIF Image API 3.0 requests parsed against an image's size (regions clipped at the edges, sizes
// by each of the API's forms) and every malformed one refused with the part named; info.json's required
// fields.
#include "tiler/view/iiif.hpp"

#include <gtest/gtest.h>

#include <string>

namespace tiler {
namespace {

IiifRequest parse(const std::string& region, const std::string& size) {
  return parseIiif(region, size, "0", "default.png", 1200, 900);
}

TEST(Iiif, RegionsAreClippedToTheImage) {
  IiifRequest q = parse("full", "max");
  EXPECT_EQ(q.region.w, 1200);
  EXPECT_EQ(q.width, 1200);
  EXPECT_EQ(q.height, 900);
  q = parse("1150,850,100,100", "max");
  EXPECT_EQ(q.region.x, 1150);
  EXPECT_EQ(q.region.w, 50);
  EXPECT_EQ(q.region.h, 50);
  EXPECT_EQ(q.width, 50);
  q = parse("square", "max");
  EXPECT_EQ(q.region.x, 150);
  EXPECT_EQ(q.region.w, 900);
  q = parse("pct:50,50,50,50", "max");
  EXPECT_EQ(q.region.x, 600);
  EXPECT_EQ(q.region.y, 450);
  EXPECT_EQ(q.region.w, 600);
}

TEST(Iiif, SizesByEveryForm) {
  EXPECT_EQ(parse("0,0,300,100", "150,").height, 50);
  EXPECT_EQ(parse("0,0,300,100", ",50").width, 150);
  const IiifRequest distorted = parse("0,0,300,100", "100,100");
  EXPECT_EQ(distorted.width, 100);
  EXPECT_EQ(distorted.height, 100);
  const IiifRequest confined = parse("0,0,300,100", "!100,100");
  EXPECT_EQ(confined.width, 100);
  EXPECT_EQ(confined.height, 33);
  EXPECT_EQ(parse("0,0,300,100", "pct:50").width, 150);
  EXPECT_EQ(parse("full", "max").width, 1200);
}

TEST(Iiif, MalformedRequestsNameTheirPart) {
  auto refused = [](const std::string& region, const std::string& size, const std::string& rotation,
                    const std::string& quality, const std::string& part) {
    try {
      parseIiif(region, size, rotation, quality, 1200, 900);
      ADD_FAILURE() << region << "/" << size << "/" << rotation << "/" << quality << " was taken";
    } catch (const RequestError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused("a,b,c,d", "max", "0", "default.png", "region 'a,b,c,d'");
  refused("-1,0,10,10", "max", "0", "default.png", "region");
  refused("0,0,0,10", "max", "0", "default.png", "no area");
  refused("1200,0,10,10", "max", "0", "default.png", "outside");
  refused("0,0,10", "max", "0", "default.png", "region");
  refused("0,0,100,100", "^max", "0", "default.png", "upscaling");
  refused("0,0,100,100", "200,200", "0", "default.png", "larger than the region");
  refused("0,0,100,100", "0,", "0", "default.png", "size '0,'");
  refused("0,0,100,100", ",", "0", "default.png", "size ','");
  refused("full", "!10,", "0", "default.png", "both sizes");
  refused("full", "99999999999,", "0", "default.png", "size");
  refused("0,0,100,100", "max", "90", "default.png", "rotation '90'");
  refused("0,0,100,100", "max", "0", "gray.png", "quality");
  refused("0,0,100,100", "max", "0", "default.gif", "format");
  refused("0,0,100,100", "max", "0", "default", "format");
}

TEST(Iiif, FormatsAreLevelOnesAndPng) {
  EXPECT_EQ(parseIiif("full", "max", "0", "default.png", 100, 100).format, "png");
  EXPECT_EQ(parseIiif("full", "max", "0", "color.jpg", 100, 100).format, "jpg");
}

TEST(Iiif, MaxStaysWithinTheLargestSide) {
  const IiifRequest q = parseIiif("full", "max", "0", "default.png", 10000, 5000);
  EXPECT_EQ(q.width, kIiifMaxSide);
  EXPECT_EQ(q.height, kIiifMaxSide / 2);
  EXPECT_THROW(parseIiif("full", "5000,", "0", "default.png", 10000, 5000), RequestError);
}

TEST(Iiif, InfoHasTheFieldsIiif3Requires) {
  const auto info = iiifInfo("http://127.0.0.1:1/iiif/0/input", 1200, 900);
  for (const char* key :
       {"@context", "id", "type", "protocol", "profile", "width", "height", "tiles", "sizes"})
    EXPECT_TRUE(info.contains(key)) << key;
  EXPECT_EQ(info["type"], "ImageService3");
  EXPECT_EQ(info["tiles"][0]["scaleFactors"], nlohmann::json({1, 2, 4, 8}));
  EXPECT_EQ(info["sizes"][0]["width"], 150);
  EXPECT_EQ(info["preferredFormats"][0], "png");
}

}  // namespace
}  // namespace tiler
