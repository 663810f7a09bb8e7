#include "tiler/core/version.hpp"
#include "tiler/model/runtime_info.hpp"

#include <gtest/gtest.h>

#include "tiler/core/error.hpp"

#include <array>
#include <cstdio>
#include <string>

namespace {

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
  *status = p ? pclose(p) : -1;
  return out;
}

TEST(Version, TilerReportsVersionsCudaNcclAndBackends) {
  int status = 0;
  std::string out = run(std::string(TILER_BIN_DIR) + "/tiler --version", &status);
  EXPECT_EQ(status, 0);
  EXPECT_NE(out.find("tiler " TILER_VERSION), std::string::npos) << out;
  EXPECT_NE(out.find("LibTorch: " TILER_TORCH_VERSION), std::string::npos) << out;
  EXPECT_NE(out.find("CUDA usable: "), std::string::npos) << out;
  EXPECT_NE(out.find("NCCL usable: "), std::string::npos) << out;
  EXPECT_NE(out.find("c10d backends: gloo"), std::string::npos) << out;
  EXPECT_EQ(out, tiler::runtimeInfo("tiler"));
}

// Each optional feature is listed by --version as built or not; a feature this build lacks stops what needs
// it with one line naming it and the CMake option, and one it has lets it pass. (CI builds both ways.)
TEST(Version, OptionalFeaturesAreListedAndAMissingOneNamesHowToBuildItIn) {
  int status = 0;
  const std::string out = run(std::string(TILER_BIN_DIR) + "/tiler --version", &status);
  ASSERT_EQ(tiler::optionalFeatures().size(), 3u);
  for (const tiler::OptionalFeature& f : tiler::optionalFeatures()) {
    EXPECT_NE(out.find(" " + f.name + (f.built ? " yes" : " no")), std::string::npos) << out;
    if (f.built) {
      EXPECT_NO_THROW(tiler::requireFeature(f.name, "--save x"));
      continue;
    }
    try {
      tiler::requireFeature(f.name, "--save x");
      ADD_FAILURE() << f.name << " is not built in, yet required without an error";
    } catch (const tiler::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--save x needs " + f.name + ", which this tiler was built without"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find(f.option), std::string::npos) << what;
    }
  }
  EXPECT_THROW(tiler::requireFeature("vulkan", "x"), tiler::ConfigError);
}

TEST(Version, CtrunReportsTheSameBuildWithoutLoadingLibTorch) {
  int status = 0;
  std::string out = run(std::string(TILER_BIN_DIR) + "/ctrun --version", &status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(out.rfind(tiler::buildInfo("ctrun"), 0), 0u) << out;
  EXPECT_NE(out.find("NVIDIA GPUs visible: "), std::string::npos);
  std::string libs = run("ldd " + std::string(TILER_BIN_DIR) + "/ctrun", &status);
  EXPECT_EQ(libs.find("libtorch"), std::string::npos) << libs;
}

}  // namespace
