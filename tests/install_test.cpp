// Installing tiler: `cmake --install` to a prefix and the Debian package from `cpack -G DEB` both give a
// tiler that finds its bundled samples next to itself and runs the bundled job; every command refuses a bad
// flag with exit 1 and says where the help is.
#include <gtest/gtest.h>
#include <CLI/Version.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

const std::string kBin = TILER_BIN_DIR;
auto run = test::runCommand;

// Runs the bundled job with an installed tiler (2 ranks through the installed ctrun) and checks its report.
void expectBundledJobRuns(const std::string& bin_dir, const std::string& share, const std::string& out) {
  auto version = run(bin_dir + "/tiler --version");
  ASSERT_EQ(version.code, 0) << version.output;
  EXPECT_NE(version.output.find("Bundled samples: " + share + "/tiler/samples\n"), std::string::npos)
      << version.output;
  auto r = run(bin_dir + "/ctrun --nproc_per_node 2 --master_port 0 " + bin_dir + "/tiler -o " + out +
               " -i " + share + "/tiler/samples/images/small.png --threads 1 --no_progress");
  ASSERT_EQ(r.code, 0) << r.output;
  auto report = nlohmann::json::parse(test::slurp(out + "/report.json"));
  EXPECT_EQ(report["model"], share + "/tiler/samples/models/sample.pt")
      << "the installed model, not the source tree's";
  EXPECT_EQ(report["images"][0]["status"], "ok");
}

// Configure-time refusals, each one line before any compiling: a dependency bundle built for another
// architecture or C++ ABI than LibTorch's, and (scripts/gpu-build.sh's TILER_REQUIRE_CUDA) a LibTorch without
// CUDA. The bundles here are only their config files, which is all configure reads before refusing.
TEST(Install, ConfigureRefusesAForeignBundleAndACpuLibTorchWhenCudaIsRequired) {
  const std::string dir = test::scratchDir("configure_refusals");
  std::string arch = test::runCommand("uname -m").output;
  arch.erase(arch.find_last_not_of(" \n") + 1);
  const auto bundle = [&](const std::string& name, const std::string& bundle_arch, int abi) {
    const std::string root = dir + "/" + name;
    fs::create_directories(root + "/lib/cmake/TilerDeps");
    std::ofstream(root + "/lib/cmake/TilerDeps/TilerDepsConfig.cmake")
        << "set(TilerDeps_ARCH \"" << bundle_arch << "\")\nset(TilerDeps_CXX11_ABI " << abi << ")\n";
    return root;
  };
  const auto configure = [&](const std::string& name, const std::string& args) {
    test::CommandResult r = test::runCommand("cmake -S " TILER_TEST_SOURCE_DIR " -B " + dir + "/build_" +
                                             name + " -G Ninja -DTILER_BUILD_TESTS=OFF " + args);
    // CMake wraps a message's lines at 80 columns: one space for every run of blanks and line breaks.
    std::string flat;
    for (char c : r.output)
      if (!std::isspace(static_cast<unsigned char>(c)) || (!flat.empty() && flat.back() != ' '))
        flat += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
    r.output = flat;
    return r;
  };
  const std::string other = arch == "aarch64" ? "x86_64" : "aarch64";
  auto r = configure("arch", "-DTILER_DEPS=" + bundle("arch", other, 1));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("was built for " + other + "; this machine is " + arch), std::string::npos)
      << r.output;
  // Of the two ABIs, the one LibTorch does not use is refused as such.
  int abi_refusals = 0;
  for (int abi : {0, 1}) {
    const std::string name = "abi" + std::to_string(abi);
    r = configure(name, "-DTILER_DEPS=" + bundle(name, arch, abi));
    EXPECT_NE(r.code, 0) << "a bundle of config files only cannot build: " << r.output;
    abi_refusals += r.output.find("uses _GLIBCXX_USE_CXX11_ABI=" + std::to_string(abi) + " but LibTorch") !=
                    std::string::npos;
  }
  EXPECT_EQ(abi_refusals, 1);
  if (TILER_WITH_CUDA) return;  // this LibTorch has CUDA: nothing to refuse
  r = configure("cuda", "-DTILER_REQUIRE_CUDA=ON");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("has no CUDA"), std::string::npos) << r.output;
}

// The Python module's file name in this build (build/python/tiler.<abi>.so), "" when it has none.
std::string pythonModuleName() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kBin + "/python", ec))
    if (e.path().filename().string().rfind("tiler.", 0) == 0 && e.path().extension() == ".so")
      return e.path().filename().string();
  return "";
}

TEST(Install, PrefixHoldsABinaryThatFindsItsSamples) {
  const std::string dir = test::scratchDir("install");
  auto r = run("cmake --install " + kBin + " --prefix " + dir + "/prefix");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* f : {"/bin/tiler", "/bin/ctrun", "/share/tiler/samples/models/sample.pt",
                        "/share/tiler/samples/images/blobs_4096.tif"})
    EXPECT_TRUE(fs::exists(dir + "/prefix" + f)) << f;
  expectBundledJobRuns(dir + "/prefix/bin", dir + "/prefix/share", dir + "/out");
  // The Python module, where this build has it: under the prefix where Debian's python3 looks, and imported
  // from there.
  const std::string module = pythonModuleName();
  if (module.empty()) return;
  const std::string packages = dir + "/prefix/lib/python3/dist-packages";
  EXPECT_TRUE(fs::exists(packages + "/" + module)) << module;
  if (!fs::exists("/usr/bin/python3")) return;
  r = run("cd / && PYTHONPATH=" + packages + " /usr/bin/python3 -c 'import tiler; print(tiler.__file__)'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(packages), std::string::npos) << r.output;
}

TEST(Install, DebianPackageDependsOnWhatItLinksAndRuns) {
  if (run("command -v dpkg-deb && command -v dpkg-shlibdeps").code != 0) GTEST_SKIP() << "no dpkg tools";
  const std::string dir = test::scratchDir("package");
  auto r = run("cpack -G DEB --config " + kBin + "/CPackConfig.cmake -B " + dir);
  ASSERT_EQ(r.code, 0) << r.output;
  std::string deb;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".deb") deb = e.path().string();
  ASSERT_FALSE(deb.empty()) << r.output;
  auto depends = run("dpkg-deb -f " + deb + " Depends");
  for (const char* lib : {"libtorch", "libopencv-core", "libopencv-imgcodecs", "libtiff", "libspdlog"})
    EXPECT_NE(depends.output.find(lib), std::string::npos) << lib << " in " << depends.output;
  auto contents = run("dpkg-deb -c " + deb);
  for (const char* f : {"./usr/bin/tiler", "./usr/bin/ctrun", "./usr/share/tiler/samples/models/sample.pt"})
    EXPECT_NE(contents.output.find(f), std::string::npos) << f;
  if (const std::string module = pythonModuleName(); !module.empty())
    EXPECT_NE(contents.output.find("./usr/lib/python3/dist-packages/" + module), std::string::npos) << module;
  // apt resolves its dependencies (a simulation: nothing is installed).
  auto apt = run("apt-get install -s " + deb);
  EXPECT_EQ(apt.code, 0) << apt.output;
  // Unpacked into a root of its own, the packaged tiler runs the bundled job.
  ASSERT_EQ(run("dpkg-deb -x " + deb + " " + dir + "/root").code, 0);
  expectBundledJobRuns(dir + "/root/usr/bin", dir + "/root/usr/share", dir + "/out");
}

TEST(Install, BadFlagsExitOneAndHelpListsTheCommands) {
  const std::string tiler = kBin + "/tiler";
  for (const std::string& cmd :
       {tiler + " --no_such_flag", tiler + " infer --window", tiler + " info --bogus x",
        tiler + " finetune --bogus", tiler + " overlay", kBin + "/ctrun --bogus true"}) {
    auto r = run(cmd);
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("--help' for the flags"), std::string::npos) << cmd << ": " << r.output;
  }
  auto help = run(tiler + " --help");
  EXPECT_EQ(help.code, 0);
  for (const char* command : {"tiler finetune", "tiler info", "tiler overlay", "tiler view", "tiler version"})
    EXPECT_NE(help.output.find(command), std::string::npos) << command;
  for (const char* command : {"finetune", "info", "overlay", "infer"}) {
    auto r = run(tiler + " " + command + " --help");
    EXPECT_EQ(r.code, 0) << command << ": " << r.output;
  }
}

// Every command's --help as tests/data/help.txt holds it (scripts/refresh-help.sh rewrites it after a change
// to a flag): a flag's words are the interface, and a change shows in review. Another CLI11 formats the same
// flags differently: then the copy says nothing.
TEST(Install, HelpIsTheReviewedCopy) {
  std::ifstream in(TILER_TEST_SOURCE_DIR "/tests/data/help.txt");
  ASSERT_TRUE(in.good());
  std::string header;
  std::getline(in, header);
  if (header.find("CLI11 " CLI11_VERSION " ") == std::string::npos)
    GTEST_SKIP() << "the copy is CLI11's other version: " << header;
  std::map<std::string, std::string> copy;
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("== ", 0) == 0) {
      section = line.substr(3, line.size() - 3 - std::string(" --help").size());
      continue;
    }
    copy[section] += line + "\n";
  }
  ASSERT_FALSE(copy.empty());
  for (const auto& [command, text] : copy) {
    const size_t space = command.find(' ');
    const std::string program = command.substr(0, space);
    const std::string rest = space == std::string::npos ? "" : command.substr(space);
    auto r = run("env -i PATH=/usr/bin:/bin bash -c 'exec -a \"$0\" \"$@\"' " + program + " " + kBin + "/" +
                 program + rest + " --help");
    EXPECT_EQ(r.code, 0) << command;
    EXPECT_EQ(r.output, text) << command << ": scripts/refresh-help.sh rewrites tests/data/help.txt";
  }
}

}  // namespace
}  // namespace tiler
