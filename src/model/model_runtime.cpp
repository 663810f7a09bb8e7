#include "tiler/model/model_runtime.hpp"

#include <c10/core/DeviceGuard.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/zip_archive.hpp"

namespace tiler {

namespace {

struct RuntimeBackend {
  bool (*claims)(const std::string& path);
  std::unique_ptr<ModelRuntime> (*open)(const RuntimeOptions& options);
};

bool anyFile(const std::string&) {
  return true;
}

// Little-endian fields of a zip's records.
uint64_t le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

bool readAt(std::ifstream& in, uint64_t offset, void* into, size_t bytes) {
  in.clear();
  in.seekg(std::streamoff(offset));
  return bool(in.read(static_cast<char*>(into), std::streamsize(bytes)));
}

// Where a zip's central directory lies and how long it is, from its end records (zip64's where the classic
// fields are saturated); nullopt if the file does not end as a zip does.
struct CentralDirectory {
  uint64_t offset = 0, bytes = 0;
};
std::optional<CentralDirectory> findCentralDirectory(std::ifstream& in, uint64_t file_size) {
  // The end record is the last 22 bytes unless a comment (at most 65535 bytes) follows it.
  const uint64_t tail_bytes = std::min<uint64_t>(file_size, 22 + 65535);
  std::vector<unsigned char> tail(tail_bytes);
  if (tail_bytes < 22 || !readAt(in, file_size - tail_bytes, tail.data(), tail_bytes)) return std::nullopt;
  for (uint64_t at = tail_bytes - 22 + 1; at-- > 0;) {
    const unsigned char* end = tail.data() + at;
    if (le(end, 4) != 0x06054b50) continue;
    CentralDirectory cd{le(end + 16, 4), le(end + 12, 4)};
    const uint64_t end_offset = file_size - tail_bytes + at;
    if ((cd.offset == 0xffffffffu || cd.bytes == 0xffffffffu) && end_offset >= 20) {
      unsigned char locator[20], end64[56];
      if (!readAt(in, end_offset - 20, locator, sizeof locator) || le(locator, 4) != 0x07064b50 ||
          !readAt(in, le(locator + 8, 8), end64, sizeof end64) || le(end64, 4) != 0x06064b50)
        return std::nullopt;
      cd = {le(end64 + 48, 8), le(end64 + 40, 8)};
    }
    if (cd.offset > file_size || cd.bytes > file_size - cd.offset) return std::nullopt;
    return cd;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> findZipEntry(const std::string& path,
                                        const std::function<bool(const std::string&)>& matches,
                                        size_t max_bytes) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) return std::nullopt;
  const auto cd = findCentralDirectory(in, file_size);
  // A package's directory is a few kB; a bound keeps a hostile file's claim from allocating gigabytes.
  if (!cd || cd->bytes > (64u << 20)) return std::nullopt;
  std::vector<unsigned char> dir(cd->bytes);
  if (!readAt(in, cd->offset, dir.data(), dir.size())) return std::nullopt;
  for (size_t at = 0; at + 46 <= dir.size() && le(&dir[at], 4) == 0x02014b50;) {
    const unsigned char* entry = &dir[at];
    const uint64_t method = le(entry + 10, 2), name_length = le(entry + 28, 2),
                   extra_length = le(entry + 30, 2);
    const size_t next = at + 46 + name_length + extra_length + le(entry + 32, 2);
    if (next > dir.size()) return std::nullopt;
    const std::string name(reinterpret_cast<const char*>(entry + 46), name_length);
    if (!matches(name)) {
      at = next;
      continue;
    }
    // Saturated sizes and offset are in the zip64 extra field (id 1), in this order, each only if saturated.
    uint64_t size = le(entry + 20, 4), local = le(entry + 42, 4);
    const bool size64 = size == 0xffffffffu, local64 = local == 0xffffffffu;
    for (size_t x = at + 46 + name_length; x + 4 <= at + 46 + name_length + extra_length;) {
      const uint64_t id = le(&dir[x], 2), length = le(&dir[x + 2], 2);
      if (id == 1) {
        size_t field = x + 4 + (le(entry + 24, 4) == 0xffffffffu ? 8 : 0);  // the uncompressed size first
        if (size64 && field + 8 <= dir.size()) size = le(&dir[field], 8), field += 8;
        if (local64 && field + 8 <= dir.size()) local = le(&dir[field], 8);
      }
      x += 4 + length;
    }
    if (method != 0 || size > max_bytes) return std::string();
    unsigned char header[30];
    if (!readAt(in, local, header, sizeof header) || le(header, 4) != 0x04034b50) return std::nullopt;
    const uint64_t data = local + 30 + le(header + 26, 2) + le(header + 28, 2);
    if (data > file_size || size > file_size - data) return std::nullopt;
    std::string bytes(size, '\0');
    if (!readAt(in, data, bytes.data(), bytes.size())) return std::nullopt;
    return bytes;
  }
  return std::nullopt;
}

bool isPt2Package(const std::string& path) {
  // Wherever the writer put it (PyTorch 2.6's Python zipfile: second; 2.11's C++ writer: after its data); a
  // TorchScript file has no such entry.
  const auto format = findZipEntry(
      path,
      [](const std::string& name) {
        return name == "archive_format" || nameEndsWith(name, "/archive_format");
      },
      64);
  return format && (format->empty() || *format == "pt2");  // empty: compressed, the name says enough
}

namespace {

// The child of probeShapesInChild is this same executable, started anew (a fork of a process that has
// started CUDA or OpenMP cannot use them), with this variable set: it runs the probe before main and exits.
constexpr const char* kProbeVariable = "TILER_SHAPE_PROBE";
constexpr int kMaxProbedChannels = 16;
constexpr int kProbeSeconds = 300;  // one child's load and runs; past it the child counts as hung

// The (channels, batch) pairs a probe tries, in order: fewest channels first, batch 1 before the batch.
std::vector<std::pair<int, int64_t>> probedShapes(int64_t batch) {
  std::vector<std::pair<int, int64_t>> shapes;
  for (int c = 1; c <= kMaxProbedChannels; ++c) {
    shapes.emplace_back(c, 1);
    if (batch > 1) shapes.emplace_back(c, batch);
  }
  return shapes;
}

std::string shapeText(int c, int64_t b, int64_t w, int64_t h) {
  return "[" + std::to_string(b) + ", " + std::to_string(c) + ", " + std::to_string(h) + ", " +
         std::to_string(w) + "]";
}

// Zeros of `sizes` (float32) that end where a page the process may not read begins: code that reads past
// them crashes at once instead of reading whatever follows.
torch::Tensor zerosBeforeAGuardPage(const std::vector<int64_t>& sizes) {
  int64_t count = 1;
  for (int64_t s : sizes) count *= s;
  const size_t bytes = size_t(count) * sizeof(float), page = size_t(sysconf(_SC_PAGESIZE));
  const size_t data_pages = (bytes + page - 1) / page;
  void* base =
      mmap(nullptr, (data_pages + 1) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TILER_CHECK(base != MAP_FAILED, ModelError, "mapping " << bytes << " bytes: " << std::strerror(errno));
  char* guard = static_cast<char*>(base) + data_pages * page;
  TILER_CHECK(mprotect(guard, page, PROT_NONE) == 0, ModelError, "guard page: " << std::strerror(errno));
  // 64-byte aligned, as kernels may assume: at most 60 bytes lie between the last value and the guard.
  const uintptr_t start = (reinterpret_cast<uintptr_t>(guard) - bytes) & ~uintptr_t(63);
  return torch::from_blob(reinterpret_cast<void*>(start), sizes, torch::kFloat32);  // the child's to the end
}

// Why a run failed, in one line: the TorchScript interpreter's last (its first is "The following operation
// failed"); a package's one.
std::string lastLine(const std::exception& e) {
  const std::string what = withoutBacktrace(e.what());
  return what.substr(what.rfind('\n') == std::string::npos ? 0 : what.rfind('\n') + 1);
}

// What the probe's runtime writes to stderr (a package's input checks say what they expected there), sent to
// a memory file and read back after each run.
class ProbeStderr {
 public:
  ProbeStderr() {
    const int copy = memfd_create("tiler-shape-probe", 0);
    if (copy >= 0) dup2(copy, 2);
  }
  // The first line of the last input check written since the last call; empty: none.
  std::string lastInputCheck() {
    std::string text(size_t(std::max<off_t>(lseek(2, 0, SEEK_END) - read_to_, 0)), '\0');
    text.resize(size_t(std::max<ssize_t>(pread(2, text.data(), text.size(), read_to_), 0)));
    read_to_ += off_t(text.size());
    const size_t at = text.rfind("input_handles[");
    return at == std::string::npos ? std::string() : firstLine(text.substr(at));
  }

 private:
  off_t read_to_ = 0;
};

// Zeros of `sizes` on `device` (on the CPU before a guard page).
torch::Tensor probeInput(const std::vector<int64_t>& sizes, const torch::Device& device) {
  return device.is_cpu() ? zerosBeforeAGuardPage(sizes) : torch::zeros(sizes, device);
}

// A package learns nothing safely unless it checks its input's shape: one that does not reads as many
// values as it was compiled for, and an input of as many values in another shape ([1, 12, 32, 32] for
// [1, 3, 64, 64]) would run, into garbage. A shape no model takes must be refused by its checks.
bool refusesAShapeNoModelTakes(ModelRuntime& runtime, const torch::Device& device, ProbeStderr& stderr_copy) {
  try {
    c10::InferenceMode inference;
    runtime.run(probeInput({1, 1, 1, 1}, device));
  } catch (const std::exception&) {
    return !stderr_copy.lastInputCheck().empty();
  }
  return false;
}

// Runs zeros of [b, c, h, w]; throws unless it runs and every output tensor (one, a tuple's, a dict's) is of
// the batch of b.
void runProbedShape(ModelRuntime& runtime, const torch::Device& device, int c, int64_t b, int64_t h,
                    int64_t w) {
  c10::InferenceMode inference;
  const c10::IValue out = runtime.run(probeInput({b, c, h, w}, device));
  std::vector<torch::Tensor> tensors;
  if (out.isTensor()) tensors.push_back(out.toTensor());
  if (out.isTuple())
    for (const auto& e : out.toTuple()->elements())
      if (e.isTensor()) tensors.push_back(e.toTensor());
  if (out.isGenericDict())  // a package whose call spec names its outputs
    for (const auto& e : out.toGenericDict())
      if (e.value().isTensor()) tensors.push_back(e.value().toTensor());
  for (const auto& t : tensors) {
    const torch::Tensor here = t.to(torch::kCPU);  // a device's errors surface by this copy
    if (here.dim() == 0 || here.size(0) != b)
      throw std::runtime_error("its output " + c10::str(here.sizes()) + " is not of the batch of " +
                               std::to_string(b) + " it was given");
  }
}

// The child: "FD;DEVICE;W;H;BATCH;FIRST;PATH". Tries the shapes from index FIRST on, writing to FD "try K",
// then "pass K" or "fail K <why>", and "done" once a channel count has run at any batch (or none is left);
// "error <why>" when no shape can be learnt.
int runShapeProbe(const std::string& spec) {
  std::istringstream in(spec);
  std::string fd_text, device_text, w_text, h_text, batch_text, first_text, path;
  for (std::string* field : {&fd_text, &device_text, &w_text, &h_text, &batch_text, &first_text})
    std::getline(in, *field, ';');
  std::getline(in, path, '\0');
  const int fd = std::atoi(fd_text.c_str());
  const auto say = [fd](const std::string& line) { writeAll(fd, line + "\n"); };
  try {
    const int64_t w = std::atoll(w_text.c_str()), h = std::atoll(h_text.c_str()),
                  batch = std::atoll(batch_text.c_str());
    RuntimeOptions options;
    options.path = path;
    options.device = torch::Device(device_text);
    options.batch = batch;
    options.in_probe = true;
    c10::OptionalDeviceGuard on_device;
    if (!options.device.is_cpu()) on_device.reset_device(options.device);
    auto runtime = openModelRuntime(options);
    ProbeStderr stderr_copy;
    if (std::string(runtime->name()) == "pt2") {
      say("checking");
      if (!refusesAShapeNoModelTakes(*runtime, options.device, stderr_copy)) {
        say("error it does not check the shape of its input (a package compiled without AOTInductor's input "
            "checks, which AOTI_RUNTIME_CHECK_INPUTS turns on): a window of another shape would run into "
            "garbage undetected");
        return 1;
      }
    }
    const auto shapes = probedShapes(batch);
    int passed_channels = 0;
    for (size_t k = size_t(std::atoi(first_text.c_str())); k < shapes.size(); ++k) {
      const auto [c, b] = shapes[k];
      if (passed_channels != 0 && c != passed_channels) break;
      say("try " + std::to_string(k));
      try {
        runProbedShape(*runtime, options.device, c, b, h, w);
        say("pass " + std::to_string(k));
        passed_channels = c;
      } catch (const std::exception& e) {
        const std::string check = stderr_copy.lastInputCheck();
        say("fail " + std::to_string(k) + " " + (check.empty() ? lastLine(e) : check));
      }
    }
  } catch (const std::exception& e) {
    say("error " + lastLine(e));
    return 1;
  }
  say("done");
  return 0;
}

// Before main, in the probe's child only.
[[maybe_unused]] const bool kInShapeProbe = [] {
  const char* spec = std::getenv(kProbeVariable);
  if (spec == nullptr) return false;
  _exit(runShapeProbe(spec));
}();

// One child from shape `first` on: what it said, and how it ended ("" when it said "done").
struct ChildRun {
  std::vector<std::string> lines;
  std::string ended;
};

ChildRun runProbeChild(const RuntimeOptions& options, int64_t w, int64_t h, size_t first) {
  int fds[2];
  TILER_CHECK(pipe2(fds, O_CLOEXEC) == 0, ModelError,
              "'" << options.path << "': pipe: " << std::strerror(errno));
  const std::string spec = std::to_string(fds[1]) + ";" + options.device.str() + ";" + std::to_string(w) +
                           ";" + std::to_string(h) + ";" + std::to_string(options.batch) + ";" +
                           std::to_string(first) + ";" + options.path;
  // The environment is made before fork: a child between fork and exec may only make async-signal-safe calls.
  const std::string probe_variable = std::string(kProbeVariable) + "=", checks = "AOTI_RUNTIME_CHECK_INPUTS=";
  std::vector<std::string> env = {probe_variable + spec, checks + "1"};
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, checks.c_str(), checks.size()) != 0 &&
        std::strncmp(*e, probe_variable.c_str(), probe_variable.size()) != 0)
      env.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char name[] = "tiler-shape-probe";
  char* argv[] = {name, nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);              // never outlives the job
    fcntl(fds[1], F_SETFD, 0);                     // the one descriptor of this process the child keeps
    const int null = open("/dev/null", O_WRONLY);  // the package's own prints stay out of the job's log
    if (null >= 0) dup2(null, 1), dup2(null, 2);
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  close(fds[1]);
  TILER_CHECK(pid > 0, ModelError, "'" << options.path << "': fork: " << std::strerror(errno));
  ChildRun run;
  std::string pending;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kProbeSeconds);
  bool hung = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fds[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, int(left.count())) == 0) {
      hung = true;
      kill(pid, SIGKILL);
      break;
    }
    char buffer[4096];
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, size_t(n));
    for (size_t end; (end = pending.find('\n')) != std::string::npos; pending.erase(0, end + 1))
      run.lines.push_back(pending.substr(0, end));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (hung)
    run.ended = "did not finish within " + std::to_string(kProbeSeconds) + " s";
  else if (WIFSIGNALED(status))
    run.ended = std::string("crashed (") + strsignal(WTERMSIG(status)) + ")";
  else if (run.lines.empty() || run.lines.back() != "done")
    run.ended = "ended with exit code " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return run;
}

}  // namespace

ShapeProbe probeShapesInChild(const RuntimeOptions& options, int64_t w, int64_t h) {
  const auto shapes = probedShapes(options.batch);
  std::vector<std::string> why(shapes.size());
  std::vector<bool> passed(shapes.size(), false);
  ShapeProbe found;
  for (size_t first = 0; first < shapes.size() && found.channels == 0;) {
    const ChildRun run = runProbeChild(options, w, h, first);
    size_t trying = first;
    bool said_done = false, tried = false, checking = false;
    for (const std::string& line : run.lines) {
      std::istringstream words(line);
      std::string word;
      size_t k = 0;
      words >> word;
      if (word == "error") {  // no shape can be learnt: the child says why
        found.refusal = line.substr(6);
        return found;
      }
      checking = checking || word == "checking";
      said_done = said_done || word == "done";
      if (!(words >> k) || k >= shapes.size()) continue;
      if (word == "try") trying = k, tried = true;
      if (word == "pass") passed[k] = true;
      if (word == "fail") why[k] = line.substr(std::min(line.size(), line.find(' ', 5) + 1));
    }
    if (!tried && !run.ended.empty()) {  // before any shape: loading it, or the shape no model takes
      found.refusal = checking ? "it does not check the shape of its input: a [1, 1, 1, 1] input " + run.ended
                               : "loading it " + run.ended;
      return found;
    }
    if (!run.ended.empty()) why[trying] = "it " + run.ended;
    for (size_t k = 0; k < shapes.size(); ++k)
      if (passed[k] && found.channels == 0) found.channels = shapes[k].first;
    if (said_done || run.ended.empty()) break;
    first = trying + 1;
  }
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (!passed[k] || shapes[k].first != found.channels) continue;
    (shapes[k].second == 1 ? found.batch_one : found.batch_full) = true;
  }
  if (found.channels == 0) {
    // [1, 3, h, w] and [batch, 3, h, w]: what most models take, and why they did not run.
    const auto three = [&](int64_t b) {
      size_t k = 0;
      while (k < shapes.size() && shapes[k] != std::pair<int, int64_t>(3, b)) ++k;
      return shapeText(3, b, w, h) + " (" + (k < shapes.size() && !why[k].empty() ? why[k] : "not tried") +
             ")";
    };
    found.refusal = "it does not run " + three(1) +
                    (options.batch > 1 ? ", nor " + three(options.batch) : "") + ", nor 1 to " +
                    std::to_string(kMaxProbedChannels) + " input channels at batch 1" +
                    (options.batch > 1 ? " or " + std::to_string(options.batch) : std::string());
  }
  return found;
}

c10::IValue ModelRuntime::runUnoptimized(const torch::Tensor& nchw) {
  return run(nchw);
}

std::unique_ptr<ModelRuntime> openModelRuntime(const RuntimeOptions& options) {
  // TorchScript last: anything else (a directory, a missing file too) goes to loadTorchScript, whose errors
  // say what the file is not.
  static const std::vector<RuntimeBackend> backends = {{isPt2Package, openPt2Runtime},
                                                       {anyFile, openTorchScriptRuntime}};
  for (const auto& backend : backends) {
    if (!backend.claims(options.path)) continue;
    // A package loads from its path, so its digest is of the file as it lies; TorchScript's is of the bytes
    // it loads (loadTorchScript).
    if (backend.open == openPt2Runtime && !options.sha256.empty())
      requireSha256(options.path, sha256OfFileOrZipMember(options.path, kMaxZipWeightsBytes), options.sha256,
                    "weights.torchscript", options.sha256_card);
    return backend.open(options);
  }
  TILER_THROW(ModelError, "'" << options.path << "': no runtime takes this file");
}

}  // namespace tiler
