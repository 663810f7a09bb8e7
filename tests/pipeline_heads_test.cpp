// End-to-end tests of `tiler infer` on models with several heads (--heads) and outputs no task takes.
#include "pipeline_util.hpp"

#include <torch/script.h>

#include <algorithm>
#include <fstream>
#include <map>

namespace tiler::e2e {
namespace {

// The bundled three-head model (samples/models/heads.pt: np, hv, tp, HoVerNet's maps) with --heads: each
// head's files, <stem>_<head>_..., are the bytes of a run of that head alone (--output_key) with the same
// settings, on 1, 2 and 3 ranks.
TEST_F(Pipeline, ThreeHeadsWriteWhatEachHeadAloneWritesOnOneToThreeRanks) {
  const std::string common = " -i " + root_ + "/images/a_large.tif -i " + root_ + "/images/d_gray16.tif -m " +
                             TILER_TEST_SOURCE_DIR + "/samples/models/heads.pt" +
                             " --window 128 --batch_size 4 --threads 1 --no_progress -o ";
  const std::string heads =
      " --save labels,probs --heads np:segment,hv,tp --head_opt np.activation=softmax --head_opt "
      "tp.activation=sigmoid "
      "--head_opt hv.save=probs --head_opt tp.classes=a,b,c --head_opt tp.probs_dtype=u8";
  const std::pair<std::string, std::string> alone[] = {
      {"np", " --output_key np --activation softmax --save labels,probs"},
      {"hv", " --output_key hv --save probs"},
      {"tp", " --output_key tp --activation sigmoid --classes a,b,c --probs_dtype u8 --save labels,probs"}};
  std::map<std::string, std::string> expected;  // a head's file name -> its bytes alone
  for (const auto& [head, flags] : alone) {
    const std::string out = root_ + "/heads_" + head;
    auto r = run(kTiler + common + out + flags);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const auto& e : fs::directory_iterator(out)) {
      const std::string name = e.path().filename().string();
      if (e.path().extension() != ".tif") continue;
      for (const std::string stem : {"a_large", "d_gray16"})
        if (name.rfind(stem + "_", 0) == 0)
          expected[stem + "_" + head + name.substr(stem.size())] = slurp(e.path().string());
    }
  }
  EXPECT_EQ(expected.size(), 10u) << "np and tp: labels and probs, hv: probs; two images";
  for (int n : {1, 2, 3}) {
    const std::string out = root_ + "/heads_all" + std::to_string(n);
    const std::string launch =
        n == 1 ? kTiler : kCtrun + " --nproc_per_node " + std::to_string(n) + " --master_port 0 " + kTiler;
    auto r = run(launch + common + out + heads);
    ASSERT_EQ(r.code, 0) << r.output;
    for (const auto& [name, bytes] : expected)
      EXPECT_TRUE(slurp(out + "/" + name) == bytes) << name << " on " << n << " rank(s)";
    int files = 0;
    for (const auto& e : fs::directory_iterator(out)) files += e.path().extension() == ".tif";
    EXPECT_EQ(files, 10) << n;
    EXPECT_EQ(report(out)["task"], "np:segment,hv:segment,tp:segment");
  }
  // Settings that cannot hold for several heads are refused before any work, in one line.
  auto r = run(kTiler + common + root_ + "/heads_key" + heads + " --output_key np");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--output_key picks one output, --heads several"), std::string::npos) << r.output;
  r = run(kTiler + common + root_ + "/heads_opt --heads np --head_opt tp.activation=none");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("no head 'tp' in --heads"), std::string::npos) << r.output;
}

// --task regress (heads.pt's hv head: a regression in [-1, 1]) writes the bytes of segment's float32 probs
// without an activation, alone or as a head hv:regress; what would misread its values is refused at set-up.
TEST_F(Pipeline, ARegressionMapIsWrittenAsSegmentsFloatProbsAndRefusesLabels) {
  const std::string common = " -i " + root_ + "/images/c_small.png -m " + TILER_TEST_SOURCE_DIR +
                             "/samples/models/heads.pt --window 64 --threads 1 --no_progress -o " + root_;
  auto r = run(kTiler + common +
               "/hv_segment --output_key hv --task segment --activation none --save probs "
               "--probs_dtype f32");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string expected = slurp(root_ + "/hv_segment/c_small_probs.tif");
  r = run(kTiler + common + "/hv_regress --output_key hv --task regress");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(slurp(root_ + "/hv_regress/c_small_probs.tif") == expected);
  EXPECT_EQ(report(root_ + "/hv_regress")["task"], "regress");
  r = run(kTiler + common + "/hv_head --heads hv:regress");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(slurp(root_ + "/hv_head/c_small_hv_probs.tif") == expected);
  EXPECT_EQ(report(root_ + "/hv_head")["task"], "hv:regress");
  const std::pair<std::string, std::string> refused[] = {
      {" --save labels", "--save labels is an output of --task segment, not of --task regress"},
      {" --probs_dtype u8", "--task regress's values are not in [0, 1]"},
      {" --activation softmax", "--task regress takes a regression map as the model gave it"}};
  for (const auto& [flags, message] : refused) {
    r = run(kTiler + common + "/hv_refused --output_key hv --task regress" + flags);
    EXPECT_EQ(r.code, 1) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

// Maps of more channels than OpenCV's matrices hold are refused at set-up (they would wrap the element type:
// heap corruption or wrong labels); values past float16's range stored as f16 are counted and warned of.
TEST_F(Pipeline, MapsBeyondWhatTheStitcherHoldsAreRefusedAndHalfOverflowIsCounted) {
  const std::string dir = root_ + "/wide_maps";
  fs::create_directories(dir);
  torch::manual_seed(6);
  const auto save = [&](const std::string& name, int64_t channels, const std::string& gain) {
    torch::jit::Module m("Wide");
    m.register_parameter("w", torch::randn({channels, 3, 1, 1}), false);
    m.define("def forward(self, x):\n    return torch.conv2d(x, self.w) * " + gain + "\n");
    m.save(dir + "/" + name);
    return dir + "/" + name;
  };
  const std::string common = " -i " + root_ + "/images/c_small.png --window 64 --threads 1 --no_progress";
  auto r = run(kTiler + common + " -m " + save("c600.pt", 600, "1.0") + " -o " + dir + "/c600");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("gives maps of 600 channels; --task segment stitches at most 512"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir + "/c600/c_small_labels.tif"));
  r = run(kTiler + common + " -m " + save("c512.pt", 512, "1.0") + " -o " + dir + "/c512");
  EXPECT_EQ(r.code, 0) << r.output;
  const std::string huge = save("huge.pt", 1, "1000000.0");
  r = run(kTiler + common + " -m " + huge + " --task regress --probs_dtype f16 -o " + dir + "/f16");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("beyond float16's range"), std::string::npos) << r.output;
  EXPECT_GT(report(dir + "/f16")["images"][0].value("f16_overflow_values", int64_t(0)), 0) << r.output;
  r = run(kTiler + common + " -m " + huge + " --task regress --probs_dtype f32 -o " + dir + "/f32");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(report(dir + "/f32")["images"][0].contains("f16_overflow_values"));
}

// A segment head and an embed head of one encoder: a stitched map takes MONAI's grid and a vector the patch
// lattice, so the pair is refused in one line naming both; a detect head (records) likewise.
TEST_F(Pipeline, HeadsOfAMapAndAVectorAreRefusedNamingWhy) {
  torch::jit::Module m("Mixed");
  torch::manual_seed(4);
  m.register_parameter("w", torch::randn({4, 3, 1, 1}), false);
  m.define(R"JIT(
def forward(self, x):
    f = torch.conv2d(x, self.w)
    return (f[:, 0:2], torch.mean(f, [2, 3]))
)JIT");
  const std::string model = root_ + "/mixed_heads.pt";
  m.save(model);
  const std::string args = kTiler + " -i " + root_ + "/images/c_small.png -m " + model +
                           " --window 64 --threads 1 --no_progress -o " + root_ + "/mixed_out";
  auto r = run(args + " --heads 0:segment,1:embed");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--heads mixes a stitched map and one vector a window (head '0': --task segment, "
                          "head '1': --task embed)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/mixed_out/c_small_0_labels.tif"));
  // Each head alone runs.
  r = run(args + " --output_key 1 --task embed --save features_pt");
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(Pipeline, OutputNamesThatMeetFailTheSecondImageNeverReplacingTheFirst) {
  // a.png's head b_x and a_b.png's head x both name a_b_x_labels.tif.
  torch::jit::Module m("Named");
  torch::manual_seed(5);
  m.register_parameter("w", torch::randn({4, 3, 1, 1}), false);
  m.define(R"JIT(
def forward(self, x):
    f = torch.conv2d(x, self.w)
    return {"b_x": f[:, 0:2], "x": f[:, 2:4]}
)JIT");
  const std::string dir = root_ + "/meeting_names";
  fs::create_directories(dir + "/in");
  m.save(dir + "/named.pt");
  for (const char* name : {"a.png", "a_b.png"})
    fs::copy_file(root_ + "/images/c_small.png", dir + "/in/" + name);
  auto r = run(kTiler + " -i " + dir + "/in -m " + dir + "/named.pt --heads b_x,x --window 64 --threads 1 " +
               "--no_progress -o " + dir + "/out");
  EXPECT_EQ(r.code, 2) << r.output;
  const auto images = nlohmann::json::parse(slurp(dir + "/out/report.json"))["images"];
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0]["status"], "ok") << images[0];
  EXPECT_EQ(images[1]["status"], "error") << images[1];
  EXPECT_NE(images[1]["error"].get<std::string>().find("a_b_x_labels.tif' is also an output of '" + dir +
                                                       "/in/a.png'"),
            std::string::npos)
      << images[1];
  EXPECT_TRUE(fs::exists(dir + "/out/a_b_x_labels.tif"));
  // The report (or an output) at a file an image's ROI is read from: refused before any work.
  fs::create_directories(dir + "/rois");
  std::ofstream(dir + "/rois/a.geojson") << R"({"type": "Feature", "properties": {}, "geometry":
      {"type": "Polygon", "coordinates": [[[0, 0], [60, 0], [60, 60], [0, 0]]]}})";
  std::ofstream(dir + "/rois/a_b.geojson") << slurp(dir + "/rois/a.geojson");
  r = run(kTiler + " -i " + dir + "/in -m " + dir + "/named.pt --output_key x --window 64 --threads 1 " +
          "--no_progress --roi " + dir + "/rois -o " + dir + "/out_roi --report " + dir + "/rois/a.geojson");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("the ROI"), std::string::npos) << r.output;
  EXPECT_NE(slurp(dir + "/rois/a.geojson").find("Polygon"), std::string::npos) << "the ROI is as it was";
}

TEST_F(Pipeline, AnOutputThatIsNeitherMapNorVectorFailsNamingItsShapeAndTheTasks) {
  const std::string base = " -i " + root_ + "/images/c_small.png --window 64 --threads 1 --no_progress -o ";
  struct Case {
    std::string forward, flags, message;
  };
  const std::vector<Case> cases = {
      {"    return torch.mean(f, [1])\n", "", "output [1] has 1 dimension(s)"},
      {"    return torch.stack([f, f], 2)\n", "", "output [1, 8, 2] has 3 dimension(s)"},
      {"    return f\n", "--task segment", "--task segment needs NCHW maps, but the output [1, 8]"},
      {"    return f\n", "--save labels", "--save labels is an output of --task segment"},
      {"    return f\n", "--task embed --classes a,b", "--classes names classes"},
      {"    return f[:, :0]\n", "--task embed", "output [1, 0] is empty"},
  };
  int k = 0;
  for (const auto& c : cases) {
    const std::string model = perWindowModel(root_, "bad" + std::to_string(k), c.forward);
    const std::string out = root_ + "/out_bad" + std::to_string(k++);
    auto r = run(kTiler + base + out + " -m " + model + " " + c.flags);
    EXPECT_EQ(r.code, 1) << c.forward << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.forward << c.flags << "\n" << r.output;
    if (c.flags.empty() && c.message.find("empty") == std::string::npos) {
      EXPECT_NE(r.output.find("--task classify | embed"), std::string::npos) << r.output;
    }
    EXPECT_FALSE(fs::exists(out + "/report.json"));
  }
  // A directory where the model belongs says what a model directory must hold (a model card's package).
  auto r = run(kTiler + base + root_ + "/out_bad_dir -m " + root_);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(
      r.output.find("is a directory without rdf.yaml or bioimageio.yaml (bioimage.io), or config.json and "
                    "torchscript_model.pt (WSInfer)"),
      std::string::npos)
      << r.output;
  // --task and --save that disagree are refused before the model loads.
  r = run(kTiler + base + root_ + "/out_bad_save --task embed --save csv -m /nonexistent.pt");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--save csv is an output of --task classify, not of --task embed"),
            std::string::npos)
      << r.output;
  // A feature size that changes between batches fails the images of that batch, clearly.
  const std::string varying = perWindowModel(root_, "varying", "    return f.repeat(1, x.size(0))\n");
  const std::string out = root_ + "/out_varying";
  r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + varying + " -o " + out +
          " --window 64 --batch_size 4 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 2) << r.output;
  const std::string error = (*imageEntry(report(out), "a_large.tif"))["error"];
  EXPECT_NE(error.find("the model's output is [4, 32] for 4 windows, not [4, 8]"), std::string::npos)
      << error;
  EXPECT_FALSE(fs::exists(out + "/a_large.h5"));
  EXPECT_FALSE(fs::exists(out + "/a_large.h5.partial"));
}

}  // namespace
}  // namespace tiler::e2e
