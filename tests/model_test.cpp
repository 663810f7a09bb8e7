#include "tiler/model/model.hpp"

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/ctrun/launcher.hpp"
#include "tiler/tasks/registry.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

std::string tempPath(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("model_" + std::to_string(getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

// A TorchScript module with a 1x1 convolution weight `w` (out x in) and the given forward body.
std::string saveModule(const std::string& name, int in, int out, const std::string& forward) {
  torch::jit::Module m("M");
  torch::manual_seed(1);
  m.register_parameter("w", torch::randn({out, in, 1, 1}) * 0.5, false);
  m.register_parameter("b", torch::randn({out}) * 0.1, false);
  m.define(forward);
  auto path = tempPath(name + ".pt");
  m.save(path);
  return path;
}

const char* kConv = R"JIT(
def forward(self, x):
    return torch.conv2d(x, self.w, self.b)
)JIT";

ModelOptions cpuOptions(const std::string& path) {
  ModelOptions o;
  o.path = path;
  o.device = "cpu";
  return o;
}

// Probing a runner of `o` at `window` is a ModelError naming the file and saying `needle`.
void expectProbeError(const ModelOptions& o, const std::string& needle, int64_t window = 32) {
  try {
    ModelRunner r(o);
    r.probe(window, window);
    FAIL() << "no error for " << o.path;
  } catch (const ModelError& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(o.path), std::string::npos) << e.message();
  }
}

void expectModelError(const std::string& path, const std::string& needle, int64_t window = 32) {
  expectProbeError(cpuOptions(path), needle, window);
}

TEST(Model, ProbeFindsChannelsAndScale) {
  ModelRunner r(cpuOptions(saveModule("conv", 3, 2, kConv)));
  auto p = r.probe(64, 48);
  EXPECT_EQ(p.input_channels, 3);
  EXPECT_EQ(p.output_channels, 2);
  EXPECT_EQ(p.scale, (Scale{1, 1}));
  ModelRunner gray(cpuOptions(saveModule("gray", 1, 4, kConv)));
  EXPECT_EQ(gray.probe(32, 32).input_channels, 1);
}

TEST(Model, TheOutputShapeAndTaskDecideWhatAModelIs) {
  const auto none = Activation::kNone, softmax = Activation::kSoftmax;
  const std::vector<int64_t> map = {1, 2, 32, 32}, vector = {1, 7}, pooled = {1, 7, 1, 1};
  EXPECT_EQ(&resolveTask(nullptr, map, none, false, "m"), findTask("segment"));
  EXPECT_EQ(&resolveTask(nullptr, vector, none, false, "m"), findTask("embed"));
  EXPECT_EQ(&resolveTask(nullptr, vector, softmax, false, "m"), findTask("classify"));
  EXPECT_EQ(&resolveTask(nullptr, vector, Activation::kSigmoid, false, "m"), findTask("classify"));
  EXPECT_EQ(&resolveTask(nullptr, vector, none, true, "m"), findTask("classify")) << "--classes";
  EXPECT_EQ(&resolveTask(findTask("classify"), vector, none, false, "m"), findTask("classify"));
  EXPECT_EQ(&resolveTask(findTask("embed"), vector, softmax, false, "m"), findTask("embed"));
  EXPECT_EQ(&resolveTask(findTask("embed"), pooled, none, false, "m"), findTask("embed"));
  EXPECT_EQ(&resolveTask(nullptr, pooled, none, false, "m"), findTask("segment"))
      << "a 1x1 map of a window is a valid segmentation at 1/window scale unless a task says otherwise";
  EXPECT_THROW(resolveTask(findTask("segment"), vector, none, false, "m"), ModelError);
  EXPECT_THROW(resolveTask(findTask("embed"), map, none, false, "m"), ModelError);
  // A detector's [1, N, 6], N = 0 included: a window where it found nothing.
  EXPECT_EQ(&resolveTask(findTask("detect"), {1, 5, 6}, none, false, "m"), findTask("detect"));
  EXPECT_EQ(&resolveTask(findTask("detect"), {1, 0, 6}, none, false, "m"), findTask("detect"));
  EXPECT_THROW(resolveTask(findTask("detect"), {1, 5, 5}, none, false, "m"), ModelError);
  for (const auto& bad : std::vector<std::vector<int64_t>>{{}, {1}, {1, 7, 3}, {1, 2, 3, 4, 5}})
    for (const Task* task : {static_cast<const Task*>(nullptr), findTask("embed"), findTask("classify")})
      EXPECT_THROW(resolveTask(task, bad, none, false, "m"), ModelError) << bad.size();
}

// A one-channel map's label threshold follows the activation: sigmoid probabilities at 0.5, logits at 0.
TEST(Model, TheLabelThresholdFollowsTheActivation) {
  EXPECT_EQ(labelThreshold(Activation::kSigmoid), 0.5f);
  EXPECT_EQ(labelThreshold(Activation::kNone), 0.0f);
  EXPECT_EQ(labelThreshold(Activation::kSoftmax), 0.0f);
}

TEST(Model, APooledClassifierIsFlattenedAndItsFlipsAveragedAsTheyAre) {
  // A [B, K, 1, 1] head (a 1x1 convolution after global pooling) asked for as a classifier: [B, K].
  auto pooled = saveModule("pooled", 3, 2, R"JIT(
def forward(self, x):
    return torch.conv2d(torch.mean(x * torch.arange(x.size(3), dtype=x.dtype), [2, 3], True), self.w, self.b)
)JIT");
  auto o = cpuOptions(pooled);
  o.task = findTask("classify");
  ModelRunner r(o);
  const auto& p = r.probe(8, 8);
  EXPECT_EQ(p.task, findTask("classify"));
  EXPECT_EQ(p.output_channels, 2);
  auto x = torch::rand({3, 3, 8, 8});
  auto plain = r.forward(x, torch::ones({3}));
  EXPECT_EQ(plain.sizes(), torch::IntArrayRef({3, 2}));
  // flip: the window and its mirror, averaged; a vector is not mirrored back.
  o.tta = Tta::kFlip;
  ModelRunner flipped(o);
  flipped.probe(8, 8);
  auto expected = (plain + r.forward(x.flip({3}), torch::ones({3}))) / 2;
  EXPECT_TRUE(torch::allclose(flipped.forward(x, torch::ones({3})), expected, 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(plain, expected, 1e-3, 1e-3)) << "the weights make the mirror differ";
}

TEST(Model, OutputScaleTwoAndHalfDetected) {
  auto up = saveModule("up", 3, 1, R"JIT(
def forward(self, x):
    y = torch.conv2d(x, self.w, self.b)
    return y.repeat_interleave(2, 2).repeat_interleave(2, 3)
)JIT");
  EXPECT_EQ(ModelRunner(cpuOptions(up)).probe(32, 32).scale, (Scale{2, 1}));
  auto down = saveModule("down", 3, 1, R"JIT(
def forward(self, x):
    return torch.conv2d(x, self.w, self.b)[:, :, ::2, ::2]
)JIT");
  EXPECT_EQ(ModelRunner(cpuOptions(down)).probe(32, 32).scale, (Scale{1, 2}));
}

TEST(Model, TupleAndDictOutputs) {
  auto tuple = saveModule("tuple", 3, 2, R"JIT(
def forward(self, x):
    return (torch.conv2d(x, self.w, self.b), x)
)JIT");
  EXPECT_EQ(ModelRunner(cpuOptions(tuple)).probe(16, 16).output_channels, 2);
  auto dict = saveModule("dict", 3, 2, R"JIT(
def forward(self, x):
    return {"aux": x, "seg": torch.conv2d(x, self.w, self.b)}
)JIT");
  auto o = cpuOptions(dict);
  o.output_key = "seg";
  EXPECT_EQ(ModelRunner(o).probe(16, 16).output_channels, 2);
  o.output_key = "nope";
  try {
    ModelRunner(o).probe(16, 16);
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(e.message().find("no key 'nope'"), std::string::npos) << e.message();
  }
  // An index picks a dict's entry in its order, as a .pt2 package's outputs were picked before their names
  // (a key that is a name wins over a position).
  const auto x = torch::rand({2, 3, 16, 16});
  o.output_key = "seg";
  ModelRunner by_name(o);
  o.output_key = "1";
  ModelRunner by_index(o);
  EXPECT_EQ(by_index.probe(16, 16).output_channels, 2);
  by_name.probe(16, 16);
  EXPECT_TRUE(torch::equal(by_index.forward(x, torch::ones({2})), by_name.forward(x, torch::ones({2}))));
  o.output_key = "2";
  expectProbeError(o, "output dict has no key '2'", 16);
  auto numbered = saveModule("numbered", 3, 2, R"JIT(
def forward(self, x):
    return {"1": torch.conv2d(x, self.w, self.b), "0": x}
)JIT");
  o = cpuOptions(numbered);
  o.output_key = "1";
  EXPECT_EQ(ModelRunner(o).probe(16, 16).output_channels, 2) << "the key named 1, not the entry at 1";
  // A tuple takes an index only.
  o = cpuOptions(tuple);
  o.output_key = "seg";
  expectProbeError(o, "output is a tuple; --output_key must be an index, got 'seg'", 16);
  // One tensor is output 0 and nothing else (--heads a,b would write one map twice).
  auto single = saveModule("single", 3, 2, R"JIT(
def forward(self, x):
    return torch.conv2d(x, self.w, self.b)
)JIT");
  o = cpuOptions(single);
  o.output_key = "0";
  EXPECT_EQ(ModelRunner(o).probe(16, 16).output_channels, 2);
  o.output_key = "b";
  expectProbeError(o, "the model returns one tensor, which has no output 'b'", 16);
}

TEST(Model, EachMisfitIsAClearModelError) {
  expectModelError(tempPath("missing.pt"), "model file not found");
  auto corrupt = tempPath("corrupt.pt");
  std::ofstream(corrupt) << "definitely not a zip archive";
  expectModelError(corrupt, "is not a TorchScript file");
  auto state = tempPath("state_dict.pt");
  torch::save(std::vector<torch::Tensor>{torch::ones({2, 2})}, state);
  expectModelError(state, "is not a TorchScript model");
  // What Python's torch.save(model.state_dict()) writes (made by samples/make_samples.py).
  expectModelError(std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/state_dict.pt",
                   "is not a TorchScript file");
  expectModelError(saveModule("two_inputs", 3, 2, R"JIT(
def forward(self, x, y):
    return x + y
)JIT"),
                   "forward() takes 2 inputs");
  expectModelError(saveModule("list_input", 3, 2, R"JIT(
def forward(self, x: List[Tensor]):
    return x[0]
)JIT"),
                   "not a Tensor");
  expectModelError(saveModule("not_nchw", 3, 2, R"JIT(
def forward(self, x):
    return torch.conv2d(x, self.w, self.b).sum(1)
)JIT"),
                   "output [1, 32, 32] has 3 dimension(s); tiler takes NCHW maps (--task segment), one "
                   "vector per window, [batch, D] (--task classify | embed), boxes, [batch, N, 6] (--task "
                   "detect), instance maps, [batch, 1 + K, h, w] (--task instances) or regression maps, NCHW "
                   "(--task regress)");
  expectModelError(saveModule("odd_size", 3, 2, R"JIT(
def forward(self, x):
    return torch.conv2d(x, self.w, self.b)[:, :, :10, :10]
)JIT"),
                   "not an exact integer multiple or fraction", 32);
  expectModelError(saveModule("number", 3, 2, R"JIT(
def forward(self, x):
    return 3
)JIT"),
                   "not a tensor");
  // A list says it is one, and what it holds.
  expectModelError(
      saveModule("nested", 3, 2, R"JIT(
def forward(self, x):
    return [[torch.conv2d(x, self.w, self.b)]]
)JIT"),
      "the model's output is a list of 1 item(s), List[List[Tensor]], with no tensor among them");
  expectModelError(saveModule("numbers", 3, 2, R"JIT(
def forward(self, x):
    return (1, 2.5)
)JIT"),
                   "output is a tuple of 2 item(s), Tuple[int, float], with no tensor");
}

// What stands at -m, where it is no file to load: said as it is, never "not found", and never opened (a FIFO
// would block the load for ever).
TEST(Model, AModelPathThatIsNoFileSaysWhatItIs) {
  const std::string fifo = tempPath("fifo.pt");
  fs::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expectModelError(fifo, "is a FIFO (named pipe); -m takes a model file");
  expectModelError("/dev/zero", "is a character device; -m takes a model file");
  const std::string loop = tempPath("loop.pt"), back = tempPath("loop_back.pt");
  fs::remove(loop);
  fs::remove(back);
  fs::create_symlink(back, loop);
  fs::create_symlink(loop, back);
  expectModelError(loop, "is a loop of symbolic links");
  const std::string dangling = tempPath("dangling.pt");
  fs::remove(dangling);
  fs::create_symlink(tempPath("nowhere.pt"), dangling);
  expectModelError(dangling, "is a symbolic link to nothing");
  expectModelError(tempPath("absent.pt"), "model file not found");
}

TEST(Model, NormalisationOnTheDevicePerBatch) {
  // 1x1 identity convolution 3 -> 3: the output is the normalised input.
  torch::jit::Module m("Id");
  m.register_parameter("w", torch::eye(3).view({3, 3, 1, 1}), false);
  m.define("def forward(self, x):\n    return torch.conv2d(x, self.w)\n");
  auto path = tempPath("identity.pt");
  m.save(path);
  auto o = cpuOptions(path);
  o.mean = {0.5, 0.25, 0.0};
  o.std = {0.5};
  ModelRunner r(o);
  r.probe(4, 4);
  auto batch = torch::full({2, 3, 4, 4}, 255.0f);
  batch[1] = 0.0f;
  auto scales = torch::tensor({1.0f / 255.0f, 1.0f});
  auto out = r.forward(batch, scales);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 4, 4}));
  EXPECT_NEAR(out[0][0][0][0].item<float>(), (1.0 - 0.5) / 0.5, 1e-6);
  EXPECT_NEAR(out[0][1][0][0].item<float>(), (1.0 - 0.25) / 0.5, 1e-6);
  EXPECT_NEAR(out[1][2][3][3].item<float>(), 0.0, 1e-6);
  // A batch of bytes (8-bit images) gives the float batch's outputs exactly, and is left as it was.
  auto noise = torch::randint(0, 256, {2, 3, 4, 4}, torch::kUInt8);
  const auto kept = noise.clone();
  EXPECT_TRUE(torch::equal(r.forward(noise, scales), r.forward(noise.to(torch::kFloat32), scales)));
  EXPECT_TRUE(torch::equal(noise, kept));
  o.mean = {1, 2};
  ModelRunner bad(o);
  EXPECT_THROW(bad.probe(4, 4), ConfigError);
}

TEST(Model, ActivationsAreAppliedPerWindow) {
  auto o = cpuOptions(saveModule("act", 3, 4, kConv));
  o.activation = Activation::kSoftmax;
  ModelRunner r(o);
  r.probe(8, 8);
  auto out = r.forward(torch::rand({2, 3, 8, 8}), torch::ones({2}));
  EXPECT_TRUE(torch::allclose(out.sum(1), torch::ones({2, 8, 8}), 1e-5, 1e-5));
  o.activation = Activation::kSigmoid;
  ModelRunner s(o);
  s.probe(8, 8);
  auto sig = s.forward(torch::rand({1, 3, 8, 8}), torch::ones({1}));
  EXPECT_TRUE((sig > 0).all().item<bool>() && (sig < 1).all().item<bool>());
}

TEST(Model, TtaMapsEachViewBackAndAverages) {
  // A 1x1 convolution (the same under every rotation and mirror) plus a left-to-right ramp (not): mapped
  // back and averaged, the ramp's views become its mean, (W-1)/2, everywhere; the convolution is unchanged.
  const char* ramp = R"JIT(
def forward(self, x):
    ramp = torch.arange(x.size(3), dtype=x.dtype).view(1, 1, 1, -1)
    return torch.conv2d(x, self.w, self.b) + ramp
)JIT";
  const auto x = torch::rand({3, 3, 8, 8});
  const auto scales = torch::ones({3});
  ModelRunner plain(cpuOptions(saveModule("tta_conv", 3, 2, kConv)));
  plain.probe(8, 8);
  const auto expected = plain.forward(x, scales) + 3.5;
  for (Tta tta : {Tta::kFlip, Tta::kD4}) {
    auto o = cpuOptions(saveModule("tta_ramp", 3, 2, ramp));
    o.tta = tta;
    ModelRunner r(o);
    r.probe(8, 8);
    const auto out = r.forward(x, scales);
    EXPECT_EQ(out.sizes(), expected.sizes());
    EXPECT_TRUE(torch::allclose(out, expected, 1e-5, 1e-5)) << ttaName(tta);
  }
  // Without TTA the ramp stays.
  ModelRunner none(cpuOptions(saveModule("tta_none", 3, 2, ramp)));
  none.probe(8, 8);
  EXPECT_FALSE(torch::allclose(none.forward(x, scales), expected, 1e-3, 1e-3));
  EXPECT_THROW(parseTta("d8"), ConfigError);
}

// A model of three outputs (a dict) run with one HeadOptions each: one forward a batch (the module counts its
// calls), every head probed as its own task and activated as its own, the heads side by side in each window's
// row, each equal to a runner of that output alone (--output_key), under TTA too.
TEST(Model, HeadsRunOnceAndEachEqualsItsOutputAlone) {
  torch::jit::Module m("Heads");
  torch::manual_seed(2);
  m.register_parameter("w", torch::randn({4, 3, 1, 1}), false);
  m.register_buffer("calls", torch::zeros({1}));
  m.define(R"JIT(
def forward(self, x):
    self.calls += 1
    f = torch.conv2d(x, self.w)
    ramp = torch.arange(x.size(3), dtype=x.dtype).view(1, 1, 1, -1)
    return {"np": f[:, 0:2] + ramp, "hv": torch.tanh(f[:, 2:4]), "v": torch.mean(f, [2, 3])}
)JIT");
  const std::string path = tempPath("heads.pt");
  m.save(path);
  const auto x = torch::rand({3, 3, 8, 8});
  const auto scales = torch::ones({3});
  for (Tta tta : {Tta::kNone, Tta::kD4}) {
    ModelOptions o = cpuOptions(path);
    o.tta = tta;
    o.heads = {{"np", "np", findTask("segment"), Activation::kSoftmax, false},
               {"hv", "hv", nullptr, Activation::kNone, false},
               {"v", "v", findTask("classify"), Activation::kSigmoid, false}};
    ModelRunner heads(o);
    heads.probe(8, 8);
    ASSERT_EQ(heads.headProbes().size(), 3u);
    EXPECT_EQ(heads.headProbes()[1].task, findTask("segment")) << "a map without a task named: segment";
    EXPECT_EQ(heads.headProbes()[2].task, findTask("classify"));
    const double before = heads.module().attr("calls").toTensor().item<double>();
    const auto packed = heads.forward(x, scales);
    EXPECT_EQ(heads.module().attr("calls").toTensor().item<double>() - before, 1.0) << "one forward";
    ASSERT_EQ(packed.sizes(), torch::IntArrayRef({3, 2 * 64 + 2 * 64 + 4}));
    int64_t at = 0;
    for (const HeadOptions& head : o.heads) {
      ModelOptions alone = cpuOptions(path);
      alone.tta = tta;
      alone.output_key = head.key;
      alone.task = head.task;
      alone.activation = head.activation;
      ModelRunner one(alone);
      one.probe(8, 8);
      const auto expected = one.forward(x, scales).flatten(1);
      EXPECT_TRUE(torch::equal(packed.narrow(1, at, expected.size(1)), expected))
          << head.name << ttaName(tta);
      at += expected.size(1);
    }
  }
  // One head of several outputs is a row a window too, as the job's prediction size says.
  ModelOptions one = cpuOptions(path);
  one.heads = {{"hv", "hv", findTask("segment"), Activation::kNone, false}};
  ModelRunner single(one);
  single.probe(8, 8);
  EXPECT_EQ(single.forward(x, scales).sizes(), torch::IntArrayRef({3, 2 * 64}));
  // A head whose output is no tensor is named.
  ModelOptions o = cpuOptions(path);
  o.heads = {{"np", "np", nullptr, Activation::kNone, false}, {"x", "x", nullptr, Activation::kNone, false}};
  ModelRunner bad(o);
  try {
    bad.probe(8, 8);
    FAIL() << "no error for a missing head";
  } catch (const ModelError& e) {
    EXPECT_NE(e.message().find("output dict has no key 'x'"), std::string::npos) << e.message();
  }
}

// A convolution (padding 1) whose running sums are rounded to bf16 after every product added, in one order:
// what LibTorch 1.13's own bf16 GEMM does on a CPU without AVX-512 (oneDNN's bf16 kernels need it), where
// the accumulator is the output's bf16 element. `x` and `w` hold bf16 values.
torch::Tensor conv2dSummingInBf16(const torch::Tensor& x, const torch::Tensor& w) {
  using torch::indexing::Slice;
  const int64_t h = x.size(2), width = x.size(3), kh = w.size(2), kw = w.size(3);
  const auto padded = torch::constant_pad_nd(x, {kw / 2, kw / 2, kh / 2, kh / 2});
  auto sum = torch::zeros({x.size(0), w.size(0), h, width}, torch::kBFloat16);
  for (int64_t c = 0; c < x.size(1); ++c)
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j) {
        const auto term = padded.index({Slice(), Slice(c, c + 1), Slice(i, i + h), Slice(j, j + width)}) *
                          w.index({Slice(), c, i, j}).view({1, -1, 1, 1});
        sum = (sum.to(torch::kFloat32) + term).to(torch::kBFloat16);
      }
  return sum.to(torch::kFloat32);
}

// bf16 under autocast, held to a bound that follows from the arithmetic, not from one CPU's kernels (LibTorch
// 1.13 sums in float32 through oneDNN with AVX-512, in bf16 without it: a tolerance of 2% of the output's
// range, taken from the first, failed at 3.7% on an AMD EPYC without AVX-512).
//
// The bound (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §3.1): bf16 keeps 8 significant
// bits, so each rounding to it is off by at most u = 2^-8 of the value rounded. Products of bf16 values are
// exact in float32. An output of a convolution over n products (the layer's depth: in channels x kernel
// area) passes through at most k = n + 3 roundings: its input's, one per product added to the running sum
// (even the first, where the sum is kept in bf16), its own as a bf16 result, and one for float32's own
// roundings (n of 2^-24 at most, below one u). Whatever the order of the sum, its error is then at most
// gamma_k = k u / (1 - k u) times the sum of the products' magnitudes, |w| * |x|. ReLU does not widen an
// error; the next layer carries the first's through its weights (|w2| * e1) and adds its own over the
// values it sums (|h| + e1). So, per output element:
//   e1 = gamma(n1 + 3) (|w1| * |x|),   |y_bf16 - y| <= |w2| * e1 + gamma(n2 + 3) (|w2| * (|h| + e1)).
// That is the worst case, every rounding the same way: measured errors are 0.3% of it here (AVX-512, float32
// sums) and 0.6% for a sum kept in bf16 (0.4% and 0.9% of the output's range), so the bound alone would pass
// much that is wrong. Two inputs decide what the test proves. Integers whose sums, in any order, stay within
// 256 (bf16 holds every such integer) leave nothing to round: bf16 must give the exact outputs on any CPU,
// so garbage or a wrong kernel (Debian trixie's oneDNN 3.6 was 30-45% off with its AVX-512 kernels) fails.
// Real-valued inputs round: the outputs must be bf16 values (autocast ran, the result was only widened to
// float32: without bf16 they are not) and within the bound of the exact result, as must those of a sum kept
// in bf16 throughout (the path without AVX-512), computed here on any CPU.
TEST(Model, Bf16StaysWithinItsRoundingBound) {
  torch::jit::Module m("Deep");
  torch::manual_seed(3);
  // Weights in {-1, 0, 1}: bf16 values, so that only the inputs and the sums round.
  const auto w1 = torch::randint(-1, 2, {4, 3, 3, 3}, torch::kFloat32),
             w2 = torch::randint(-1, 2, {2, 4, 3, 3}, torch::kFloat32);
  m.register_parameter("w1", w1, false);
  m.register_parameter("w2", w2, false);
  m.define(R"JIT(
def forward(self, x):
    return torch.conv2d(torch.relu(torch.conv2d(x, self.w1, padding=1)), self.w2, padding=1)
)JIT");
  auto path = tempPath("deep.pt");
  m.save(path);
  // bf16 first, as a bf16 run does: a oneDNN ISA limit must come before oneDNN's first kernel.
  auto bf = cpuOptions(path);
  bf.precision = "bf16";
  ModelRunner b(bf);
  EXPECT_EQ(b.precision(), Precision::kBf16);
  b.probe(32, 32);
  const auto exact = [&](const torch::Tensor& x) {  // float64: the exact result here
    const auto d = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
    return torch::conv2d(torch::relu(torch::conv2d(d(x), d(w1), {}, 1, 1)), d(w2), {}, 1, 1);
  };
  const auto conv = [](const torch::Tensor& x, const torch::Tensor& w) {
    return torch::conv2d(x.to(torch::kFloat64).abs(), w.to(torch::kFloat64).abs(), {}, 1, 1);
  };

  const auto integers = (torch::rand({2, 3, 32, 32}) < 0.25).to(torch::kFloat32);  // ones and zeros
  ASSERT_LE(conv(torch::relu(conv(integers, w1)), w2).max().item<double>(), 256)
      << "the integer case must hold sums bf16 stores exactly";
  const auto whole = b.forward(integers, torch::ones({2}));
  EXPECT_EQ(whole.scalar_type(), torch::kFloat32) << "the pipeline always gets float32";
  EXPECT_TRUE(torch::equal(whole.to(torch::kFloat64), exact(integers)))
      << "nothing rounds, yet bf16 is off by " << (whole.to(torch::kFloat64) - exact(integers)).abs().max();

  const auto input = torch::rand({2, 3, 32, 32});
  const auto got = b.forward(input, torch::ones({2}));
  EXPECT_TRUE(torch::equal(got, got.to(torch::kBFloat16).to(torch::kFloat32)))
      << "every output a bf16 value: autocast ran the convolutions in bf16";
  const auto y = exact(input);
  const double u = std::ldexp(1.0, -8);
  const auto gamma = [u](int64_t n) {
    const double k = double(n + 3);
    return k * u / (1 - k * u);
  };
  const auto e1 = gamma(w1[0].numel()) * conv(input, w1);
  const auto h = torch::relu(torch::conv2d(input.to(torch::kFloat64), w1.to(torch::kFloat64), {}, 1, 1));
  const auto bound = conv(e1, w2) + gamma(w2[0].numel()) * conv(h + e1, w2);
  const auto error = (got.to(torch::kFloat64) - y).abs();
  const auto of_bound = [&bound](const torch::Tensor& e) {
    return (e / bound.clamp_min(1e-30)).max().item<double>();
  };
  EXPECT_GT(error.max().item<double>(), 0.0) << "real-valued inputs round in bf16";
  EXPECT_TRUE((error <= bound).all().item<bool>())
      << "bf16 past its rounding bound: error/bound up to " << of_bound(error);
  // The sum kept in bf16 throughout, as LibTorch 1.13 computes it without AVX-512, is within the bound too.
  const auto as_bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
  const auto summed_in_bf16 = conv2dSummingInBf16(
      torch::relu(conv2dSummingInBf16(as_bf16(input), w1.to(torch::kFloat32))), w2.to(torch::kFloat32));
  const auto emulated_error = (summed_in_bf16.to(torch::kFloat64) - y).abs();
  EXPECT_TRUE((emulated_error <= bound).all().item<bool>())
      << "error/bound up to " << of_bound(emulated_error);
  std::printf(
      "bf16: largest error / bound %.3f here, %.3f summing in bf16; of the output's range %.4f, %.4f\n",
      of_bound(error), of_bound(emulated_error), (error.max() / y.abs().max()).item<double>(),
      (emulated_error.max() / y.abs().max()).item<double>());
}

TEST(Model, Fp16OnCpuIsRefusedClearly) {
  auto o = cpuOptions(saveModule("fp16", 3, 2, kConv));
  o.precision = "fp16";
  try {
    ModelRunner r(o);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("fp16 needs CUDA"), std::string::npos);
  }
  EXPECT_EQ(resolvePrecision("auto", torch::Device(torch::kCPU)), Precision::kFp32);
  EXPECT_EQ(resolveDevice("cpu", 3).type(), torch::kCPU);
  EXPECT_THROW(resolveDevice("tpu", 0), Error);
}

TEST(Model, DefaultThreadsAreThisRanksShareOfTheCpus) {
  unsetenv("OMP_NUM_THREADS");
  unsetenv("LOCAL_WORLD_SIZE");
  ModelRunner all(cpuOptions(saveModule("threads", 3, 2, kConv)));
  EXPECT_EQ(at::get_num_threads(), defaultIntraOpThreads()) << "LibTorch's own default is half the CPUs";
  // A process that may use 12 CPUs, whatever this machine has.
  EXPECT_EQ(defaultIntraOpThreads(12), 12);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_EQ(defaultIntraOpThreads(12), 6);
  EXPECT_EQ(defaultIntraOpThreads(1), 1) << "never none";
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(defaultIntraOpThreads(12), 3);
  unsetenv("OMP_NUM_THREADS");
  unsetenv("LOCAL_WORLD_SIZE");
  // srun: 4 tasks on a node of the job's 48 CPUs. Bound to its own 12 CPUs (all this process has), a task
  // takes them all; unbound (its mask is the job's 48), its share; --cpus-per-task says it outright.
  setenv("SLURM_NTASKS_PER_NODE", "4", 1);
  setenv("SLURM_CPUS_ON_NODE", "48", 1);
  EXPECT_EQ(defaultIntraOpThreads(12), 12) << "a bound task's CPUs are its own";
  EXPECT_EQ(defaultIntraOpThreads(48), 12) << "unbound tasks share the job's CPUs";
  setenv("SLURM_CPUS_PER_TASK", "1", 1);
  EXPECT_EQ(defaultIntraOpThreads(48), 1);
  // Without --ntasks-per-node Slurm says the tasks of each node in a list: 2 on nodes 0-2, 1 on node 3.
  unsetenv("SLURM_NTASKS_PER_NODE");
  unsetenv("SLURM_CPUS_PER_TASK");
  setenv("SLURM_TASKS_PER_NODE", "2(x3),1", 1);
  setenv("SLURM_NODEID", "1", 1);
  EXPECT_EQ(defaultIntraOpThreads(48), 24) << "two tasks share node 1";
  setenv("SLURM_NODEID", "3", 1);
  EXPECT_EQ(defaultIntraOpThreads(48), 48) << "node 3 runs one task";
  for (const char* name : {"SLURM_NTASKS_PER_NODE", "SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK",
                           "SLURM_TASKS_PER_NODE", "SLURM_NODEID"})
    unsetenv(name);
  auto pinned = cpuOptions(saveModule("threads1", 3, 2, kConv));
  pinned.threads = 1;
  ModelRunner one(pinned);
  EXPECT_EQ(at::get_num_threads(), 1);
}

TEST(Model, ForwardLayoutSplitsTheCpusIntoReplicasUnlessThreadsArePinned) {
  auto layout = [](int threads, int replicas, bool cuda, int cpus) {
    const ForwardLayout l = chooseForwardLayout(threads, replicas, cuda, cpus);
    return std::make_pair(l.replicas, l.threads);
  };
  using P = std::pair<int, int>;
  EXPECT_EQ(layout(0, 0, false, 1), P(1, 1));
  EXPECT_EQ(layout(0, 0, false, 2), P(2, 1)) << "the 2-core machine: a replica per core";
  EXPECT_EQ(layout(0, 0, false, 3), P(3, 1));
  EXPECT_EQ(layout(0, 0, false, kMaxAutoReplicas * 2), P(kMaxAutoReplicas, 2));
  EXPECT_EQ(layout(0, 0, false, 17), P(kMaxAutoReplicas, 17 / kMaxAutoReplicas));
  EXPECT_EQ(layout(2, 0, false, 8), P(1, 2)) << "--threads pins one replica: today's bytes";
  EXPECT_EQ(layout(1, 3, false, 2), P(3, 1));
  EXPECT_EQ(layout(0, 3, false, 8), P(3, 2)) << "--replicas alone shares the CPUs";
  EXPECT_EQ(layout(0, 0, true, 8), P(kCudaStreams, 8 / kCudaStreams)) << "a GPU's streams unless asked";
  EXPECT_EQ(layout(0, 1, true, 8), P(1, 8));
  EXPECT_EQ(layout(0, 2, true, 8), P(2, 4));
  auto light = [](int threads, int replicas, int cpus) {
    const ForwardLayout l = chooseForwardLayout(threads, replicas, false, cpus, true);
    return std::make_pair(l.replicas, l.threads);
  };
  EXPECT_EQ(light(0, 0, 8), P(1, 1)) << "a light model leaves the other cores to reading and writing";
  EXPECT_EQ(light(2, 0, 8), P(1, 2)) << "flags win";
  EXPECT_EQ(light(0, 2, 8), P(2, 4));
}

TEST(Model, ReadThreadsTakeTheCpusTheForwardLeaves) {
  EXPECT_EQ(chooseReadThreads(3, ForwardLayout{2, 1}, false, 2), 3) << "the flag wins";
  EXPECT_EQ(chooseReadThreads(0, ForwardLayout{2, 1}, false, 2), 1) << "replicas on every core: one";
  EXPECT_EQ(chooseReadThreads(0, ForwardLayout{1, 1}, false, 2), 1);
  EXPECT_EQ(chooseReadThreads(0, ForwardLayout{1, 1}, false, 4), 3) << "a light model leaves 3 cores";
  EXPECT_EQ(chooseReadThreads(0, ForwardLayout{4, 4}, false, 16), 1);
  EXPECT_EQ(chooseReadThreads(0, ForwardLayout{1, 16}, true, 16), kMaxAutoReadThreads) << "CUDA: the CPUs";
  EXPECT_EQ(chooseReadThreads(0, ForwardLayout{1, 2}, true, 2), 2);
}

TEST(Model, SecondsPerWindowStopsEarlyForHeavyModels) {
  ModelRunner r(cpuOptions(saveModule("timed", 3, 2, kConv)));
  r.probe(64, 64);
  const double t = r.secondsPerWindow(64, 64, 2, 10.0);
  EXPECT_GT(t, 0);
  EXPECT_LT(t, 10.0);
  EXPECT_GT(r.secondsPerWindow(64, 64, 2, 0.0), 0) << "eight runs at most when none is under the bar";
}

// A model whose one window (run again, past the graph executor's optimisation) costs over twice the bar is
// judged heavy without a batch: a batch's first run would cost the start-up a second (the sample UNet). The
// model refuses batches, so a batch run fails the test whatever the machine's speed or load.
TEST(Model, SecondsPerWindowJudgesAHeavyModelOnOneWindow) {
  ModelRunner r(cpuOptions(saveModule("timed_heavy", 3, 3, R"JIT(
def forward(self, x):
    assert x.size(0) == 1, "a batch reached a model judged heavy on one window"
    for i in range(10):
        x = torch.conv2d(x, self.w.repeat(1, 1, 3, 3), padding=1)
    return x[:, :2]
)JIT")));
  r.probe(256, 256);
  EXPECT_GT(r.secondsPerWindow(256, 256, 32, 1e-4), 4e-4);
}

// The light-model check must not read a loaded machine as a heavy model: 40 busy threads share this thread's
// core, so the graph executor's first (~5 ms) run lasts about 200 ms of wall time, ten times the bar.
TEST(Model, SecondsPerWindowCountsThisThreadsCpuTimeNotTheMachinesLoad) {
  ModelRunner r(cpuOptions(saveModule("timed_loaded", 3, 2, kConv)));
  r.probe(256, 256);
  const int threads_before = at::get_num_threads();  // restored at the end: the floor's tests share a process
  at::set_num_threads(2);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  cpu_set_t before;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof before, &before), 0);
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < 40; ++i)
    busy.emplace_back([&] {
      pthread_setaffinity_np(pthread_self(), sizeof one, &one);
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  const auto t0 = std::chrono::steady_clock::now();
  const double bar = 0.02;
  const double seconds = r.secondsPerWindow(256, 256, 1, bar);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  for (auto& t : busy) t.join();
  pthread_setaffinity_np(pthread_self(), sizeof before, &before);
  // Relative, not absolute: a busier machine stretches the wall time more, this thread's CPU time hardly.
  if (wall < 4 * bar) GTEST_SKIP() << "the load did not slow the measurement (" << wall << " s)";
  EXPECT_LT(4 * seconds, wall) << "judged by the wall clock: " << seconds << " s a window in " << wall
                               << " s";
  EXPECT_EQ(at::get_num_threads(), 2) << "the caller's intra-op threads are restored";
  at::set_num_threads(threads_before);
}

// LibTorch's convolutions run on whatever libblas.so.3 is; the reference one costs the sample UNet 1.5-1.8x.
// (The reference BLAS put first on the library path is named: Pipeline.AReferenceBlasIsNamedAndWarnedAbout.)
TEST(Model, CpuBlasIsOpenBlasWhereSetupInstalledIt) {
  const std::string blas = cpuBlasName();
  if (blas.rfind("built into LibTorch", 0) == 0)
    GTEST_SKIP() << "this LibTorch brings its own BLAS: " << blas;
  EXPECT_EQ(blas.rfind("OpenBLAS ", 0), 0u) << blas << ": scripts/setup-deps.sh installs libopenblas0-openmp";
}

// Replicas give the model's own numbers bit for bit (one intra-op thread each), in whatever order they run.
TEST(Model, ForwardPoolRunsJobsOnReplicasWithTheModelsNumbers) {
  auto o = cpuOptions(saveModule("pool", 3, 2, R"JIT(
def forward(self, x):
    return torch.conv2d(torch.relu(torch.conv2d(x, self.w.repeat(1, 1, 3, 3), padding=1)), self.w[:, :2])
)JIT"));
  o.threads = 1;
  ModelRunner model(o);
  model.probe(32, 32);
  torch::manual_seed(5);
  std::vector<torch::Tensor> batches, want;
  for (int i = 0; i < 12; ++i) {
    batches.push_back(torch::rand({2, 3, 32, 32}));
    want.push_back(model.forward(batches.back(), torch::ones({2})));
  }
  ForwardPool pool(model, ForwardLayout{3, 1});
  EXPECT_EQ(pool.replicas(), 3);
  std::vector<std::future<std::pair<torch::Tensor, std::thread::id>>> got;
  for (const auto& b : batches)
    got.push_back(pool.submit<std::pair<torch::Tensor, std::thread::id>>([b](ModelRunner& m) {
      return std::make_pair(m.forward(b, torch::ones({2})), std::this_thread::get_id());
    }));
  std::set<std::thread::id> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    auto [out, thread] = got[i].get();
    threads.insert(thread);
    EXPECT_TRUE(torch::equal(out, want[i])) << "batch " << i;
  }
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u) << "the forwards run on the pool's threads";
  // A job's exception reaches its future; the pool goes on.
  auto failed = pool.submit<int>([](ModelRunner&) -> int { throw std::runtime_error("job failed"); });
  EXPECT_THROW(failed.get(), std::runtime_error);
  EXPECT_EQ(pool.submit<int>([](ModelRunner&) { return 7; }).get(), 7);
}

// The pool goes while its one replica is busy: the running job finishes, the queued one is dropped (its
// future says so at once), nothing hangs.
TEST(Model, ForwardPoolDropsQueuedJobsWhenDestroyed) {
  ModelRunner model(cpuOptions(saveModule("pool_drop", 3, 2, kConv)));
  model.probe(8, 8);
  std::promise<void> release, started;
  auto gate = release.get_future().share();
  std::future<int> running, queued;
  std::thread opener;
  {
    ForwardPool pool(model, ForwardLayout{1, 1});
    running = pool.submit<int>([gate, &started](ModelRunner&) {
      started.set_value();
      gate.wait();
      return 1;
    });
    queued = pool.submit<int>([](ModelRunner&) { return 2; });
    started.get_future().wait();
    // Opens the gate only once the destructor below has had time to drop the queue.
    opener = std::thread([&release] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      release.set_value();
    });
  }
  opener.join();
  EXPECT_EQ(running.get(), 1);
  try {
    queued.get();
    ADD_FAILURE() << "the queued job ran after the pool was destroyed";
  } catch (const std::future_error& e) {
    EXPECT_EQ(e.code(), std::future_errc::broken_promise);
  }
}

// Tensors of 1 MiB and more come from mapped blocks that are reused, not given back and faulted in again;
// smaller ones (and raw allocations of either size) from LibTorch's default allocator.
TEST(Model, LargeTensorBlocksAreReusedAndSmallOnesGoToTheDefaultAllocator) {
  ModelRunner installs(cpuOptions(saveModule("allocator", 3, 2, kConv)));
  auto& cache = LargeBlockCache::instance();
  EXPECT_EQ(c10::GetCPUAllocator(), &cache);
  const size_t odd = (3 << 20) + 12345;  // a size no other test asks for
  const size_t block = LargeBlockCache::blockSize(odd);
  EXPECT_EQ(block % (64 << 10), 0u);
  EXPECT_GE(block, odd);
  void* first = nullptr;
  {
    auto t = torch::empty({int64_t(odd)}, torch::kUInt8);
    first = t.data_ptr();
    std::memset(first, 1, odd);
    const size_t cached = cache.cachedBytes();
    t.reset();
    // Its block: this size, or a free one up to twice it that earlier tests left.
    EXPECT_GE(cache.cachedBytes(), cached + block) << "kept for the next forward";
    EXPECT_LE(cache.cachedBytes(), cached + 2 * block);
  }
  auto again = torch::empty({int64_t(odd)}, torch::kUInt8);
  EXPECT_EQ(again.data_ptr(), first) << "the same block (the last freed of its size), its pages already in";
  auto small = torch::ones({1000});
  EXPECT_EQ(small.sum().item<float>(), 1000.f);
  // raw_allocate()/raw_deallocate() (used inside LibTorch) of a small and a large block.
  for (size_t n : {size_t(4096), size_t(2) << 20}) {
    void* p = cache.raw_allocate(n);
    std::memset(p, 2, n);
    cache.raw_deallocate(p);
  }
}

// The VmFlags of the mapping of /proc/self/smaps that holds `address` ("" when none does).
std::string vmFlagsAt(const void* address) {
  std::istringstream smaps(test::slurp("/proc/self/smaps"));
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      inside = uintptr_t(address) >= begin && uintptr_t(address) < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line + " ";
    }
  }
  return "";
}

// Blocks of 2 MiB and more start on a huge page boundary, advised to be backed by transparent huge pages:
// the sample UNet's first forward faulted 180 k pages without, 32 k with.
TEST(Model, LargeBlocksAreAlignedAndAdvisedForHugePages) {
  auto& cache = LargeBlockCache::instance();
  auto block = cache.allocate((5 << 20) + 777);
  EXPECT_EQ(uintptr_t(block.get()) % (2 << 20), 0u);
  std::memset(block.get(), 3, (5 << 20) + 777);
  const std::string thp = test::slurp("/sys/kernel/mm/transparent_hugepage/enabled");
  if (thp.empty() || thp.find("[never]") != std::string::npos) GTEST_SKIP() << "no transparent huge pages";
  EXPECT_NE(vmFlagsAt(block.get()).find(" hg "), std::string::npos) << vmFlagsAt(block.get());
}

TEST(Model, JitOptimizeIsRefusedWithMixedPrecision) {
  auto o = cpuOptions(saveModule("jit_bf16", 3, 2, kConv));
  o.jit_optimize = true;
  o.precision = "bf16";
  try {
    ModelRunner r(o);
    FAIL() << "--jit_optimize ran with bf16";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("--jit_optimize fuses ops that mixed precision does not cover"),
              std::string::npos);
  }
  o.precision = "fp32";
  ModelRunner fp32(o);
  EXPECT_EQ(fp32.probe(16, 16).output_channels, 2);
}

// How writeStoredZip lays out a zip: as Python's zipfile writes a file; as a streaming writer does (sizes in
// a descriptor after each entry's data); with zip64 end records and sizes and offsets in zip64 extra fields.
enum class ZipLayout { kPlain, kStreamed, kZip64 };

// A zip of stored entries with a central directory (CRCs left zero: findZipEntry does not check them).
void writeStoredZip(const std::string& path, const std::vector<std::pair<std::string, std::string>>& entries,
                    ZipLayout layout = ZipLayout::kPlain) {
  std::string zip, dir;
  const auto put = [](std::string& to, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) to.push_back(char(v >> (8 * i) & 0xff));
  };
  const bool streamed = layout == ZipLayout::kStreamed, zip64 = layout == ZipLayout::kZip64;
  for (const auto& [name, data] : entries) {
    const uint64_t local = zip.size(), size = data.size();
    std::string extra64;  // uncompressed size, compressed size, local header offset
    if (zip64)
      put(extra64, 1, 2), put(extra64, 24, 2), put(extra64, size, 8), put(extra64, size, 8),
          put(extra64, local, 8);
    zip += "PK\x03\x04";
    put(zip, 20, 2), put(zip, streamed ? 8 : 0, 2), put(zip, 0, 2), put(zip, 0, 4), put(zip, 0, 4);
    put(zip, streamed ? 0 : size, 4), put(zip, streamed ? 0 : size, 4);
    put(zip, name.size(), 2), put(zip, zip64 ? 20 : 0, 2);
    zip += name;
    if (zip64) zip += std::string("\x01\x00\x10\x00", 4) + extra64.substr(4, 16);  // sizes only
    zip += data;
    if (streamed) zip += "PK\x07\x08", put(zip, 0, 4), put(zip, size, 4), put(zip, size, 4);
    dir += "PK\x01\x02";
    put(dir, 20, 2), put(dir, 20, 2), put(dir, streamed ? 8 : 0, 2), put(dir, 0, 2), put(dir, 0, 4),
        put(dir, 0, 4);
    put(dir, zip64 ? 0xffffffffu : size, 4), put(dir, zip64 ? 0xffffffffu : size, 4);
    put(dir, name.size(), 2), put(dir, extra64.size(), 2), put(dir, 0, 2), put(dir, 0, 2), put(dir, 0, 2);
    put(dir, 0, 4), put(dir, zip64 ? 0xffffffffu : local, 4);
    dir += name + extra64;
  }
  const uint64_t dir_offset = zip.size(), count = entries.size();
  zip += dir;
  if (zip64) {
    const uint64_t end64 = zip.size();
    zip += "PK\x06\x06";
    put(zip, 44, 8), put(zip, 45, 2), put(zip, 45, 2), put(zip, 0, 4), put(zip, 0, 4);
    put(zip, count, 8), put(zip, count, 8), put(zip, dir.size(), 8), put(zip, dir_offset, 8);
    zip += "PK\x06\x07";
    put(zip, 0, 4), put(zip, end64, 8), put(zip, 1, 4);
  }
  zip += "PK\x05\x06";
  put(zip, 0, 2), put(zip, 0, 2), put(zip, zip64 ? 0xffff : count, 2), put(zip, zip64 ? 0xffff : count, 2);
  put(zip, zip64 ? 0xffffffffu : dir.size(), 4), put(zip, zip64 ? 0xffffffffu : dir_offset, 4);
  put(zip, 7, 2);
  zip += "comment";
  std::ofstream(path, std::ios::binary) << zip;
}

// A package's call spec names its outputs only where they are a flat dict of tensors with string keys; what
// torch.export writes for ThreeHeads (samples/make_samples.py) is the first.
TEST(ModelRuntime, Pt2OutputNamesComeOnlyFromAFlatDictSpec) {
  const std::string leaf = R"({"type": null, "context": null, "children_spec": []})";
  const auto spec = [](const std::string& type, const std::string& context, const std::string& children) {
    return "[1, {\"type\": " + type + ", \"context\": " + context + ", \"children_spec\": [" + children +
           "]}]";
  };
  const std::string three = leaf + ", " + leaf + ", " + leaf;
  const std::string pair =
      R"({"type": "builtins.tuple", "context": "null", "children_spec": [)" + leaf + ", " + leaf + "]}";
  EXPECT_EQ(outputNamesOfSpec(spec(R"("builtins.dict")", R"("[\"np\", \"hv\", \"tp\"]")", three)),
            (std::vector<std::string>{"np", "hv", "tp"}));
  EXPECT_EQ(
      outputNamesOfSpec(spec(R"("collections.OrderedDict")", R"("[\"b\", \"a\"]")", leaf + ", " + leaf)),
      (std::vector<std::string>{"b", "a"}))
      << "the spec's order, not sorted";
  const std::vector<std::string> unnamed = {
      spec(R"("builtins.tuple")", R"("null")", three),
      spec(R"("builtins.list")", R"("null")", three),
      "[1, " + leaf + "]",                                                        // one tensor
      spec(R"("builtins.dict")", R"("[\"np\", \"rest\"]")", leaf + ", " + pair),  // nested
      spec(R"("builtins.dict")", R"("[1, 2, 3]")", three),                        // keys not strings
      spec(R"("builtins.dict")", R"("[\"np\", \"hv\"]")", three),                 // counts differ
      spec(R"("collections.namedtuple")", R"("\"Out\"")", three),
      "[2, {}]",
      "",
      "not json",
      "[1, {\"type\": \"builtins.dict\"}]"};
  for (const std::string& text : unnamed) EXPECT_TRUE(outputNamesOfSpec(text).empty()) << text;
}

TEST(ModelRuntime, Pt2PackagesAreKnownByTheirContentsNotTheirNames) {
  const std::string sample = std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/sample.pt";
  writeStoredZip(tempPath("a.bin"), {{"version", "1"}, {"archive_format", "pt2"}, {"data/x", "xyz"}});
  EXPECT_TRUE(isPt2Package(tempPath("a.bin"))) << "PyTorch 2.6's layout, whatever the name";
  writeStoredZip(tempPath("b.pt2"), {{"model/version", "1"}, {"model/archive_format", "pt2"}});
  EXPECT_TRUE(isPt2Package(tempPath("b.pt2"))) << "entries under the archive's folder";
  writeStoredZip(tempPath("c.pt2"), {{"version", "1"}, {"archive_format", "zip"}});
  EXPECT_FALSE(isPt2Package(tempPath("c.pt2")));
  // PyTorch 2.11's writer: its format entry after the data (a CUDA package: 17 entries), by any zip layout.
  std::vector<std::pair<std::string, std::string>> late = {{"m/.data/version", "2"},
                                                           {"m/byteorder", "little"}};
  for (int i = 0; i < 20; ++i) late.emplace_back("m/data/aotinductor/model/k" + std::to_string(i), "cubin");
  late.emplace_back("m/archive_format", "pt2");
  for (const auto layout : {ZipLayout::kPlain, ZipLayout::kStreamed, ZipLayout::kZip64}) {
    writeStoredZip(tempPath("late.pt2"), late, layout);
    EXPECT_TRUE(isPt2Package(tempPath("late.pt2"))) << "layout " << int(layout);
    EXPECT_EQ(findZipEntry(
                  tempPath("late.pt2"), [](const std::string& n) { return nameEndsWith(n, "/k19"); }, 64),
              "cubin")
        << "layout " << int(layout);
    EXPECT_EQ(findZipEntry(
                  tempPath("late.pt2"), [](const std::string& n) { return nameEndsWith(n, "/k19"); }, 4),
              "")
        << "an entry above the bound is not read";
  }
  std::string cut;  // a zip whose end records are lost: not a package, whatever its first entries say
  {
    std::ifstream in(tempPath("late.pt2"), std::ios::binary);
    cut.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(tempPath("cut.pt2"), std::ios::binary) << cut.substr(0, cut.size() - 40);
  EXPECT_FALSE(isPt2Package(tempPath("cut.pt2")));
  EXPECT_FALSE(isPt2Package(sample)) << "TorchScript";
  fs::copy_file(sample, tempPath("torchscript.pt2"), fs::copy_options::overwrite_existing);
  EXPECT_FALSE(isPt2Package(tempPath("torchscript.pt2")));
  ModelRunner named_pt2(cpuOptions(tempPath("torchscript.pt2")));
  EXPECT_STREQ(named_pt2.runtimeName(), "torchscript");
  EXPECT_EQ(named_pt2.probe(32, 32).output_channels, 2);
  std::ofstream(tempPath("text.pt2")) << "PK not really";
  EXPECT_FALSE(isPt2Package(tempPath("text.pt2")));
  EXPECT_FALSE(isPt2Package(tempPath("")));  // the directory
  EXPECT_FALSE(isPt2Package(tempPath("missing.pt2")));
}

TEST(ModelRuntime, APackageThisBuildCannotRunIsOneClearError) {
  writeStoredZip(tempPath("empty.pt2"), {{"version", "1"}, {"archive_format", "pt2"}});
  expectModelError(tempPath("empty.pt2"),
                   pt2Supported() ? "not a .pt2 package that LibTorch" : "no AOTInductor package loader");
}

// The child process that learns what a package without tiler's metadata takes, exercised with TorchScript
// models (which any LibTorch runs): the fewest channels that run, at which batches, and one line naming the
// shape when nothing runs.
TEST(ModelRuntime, AChildProcessLearnsWhatAModelRuns) {
  RuntimeOptions o;
  // Channels, batch 1, batch o.batch: what the child finds for o.path at windows of `size`.
  const auto learnt = [&o](int64_t size) {
    const ShapeProbe found = probeShapesInChild(o, size, size);
    EXPECT_TRUE(found.channels == 0 || found.refusal.empty()) << found.refusal;
    return std::tuple{found.channels, found.batch_one, found.batch_full};
  };
  o.path = std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/sample.pt";
  o.batch = 4;
  EXPECT_EQ(learnt(32), std::tuple(3, true, true));
  o.batch = 1;
  EXPECT_EQ(learnt(32), std::tuple(3, true, false)) << "batch 1 is all there is to learn";
  // Runs only one window at a time: its output keeps the first of a batch.
  o.path = saveModule("first_only", 2, 2, R"JIT(
def forward(self, x):
    return torch.conv2d(x[:1], self.w, self.b)
)JIT");
  o.batch = 8;
  EXPECT_EQ(learnt(16), std::tuple(2, true, false));
  // Made, as a package is compiled, for one window size (checking its input, as a package's checks do):
  // nothing runs at another.
  o.path = saveModule("window_64", 3, 2, R"JIT(
def forward(self, x):
    assert x.size(2) == 64 and x.size(3) == 64, "compiled for 64x64"
    return torch.conv2d(x, self.w, self.b)
)JIT");
  ShapeProbe found = probeShapesInChild(o, 32, 32);
  EXPECT_EQ(found.channels, 0);
  EXPECT_EQ(found.refusal.find("it does not run [1, 3, 32, 32] ("), 0u) << found.refusal;
  EXPECT_NE(found.refusal.find("compiled for 64x64)"), std::string::npos) << found.refusal;
  EXPECT_NE(found.refusal.find("nor 1 to 16 input channels at batch 1 or 8"), std::string::npos)
      << found.refusal;
  EXPECT_EQ(learnt(64), std::tuple(3, true, true));
  // What the child cannot load, it says so.
  o.path = tempPath("garbage.pt");
  std::ofstream(o.path) << "not a model";
  found = probeShapesInChild(o, 32, 32);
  EXPECT_EQ(found.channels, 0);
  EXPECT_NE(found.refusal.find("is not a TorchScript file"), std::string::npos) << found.refusal;
}

// Training refuses a package by what the file is, before its metadata (another device's, none) or this
// LibTorch's loader can say anything else.
TEST(ModelRuntime, TrainingRefusesAPackageWhateverItsMetadata) {
  writeStoredZip(tempPath("cuda.pt2"),
                 {{"p/version", "1"},
                  {"p/archive_format", "pt2"},
                  {"p/data/aotinductor/model/m_metadata.json", R"({"AOTI_DEVICE_KEY": "cuda"})"}});
  writeStoredZip(tempPath("bare.pt2"), {{"version", "1"}, {"archive_format", "pt2"}});
  for (const std::string& package : {tempPath("cuda.pt2"), tempPath("bare.pt2")}) {
    try {
      requireTrainableModel(package);
      FAIL() << package;
    } catch (const ConfigError& e) {
      EXPECT_NE(e.message().find("'" + package + "': training needs a TorchScript model"), std::string::npos)
          << e.message();
    }
  }
  EXPECT_NO_THROW(requireTrainableModel(std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/sample.pt"));
}

// The sample UNet as a .pt2 package (exported once per process), where this LibTorch runs packages and a
// Python here exports them (the LibTorch 2.6 stage of CI).
class ModelPt2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (pt2Supported()) package_ = test::exportSamplePt2(test::scratchDir("pt2_model"), 64, &why_);
  }
  void SetUp() override {
    if (!pt2Supported()) GTEST_SKIP() << pt2Unsupported();
    if (package_.empty()) GTEST_SKIP() << why_;
  }
  static ModelOptions options(const std::string& path) {
    ModelOptions o = cpuOptions(path);
    o.threads = 1;
    return o;
  }
  // A copy of the package whose metadata JSON has `key` set to `value` (None: removed).
  static std::string withMetadata(const std::string& name, const std::string& key, const std::string& value) {
    const std::string out = tempPath(name + ".pt2");
    const auto r = test::runCommand(
        "/usr/bin/python3 -c \"import json, sys, zipfile\n"
        "src, dst, key, value = sys.argv[1:]\n"
        "with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, 'w') as b:\n"
        "    for e in a.infolist():\n"
        "        data = a.read(e)\n"
        "        if e.filename.endswith('_metadata.json'):\n"
        "            m = json.loads(data)\n"
        "            m.pop(key) if value == 'None' else m.__setitem__(key, value)\n"
        "            data = json.dumps(m)\n"
        "        b.writestr(e, data)\n\" " +
        package_ + " " + out + " " + key + " '" + value + "'");
    EXPECT_EQ(r.code, 0) << r.output;
    return out;
  }
  // Both probed at 64x64 give numbers within `bound` of each other for random windows at each batch.
  static void expectSameNumbers(ModelRunner& a, ModelRunner& b, std::initializer_list<int64_t> batches,
                                double bound) {
    a.probe(64, 64);
    b.probe(64, 64);
    torch::manual_seed(6);
    for (int64_t n : batches) {
      const auto x = torch::rand({n, 3, 64, 64});
      EXPECT_LT((a.forward(x, torch::ones({n})) - b.forward(x, torch::ones({n}))).abs().max().item<double>(),
                bound)
          << "batch " << n;
    }
  }
  static std::string package_, why_;
};
std::string ModelPt2::package_, ModelPt2::why_;

TEST_F(ModelPt2, RunsLikeItsTorchScriptAtAnyBatch) {
  ModelRunner script(options(std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/sample.pt"));
  ModelRunner package(options(package_));
  EXPECT_STREQ(package.runtimeName(), "pt2");
  const ModelProbe want = script.probe(64, 64), got = package.probe(64, 64);
  EXPECT_EQ(got.input_channels, want.input_channels);
  EXPECT_EQ(got.output_channels, want.output_channels);
  EXPECT_EQ(got.scale.value(), want.scale.value());
  EXPECT_EQ(got.task, want.task);
  torch::manual_seed(4);
  std::vector<torch::Tensor> batches;
  for (int64_t b : {1, 3, 8}) {
    batches.push_back(torch::rand({b, 3, 64, 64}) * 255);
    const auto a = script.forward(batches.back(), torch::full({b}, 1.0f / 255));
    const auto p = package.forward(batches.back(), torch::full({b}, 1.0f / 255));
    EXPECT_LT((a - p).abs().max().item<double>(), 1e-5) << "batch " << b;
  }
  // Replicas load the package again, each its own.
  ForwardPool pool(package, ForwardLayout{2, 1});
  std::vector<std::future<torch::Tensor>> got_back;
  for (const auto& b : batches)
    got_back.push_back(pool.submit<torch::Tensor>(
        [b](ModelRunner& m) { return m.forward(b, torch::full({b.size(0)}, 1.0f / 255)); }));
  for (size_t i = 0; i < batches.size(); ++i)
    EXPECT_TRUE(torch::equal(got_back[i].get(),
                             package.forward(batches[i], torch::full({batches[i].size(0)}, 1.0f / 255))));
}

// A per-window model: the bundled encoder as a package gives the TorchScript encoder's features.
TEST_F(ModelPt2, AnEncoderPackageGivesItsTorchScriptsFeatures) {
  std::string why;
  const std::string encoder = test::exportSamplePt2(test::scratchDir("pt2_encoder"), 64, &why, "Encoder");
  if (encoder.empty()) GTEST_SKIP() << why;
  ModelOptions o = options(encoder),
               s = options(std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/encoder.pt");
  o.task = s.task = nullptr;
  ModelRunner package(o), script(s);
  EXPECT_EQ(package.probe(64, 64).task, findTask("embed"));
  EXPECT_EQ(package.probed().output_channels, script.probe(64, 64).output_channels);
  torch::manual_seed(8);
  const auto x = torch::rand({5, 3, 64, 64});
  EXPECT_LT(
      (package.forward(x, torch::ones({5})) - script.forward(x, torch::ones({5}))).abs().max().item<double>(),
      1e-5);
}

// A package of a model that returns a dict (the bundled heads.pt's ThreeHeads): its call spec names the
// outputs, so --output_key and --heads take the names as for the TorchScript model, an index picks the same
// output as its name; a package whose outputs are a tuple refuses a name saying they have none.
TEST_F(ModelPt2, ADictPackageTakesItsKeysLikeItsTorchScript) {
  std::string why;
  const std::string dict = test::exportSamplePt2(test::scratchDir("pt2_heads"), 64, &why, "ThreeHeads");
  const std::string tuple =
      test::exportSamplePt2(test::scratchDir("pt2_heads_tuple"), 64, &why, "ThreeHeadsAsTuple");
  if (dict.empty() || tuple.empty()) GTEST_SKIP() << why;
  const std::string script = std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/heads.pt";
  torch::manual_seed(9);
  const auto x = torch::rand({3, 3, 64, 64});
  const auto forward = [&x](ModelOptions o) {
    ModelRunner r(o);
    r.probe(64, 64);
    return r.forward(x, torch::ones({3}));
  };
  const auto keyed = [](const std::string& path, const std::string& key) {
    ModelOptions o = options(path);
    o.output_key = key;
    return o;
  };
  const std::vector<std::string> names = {"np", "hv", "tp"};
  for (size_t k = 0; k < names.size(); ++k) {
    const auto by_name = forward(keyed(dict, names[k]));
    EXPECT_TRUE(torch::equal(by_name, forward(keyed(dict, std::to_string(k))))) << names[k];
    EXPECT_TRUE(torch::equal(by_name, forward(keyed(tuple, std::to_string(k))))) << names[k];
    EXPECT_LT((by_name - forward(keyed(script, names[k]))).abs().max().item<double>(), 1e-5) << names[k];
  }
  // --heads by name: each head as its TorchScript's.
  ModelOptions heads = options(dict), script_heads = options(script);
  heads.heads = script_heads.heads = {{"np", "np", findTask("segment"), Activation::kSoftmax, false},
                                      {"hv", "hv", findTask("segment"), Activation::kNone, false},
                                      {"tp", "tp", findTask("segment"), Activation::kSoftmax, false}};
  EXPECT_LT((forward(heads) - forward(script_heads)).abs().max().item<double>(), 1e-5);
  // A name for a package without names, by --output_key or --heads: one line saying so, and how many.
  const std::string refusal =
      "'" + tuple +
      "': the package's 3 outputs have no names (its call spec records no dict of tensors), so 'hv' names "
      "none of them: pick one by index, 0 to 2";
  expectProbeError(keyed(tuple, "hv"), refusal, 64);
  heads.path = tuple;
  expectProbeError(heads, "the package's 3 outputs have no names", 64);
}

TEST_F(ModelPt2, RefusesWhatItWasNotCompiledFor) {
  expectModelError(package_, "compiled for windows of 64x64, not 32x32 (--window 64", 32);
  ModelOptions bf16 = options(package_);
  bf16.precision = "bf16";
  EXPECT_THROW(ModelRunner{bf16}, ConfigError);
  ModelOptions optimized = options(package_);
  optimized.jit_optimize = true;
  EXPECT_THROW(ModelRunner{optimized}, ConfigError);
  ModelRunner package(options(package_));
  try {
    package.module();
    FAIL() << "a package has no module to train";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("training needs a TorchScript model"), std::string::npos) << e.message();
  }
}

// A package whose code checks its input's shape (AOTInductor's input checks: compiled in by
// AOT_INDUCTOR_DEBUG_COMPILE in PyTorch 2.6, always from 2.7, on with AOTI_RUNTIME_CHECK_INPUTS) and that
// records no tiler metadata: a child process learns its channels and batch at the window, the job runs it as
// the package that records them, and at another window it is refused naming the shape and the check's words.
TEST_F(ModelPt2, WhatAPackageWithoutMetadataTakesIsLearntInAChildProcess) {
  setenv("AOT_INDUCTOR_DEBUG_COMPILE", "1", 1);
  std::string why;
  const std::string checked = test::exportSamplePt2(test::scratchDir("pt2_checked"), 64, &why);
  unsetenv("AOT_INDUCTOR_DEBUG_COMPILE");
  if (checked.empty()) GTEST_SKIP() << why;
  std::string unrecorded = tempPath("checked_unrecorded.pt2");
  const auto r = test::runCommand(
      "/usr/bin/python3 -c \"import json, sys, zipfile\n"
      "with zipfile.ZipFile(sys.argv[1]) as a, zipfile.ZipFile(sys.argv[2], 'w') as b:\n"
      "    for e in a.infolist():\n"
      "        data = a.read(e)\n"
      "        if e.filename.endswith('_metadata.json'):\n"
      "            data = json.dumps({k: v for k, v in json.loads(data).items() if not "
      "k.startswith('tiler_')})\n"
      "        b.writestr(e, data)\n\" " +
      checked + " " + unrecorded);
  ASSERT_EQ(r.code, 0) << r.output;
  ModelOptions learning = options(unrecorded);
  learning.batch_size = 4;
  ModelRunner learnt(learning), recorded(options(package_));
  EXPECT_EQ(learnt.probe(64, 64).input_channels, 3);
  expectSameNumbers(learnt, recorded, {1, 4, 6}, 1e-5);
  learning.batch_size = 8;
  try {
    ModelRunner(learning).probe(32, 32);
    FAIL() << "a package compiled for 64x64 ran at 32x32";
  } catch (const ModelError& e) {
    EXPECT_NE(
        e.message().find("'" + unrecorded + "': the package records no window, batch or input channels"),
        std::string::npos)
        << e.message();
    EXPECT_NE(
        e.message().find("found that it does not run [1, 3, 32, 32] (input_handles[0]: dim value is too "
                         "small at 0, expected it to be >= 2, but got: 1), nor [8, 3, 32, 32] "
                         "(input_handles[0]: unmatched dim value at 2, expected: 64, but got: 32), nor 1 to "
                         "16 input channels at batch 1 or 8"),
        std::string::npos)
        << e.message();
  }
}

TEST_F(ModelPt2, ItsMetadataDecidesWhatRuns) {
  // Without tiler's metadata (as PyTorch's own aoti_compile_and_package writes a package), what it takes is
  // learnt in a child process at the window: it runs as the package that records it, where its code checks
  // its input's shape (AOTInductor's input checks), or is refused at set-up saying why.
  const std::string unrecorded = withMetadata("unrecorded", "tiler_window", "None");
  expectModelError(unrecorded, "the package records no window, batch or input channels", 32);
  try {
    ModelOptions learning = options(unrecorded);
    learning.batch_size = 4;
    ModelRunner learnt(learning), recorded(options(package_));
    EXPECT_EQ(learnt.probe(64, 64).input_channels, 3);
    expectSameNumbers(learnt, recorded, {1, 4, 6}, 1e-6);
  } catch (const ModelError& e) {
    // PyTorch 2.6 compiles the input checks in only with AOT_INDUCTOR_DEBUG_COMPILE.
    EXPECT_NE(e.message().find("found that it does not check the shape of its input"), std::string::npos)
        << e.message();
  }
  expectModelError(withMetadata("bad_window", "tiler_window", "64x"), "tiler_window '64x' is not WxH", 64);
  expectModelError(withMetadata("bad_batch", "tiler_batch", "0"), "tiler_batch '0' is not a count", 64);
  expectModelError(withMetadata("cpu_only", "AOTI_DEVICE_KEY", "cuda"), "the package was compiled for cuda",
                   64);
  // A package that says its batch is 4: batches of other sizes run as padded runs of 4, same numbers.
  ModelRunner dynamic(options(package_)), fixed(options(withMetadata("batch4", "tiler_batch", "4")));
  expectSameNumbers(dynamic, fixed, {1, 4, 9}, 1e-6);
}

// A package compiled for CUDA (AOTInductor's kernels, not LibTorch's) runs on the GPU and gives the
// TorchScript model's numbers there: TF32 convolutions on both sides, so the bound is that of float32 sums in
// other orders.
TEST(ModelGpu, Pt2PackageCompiledForCudaRunsLikeItsTorchScript) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!pt2Supported()) GTEST_SKIP() << pt2Unsupported();
  std::string why;
  const std::string package = test::exportSamplePt2(test::scratchDir("pt2_cuda"), 64, &why, "UNet", "cuda");
  if (package.empty()) GTEST_SKIP() << why;
  ModelOptions p = cpuOptions(package),
               s = cpuOptions(std::string(TILER_TEST_SOURCE_DIR) + "/samples/models/sample.pt");
  p.device = s.device = "cuda";
  p.precision = s.precision = "fp32";
  ModelRunner package_model(p), script(s);
  EXPECT_TRUE(package_model.device().is_cuda());
  EXPECT_EQ(package_model.probe(64, 64).output_channels, script.probe(64, 64).output_channels);
  torch::manual_seed(12);
  for (int64_t b : {1, 6}) {
    const auto x = torch::rand({b, 3, 64, 64}) * 255;
    const auto a = script.forward(x, torch::full({b}, 1.0f / 255)).cpu();
    const auto got = package_model.forward(x, torch::full({b}, 1.0f / 255)).cpu();
    EXPECT_LT((a - got).abs().max().item<double>(), 1e-2 * std::max(1.0, a.abs().max().item<double>()))
        << "batch " << b;
  }
  // A CPU run of a CUDA package is refused before any forward, naming the device it was compiled for.
  expectModelError(package, "the package was compiled for cuda", 64);
}

// The conv model saved as `name`, on CUDA at `precision`.
ModelOptions cudaOptions(const std::string& name, const std::string& precision) {
  auto o = cpuOptions(saveModule(name, 3, 2, kConv));
  o.device = "cuda";
  o.precision = precision;
  return o;
}

TEST(ModelGpu, Fp16OnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto o = cudaOptions("cuda", "fp16");
  ModelRunner r(o);
  EXPECT_TRUE(r.device().is_cuda());
  r.probe(64, 64);
  auto input = torch::rand({4, 3, 64, 64});
  auto out = r.forward(input, torch::ones({4}));
  EXPECT_EQ(out.scalar_type(), torch::kFloat32);
  ModelRunner cpu(cpuOptions(o.path));
  cpu.probe(64, 64);
  auto ref = cpu.forward(input, torch::ones({4}));
  EXPECT_LT((out.cpu() - ref).abs().max().item<double>(), 1e-2);
}

// On a GPU the pool's threads share the one model (no copy of its weights), each queueing on a stream of its
// own, and what they compute equals the model's forward on the main thread's stream.
TEST(ModelGpu, ForwardPoolThreadsShareTheModelOnStreamsOfTheirOwn) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ModelRunner model(cudaOptions("cuda_pool", "fp32"));
  model.probe(64, 64);
  torch::manual_seed(9);
  std::vector<torch::Tensor> batches, want;
  for (int i = 0; i < 16; ++i) {
    batches.push_back(torch::rand({4, 3, 64, 64}));
    want.push_back(model.forward(batches.back(), torch::ones({4})).cpu());
  }
  ForwardPool pool(model, chooseForwardLayout(0, 0, true, 8));
  EXPECT_EQ(pool.replicas(), kCudaStreams);
  struct Done {
    torch::Tensor out;
    const ModelRunner* runner;
    c10::StreamId stream;
  };
  std::vector<std::future<Done>> got;
  std::atomic<int> arrived{0};  // the first two jobs wait for each other: both threads take one
  for (size_t i = 0; i < batches.size(); ++i)
    got.push_back(pool.submit<Done>([b = batches[i], first = i < 2, &arrived](ModelRunner& m) {
      if (first) {
        ++arrived;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (arrived < 2 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      const auto stream = c10::impl::VirtualGuardImpl(m.device().type()).getStream(m.device());
      // A page-locked copy queued on the stream, whole once synchronize() returns (as the pipeline copies).
      auto preds = m.forward(b, torch::ones({4}));
      auto host = torch::empty(preds.sizes(), preds.options().device(torch::kCPU).pinned_memory(true));
      host.copy_(preds, true);
      m.synchronize();
      return Done{host, &m, stream.id()};
    }));
  std::set<c10::StreamId> streams;
  const c10::StreamId main_stream =
      c10::impl::VirtualGuardImpl(model.device().type()).getStream(model.device()).id();
  for (size_t i = 0; i < got.size(); ++i) {
    Done d = got[i].get();
    EXPECT_EQ(d.runner, &model) << "the weights once";
    streams.insert(d.stream);
    EXPECT_TRUE(torch::equal(d.out, want[i])) << "batch " << i;
  }
  EXPECT_EQ(streams.count(main_stream), 0u) << "not the main thread's stream";
  EXPECT_EQ(streams.size(), size_t(kCudaStreams)) << "a stream per thread";
}

}  // namespace
}  // namespace tiler
