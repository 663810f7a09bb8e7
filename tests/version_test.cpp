#include "tiler/version.hpp"

#include <gtest/gtest.h>

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
