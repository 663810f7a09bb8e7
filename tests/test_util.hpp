// Helpers the test files share: running a command, reading a file, a free port, a scratch directory,
// and the TIFF that claims 10^6 x 10^6 pixels.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <tiffio.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/core/version.hpp"
#include "tiler/net/tcp_store.hpp"

namespace tiler::test {

// The message of the ConfigError `f` throws: "no error" where it throws none, "not a ConfigError: WHAT"
// where it throws another exception (a refusal of the wrong kind fails the test's match as a missing one).
inline std::string configError(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.message();
  } catch (const std::exception& e) {
    return std::string("not a ConfigError: ") + e.what();
  }
  return "no error";
}

// Whether this build has optional feature `name` (gdal, openslide, hdf5: CMake's TILER_WITH_*).
inline bool featureBuilt(const std::string& name) {
  for (const OptionalFeature& f : optionalFeatures())
    if (f.name == name) return f.built;
  return false;
}
// A test that needs an optional feature, or a command-line tool, skips without it, saying which.
#define TILER_SKIP_WITHOUT_FEATURE(name) \
  if (!::tiler::test::featureBuilt(name)) GTEST_SKIP() << "this build has no " name " (TILER_WITH_*)"
#define TILER_SKIP_WITHOUT_TOOL(tool)                                             \
  if (::tiler::test::runCommand("command -v " tool " >/dev/null 2>&1").code != 0) \
  GTEST_SKIP() << tool " is not installed (scripts/setup-deps.sh)"

struct CommandResult {
  int code = -1;       // exit code, or 128 + signal
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

inline CommandResult runCommand(const std::string& cmd) {
  CommandResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 8192> buf;
  while (p && fgets(buf.data(), buf.size(), p)) r.output += buf.data();
  const int status = p ? pclose(p) : -1;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// A .pt2 package (AOTInductor) of a bundled model for windows of `window` px, exported into `dir` by
// scripts/export_model.py from the TorchScript model's weights: `network` is its class in
// samples/make_samples.py (UNet: samples/models/sample.pt; Encoder: encoder.pt; ThreeHeads and
// ThreeHeadsAsTuple: heads.pt). Empty, with the reason in `why`, where no Python here exports one (PyTorch
// 2.6 or later, setuptools and a compiler: Debian trixie's python3-torch; `device` cuda: a wheel with CUDA on
// a GPU machine). An export that fails where Python could export is a test failure.
// An export compiles C++ (15-20 s; Inductor's own caches do not serve AOT mode), so each package is kept in
// the build tree's pt2-cache under a digest of all it is made from: the script, the network's source, the
// weights, the arguments, the compiler and Inductor variables (CC, CXX, TORCHINDUCTOR_*, AOT_INDUCTOR_*), the
// Python and PyTorch (and its CUDA) that export it, the CPU's vector ISA and, for cuda, the GPU's capability.
// Only a package whose export exited 0 is kept.
inline std::string exportSamplePt2(const std::string& dir, int window, std::string* why,
                                   const std::string& network = "UNet", const std::string& device = "cpu") {
  const std::string src = TILER_TEST_SOURCE_DIR;
  // TILER_PYTHON: the Python that holds PyTorch where it is not the system's (a GPU machine's wheel).
  const char* env = std::getenv("TILER_PYTHON");
  const std::string python = env && *env ? env : "/usr/bin/python3";
  const std::string weights = network == "UNet"                     ? "sample.pt"
                              : network.rfind("ThreeHeads", 0) == 0 ? "heads.pt"
                                                                    : "encoder.pt";
  const std::string args = "--module make_samples:" + network + " --weights " + src + "/samples/models/" +
                           weights + " --window " + std::to_string(window) + " --device " + device;
  const auto can = runCommand(
      python +
      " -c \"import hashlib, os, sys, torch, setuptools.command.build_ext\n"
      "assert tuple(int(v) for v in torch.__version__.split('.')[:2]) >= (2, 6), torch.__version__\n"
      "env = sorted((k, v) for k, v in os.environ.items()\n"
      "             if k in ('CC', 'CXX') or k.startswith(('TORCHINDUCTOR_', 'AOT_INDUCTOR_')))\n"
      "try:\n"
      "    import torch.backends.cpu as cpu_backend\n"
      "    cpu = cpu_backend.get_cpu_capability()\n"
      "except Exception:\n"
      "    cpu = ''\n"
      "gpu = torch.cuda.get_device_capability() if '--device cuda' in sys.argv[4] else None\n"
      "h = hashlib.sha256(repr((sys.argv[1:], sys.executable, sys.version, torch.__version__, "
      "torch.__file__, "
      "torch.version.cuda, env, cpu, gpu)).encode())\n"
      "for f in sys.argv[1:4]: h.update(open(f, 'rb').read())\n"
      "print('digest', h.hexdigest())\" " +
      src + "/scripts/export_model.py " + src + "/samples/make_samples.py " + src + "/samples/models/" +
      weights + " '" + args + "'");
  const size_t digest_at = can.output.rfind("digest ");
  if (can.code != 0 || digest_at == std::string::npos) {
    *why = "no Python here exports .pt2 packages (PyTorch 2.6+ with setuptools): " +
           can.output.substr(can.output.rfind('\n', can.output.size() - 2) + 1);
    return "";
  }
  const std::string digest = can.output.substr(digest_at + 7, 64);
  const std::string out = dir + "/" + network + "_" + std::to_string(window) + "_" + device + ".pt2";
  const std::filesystem::path cached = std::string(TILER_BIN_DIR) + "/pt2-cache/" + digest + ".pt2";
  std::error_code ec;
  if (std::filesystem::copy_file(cached, out, std::filesystem::copy_options::overwrite_existing, ec))
    return out;
  const auto r = runCommand("PYTHONPATH=" + src + "/samples " + python + " " + src +
                            "/scripts/export_model.py " + args + " --out " + out);
  // Exit 3: the package is written, but Python's own loader crashed checking it (PyTorch 2.11 on CUDA): the
  // tests' own comparisons check it then.
  if (r.code != 0 && !(r.code == 3 && std::filesystem::exists(out))) {
    ADD_FAILURE() << "exporting the bundled " << network << " to .pt2 failed where Python can: " << r.output;
    *why = "the export failed";
    return "";
  }
  if (r.code != 0) return out;
  // Into the cache by a rename: shards exporting the same package at once each leave a whole file.
  const std::string part = cached.string() + "." + std::to_string(getpid()) + "." +
                           std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  std::filesystem::create_directories(cached.parent_path(), ec);
  if (std::filesystem::copy_file(out, part, std::filesystem::copy_options::overwrite_existing, ec))
    std::filesystem::rename(part, cached, ec);
  return out;
}

// The windows 0 to n-1, as a stitcher is fed them when every window is kept.
inline std::vector<int64_t> inOrder(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Runs shell commands at the same time (ranks of one world); returns their exit codes, in order.
inline std::vector<int> runConcurrently(const std::vector<std::string>& commands) {
  std::vector<pid_t> pids;
  for (const auto& cmd : commands) {
    pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", (cmd + " >/dev/null 2>&1").c_str(), nullptr);
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// What GEOS says of each geometry of the GeoJSON `path` (its validity reason, "Valid Geometry" when valid),
// through ogrinfo's SQLite dialect, as a consumer reads the file; a file ogrinfo refuses is one reason that
// says so. Nothing where ogrinfo, or its SpatiaLite functions, are not installed (the caller skips then).
inline std::vector<std::string> geometryValidity(const std::string& path) {
  if (runCommand("command -v ogrinfo").code != 0) return {};
  const std::string layer = std::filesystem::path(path).stem().string();
  const auto r = runCommand(
      "ogrinfo -ro -q -dialect SQLite -sql \"SELECT ST_IsValidReason(geometry) AS reason FROM \\\"" + layer +
      "\\\"\" '" + path + "'");
  if (r.output.find("no such function") != std::string::npos) return {};
  if (r.code != 0) return {"ogrinfo cannot read '" + path + "': " + r.output};
  std::vector<std::string> reasons;
  std::istringstream lines(r.output);
  const std::string key = "reason (String) = ";
  for (std::string line; std::getline(lines, line);)
    if (const auto at = line.find(key); at != std::string::npos)
      reasons.push_back(line.substr(at + key.size()));
  return reasons;
}

// The numbers h5dump prints for dataset `name` of an HDF5 `file` (with `select`: h5dump's -s/-c), row-major.
inline std::vector<double> h5dumpValues(const std::string& file, const std::string& name,
                                        const std::string& select = "") {
  auto r = runCommand("h5dump -y -w 0 -d " + name + " " + select + " " + file);
  EXPECT_EQ(r.code, 0) << r.output;
  const auto open = r.output.find("DATA {"), close = r.output.find('}', open);
  if (open == std::string::npos) return {};
  std::string data = r.output.substr(open + 6, close - open - 6);
  for (char& c : data)
    if (c == ',') c = ' ';
  std::istringstream in(data);
  std::vector<double> values;
  for (double v; in >> v;) values.push_back(v);
  return values;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every test executable removes its process's scratch directories (names holding "_<pid>") when its
// tests end, so that runs leave nothing behind in the temp dir.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    namespace fs = std::filesystem;
    const std::string tag = "_" + std::to_string(getpid());
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(::testing::TempDir(), ec)) {
      const std::string name = e.path().filename().string();
      const auto at = name.find(tag);
      if (at == std::string::npos) continue;
      const size_t end = at + tag.size();
      if (end == name.size() || name[end] == '_' || name[end] == '.') removeTree(e.path().string());
    }
  }
};
inline ::testing::Environment* const kScratchCleanup =
    ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

// The end-to-end suites' tiler processes run on the CPU whatever the machine has: on a one-GPU machine two
// ranks would both pick cuda:0 with NCCL (refused) and fp16. GPU tests live in suites of their own.
inline void pinChildProcessesToCpu() {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
}

// A fresh directory under the test temp dir, unique per process.
inline std::string scratchDir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(getpid()));
  removeTree(d.string());
  fs::create_directories(d);
  return d.string();
}

// A port that can be listened on, below Linux's ephemeral range (32768-60999): a port the kernel hands out
// as free may be taken a moment later as the local end of another test's connection, and then no one can
// listen on it. Claimed by a file for an hour, so that tests running side by side (ctest -j) never get the
// same port: two did once, and one agent joined the other test's rendezvous.
inline int freePort() {
  namespace fs = std::filesystem;
  static unsigned state = unsigned(getpid()) * 2654435761u ^ unsigned(time(nullptr)) ^
                          unsigned(std::chrono::steady_clock::now().time_since_epoch().count());
  const fs::path claims = fs::temp_directory_path() / "tiler-test-ports";
  std::error_code ec;
  fs::create_directories(claims, ec);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    state = state * 1103515245u + 12345u;
    const int port = 20000 + int((state >> 8) % 12000u);
    const fs::path claim = claims / std::to_string(port);
    const auto mtime = fs::last_write_time(claim, ec);
    if (!ec && fs::file_time_type::clock::now() - mtime < std::chrono::hours(1)) continue;
    fs::remove(claim, ec);
    const int fd = ::open(claim.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) continue;  // another process claimed it just now
    ::close(fd);
    if (portIsFree(port)) return port;
  }
  return 0;
}

// A TIFF whose header claims side x side pixels (10^6 by default) in one deflate strip, holding 16 bytes of
// data.
inline void writeAbsurdTiff(const std::string& path, int channels = 1, uint32_t side = 1000000) {
  TIFF* t = TIFFOpen(path.c_str(), "w");
  ASSERT_NE(t, nullptr);
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, side);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, side);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, channels);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, channels == 3 ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK);
  TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, side);
  TIFFSetField(t, TIFFTAG_COMPRESSION, COMPRESSION_ADOBE_DEFLATE);
  uint8_t data[16] = {0};
  TIFFWriteRawStrip(t, 0, data, sizeof data);
  TIFFClose(t);
}

}  // namespace tiler::test
