// model_card: WSInfer's config.json and bioimage.io's rdf.yaml read into tiler's settings, each refusal by
// name (pre- and postprocessing steps with the reason); end to end, a card's run equals the run with its
// settings as flags, a flag wins and the report says so, and `tiler check-model` reproduces a package's test
// tensors (through every step, as NumPy computes them) and fails on altered weights.
#include "tiler/model/model_card.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"

namespace fs = std::filesystem;
using namespace tiler;

namespace {

const std::string kTiler = std::string(TILER_BIN_DIR) + "/tiler";
const std::string kSamples = std::string(TILER_TEST_SOURCE_DIR) + "/samples";

std::string writeFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
  return path;
}

std::string configError(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "no error";
}

const char* kWsinferConfig = R"({
  "spec_version": "1.0", "architecture": "resnet34", "num_classes": 2, "class_names": ["notumor", "tumor"],
  "patch_size_pixels": 350, "spacing_um_px": 0.25,
  "transform": [{"name": "Resize", "arguments": {"size": 224}}, {"name": "ToTensor"},
                {"name": "Normalize", "arguments": {"mean": [0.7, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}}]})";

// A bioimage.io 0.5 description of a segmentation model; `patch` replaces one line of it.
std::string rdfText(const std::string& from = "", const std::string& to = "") {
  std::string text = R"(type: model
format_version: 0.5.4
name: two-class blobs
description: a test package
authors: [{name: tiler tests}]
license: MIT
inputs:
  - id: raw
    axes:
      - type: batch
      - type: channel
        channel_names: [r, g, b]
      - {type: space, id: y, size: {min: 64, step: 32}, unit: micrometer, scale: 0.5}
      - {type: space, id: x, size: {min: 64, step: 32}, unit: micrometer, scale: 0.5}
    test_tensor: {source: test_input.npy}
    preprocessing:
      - id: ensure_dtype
        kwargs: {dtype: float32}
      - id: scale_linear
        kwargs: {gain: 0.00392156862745098, offset: 0.0}
      - id: fixed_zero_mean_unit_variance
        kwargs: {axis: channel, mean: [0.5, 0.25, 0.5], std: [0.5, 0.25, 1.0]}
outputs:
  - id: probs
    axes:
      - type: batch
      - type: channel
        channel_names: [background, blob]
      - {type: space, id: y, size: {tensor_id: raw, axis_id: y}}
      - {type: space, id: x, size: {tensor_id: raw, axis_id: x}}
    test_tensor: {source: test_output.npy}
    postprocessing:
      - id: softmax
        kwargs: {axis: channel}
weights:
  torchscript: {source: weights.pt, pytorch_version: "1.13"}
  onnx: {source: weights.onnx, opset_version: 15}
config:
  bioimageio:
    reproducibility_tolerance:
      - {weights_formats: [onnx], relative_tolerance: 0.1}
      - {relative_tolerance: 0.002, absolute_tolerance: 0.0005, mismatched_elements_per_million: 10}
)";
  if (!from.empty()) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
  }
  return text;
}

}  // namespace

TEST(ModelCard, WsinferConfigGivesWindowResolutionNormalisationAndClasses) {
  const std::string dir = test::scratchDir("card_wsinfer");
  writeFile(dir + "/config.json", kWsinferConfig);
  const auto card = findModelCard(dir + "/torchscript_model.pt");
  ASSERT_TRUE(card);
  EXPECT_EQ(card->kind, "wsinfer");
  EXPECT_EQ(card->weights, dir + "/torchscript_model.pt");
  // 350 px at 0.25 um/px resized to 224: 224 px windows at 0.25 * 350 / 224 um/px.
  EXPECT_EQ(*card->window, "224");
  EXPECT_DOUBLE_EQ(*card->mpp, 0.25 * 350 / 224);
  EXPECT_FALSE(card->scale);  // ToTensor's 1/255 of 8-bit values: tiler's default
  EXPECT_EQ(*card->mean, (std::vector<double>{0.7, 0.5, 0.6}));
  EXPECT_EQ(*card->std, (std::vector<double>{0.2, 0.25, 0.3}));
  EXPECT_EQ(*card->classes, "notumor,tumor");
  EXPECT_EQ(*card->activation, "softmax");
  EXPECT_EQ(*card->task, "classify");
  // Without Resize the patch is the window; one class is read through a sigmoid, as WSInfer does.
  nlohmann::json one = nlohmann::json::parse(kWsinferConfig);
  one["num_classes"] = 1;
  one["class_names"] = {"tumor"};
  one["transform"].erase(0);
  writeFile(dir + "/config.json", one.dump());
  const auto single = findModelCard(dir + "/m.pt");
  EXPECT_EQ(*single->window, "350");
  EXPECT_DOUBLE_EQ(*single->mpp, 0.25);
  EXPECT_EQ(*single->activation, "sigmoid");
  // A WSInfer zoo directory (as Hugging Face holds one) names its TorchScript file.
  writeFile(dir + "/zoo/config.json", kWsinferConfig);
  writeFile(dir + "/zoo/torchscript_model.pt", "");
  EXPECT_EQ(findModelCard(dir + "/zoo")->weights, dir + "/zoo/torchscript_model.pt");
  // Another tool's config.json beside a model is not a card.
  writeFile(dir + "/config.json", R"({"model_type": "vit", "hidden_size": 768})");
  EXPECT_FALSE(findModelCard(dir + "/m.pt"));
  EXPECT_FALSE(findModelCard(""));
}

TEST(ModelCard, WsinferFieldsTilerLacksAreRefusedByName) {
  const std::string dir = test::scratchDir("card_wsinfer_bad");
  auto refusal = [&](const std::function<void(nlohmann::json&)>& spoil) {
    nlohmann::json j = nlohmann::json::parse(kWsinferConfig);
    spoil(j);
    writeFile(dir + "/config.json", j.dump());
    return configError([&] { findModelCard(dir + "/m.pt"); });
  };
  const std::string crop = refusal([](auto& j) { j["transform"][1] = {{"name", "CenterCrop"}}; });
  EXPECT_NE(crop.find("config.json': transform CenterCrop is not a step tiler has"), std::string::npos)
      << crop;
  const std::string field = refusal([](auto& j) { j["stain_normalization"] = "macenko"; });
  EXPECT_NE(field.find("field 'stain_normalization' is not a WSInfer model config field"), std::string::npos)
      << field;
  const std::string names = refusal([](auto& j) { j["class_names"].push_back("other"); });
  EXPECT_NE(names.find("class_names has 3 name(s), num_classes is 2"), std::string::npos) << names;
  const std::string missing = refusal([](auto& j) { j.erase("spacing_um_px"); });
  EXPECT_NE(missing.find("WSInfer's field 'spacing_um_px' is missing"), std::string::npos) << missing;
  const std::string interp =
      refusal([](auto& j) { j["transform"][0]["arguments"]["interpolation"] = "nearest"; });
  EXPECT_NE(interp.find("Resize's argument 'interpolation' is not one tiler takes"), std::string::npos)
      << interp;
  const std::string comma = refusal([](auto& j) { j["class_names"][1] = "tumor,high grade"; });
  EXPECT_NE(comma.find("class name 'tumor,high grade'"), std::string::npos) << comma;
}

TEST(ModelCard, BioimageioRdfGivesWindowResolutionPreprocessingAndOutputs) {
  const std::string dir = test::scratchDir("card_rdf");
  writeFile(dir + "/pkg/rdf.yaml", rdfText());
  const auto card = findModelCard(dir + "/pkg");  // a package directory
  ASSERT_TRUE(card);
  EXPECT_EQ(card->kind, "bioimageio");
  EXPECT_EQ(card->path, dir + "/pkg/rdf.yaml");
  EXPECT_EQ(card->weights, dir + "/pkg/weights.pt");
  EXPECT_EQ(card->test_input, dir + "/pkg/test_input.npy");
  EXPECT_EQ(card->test_output, dir + "/pkg/test_output.npy");
  EXPECT_EQ(*card->window, "256");  // {min 64, step 32}: the first size of at least 256
  EXPECT_DOUBLE_EQ(*card->mpp, 0.5);
  // x / 255 then (. - m) / (s + 1e-6): tiler's (x * 1 - mean) / std.
  EXPECT_EQ(*card->scale, 1.0);
  const std::vector<double> m{0.5, 0.25, 0.5}, s{0.5, 0.25, 1.0};
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_NEAR((*card->mean)[c], m[c] * 255, 1e-9);
    EXPECT_NEAR((*card->std)[c], (s[c] + 1e-6) * 255, 1e-9);
  }
  EXPECT_EQ(*card->classes, "background,blob");
  EXPECT_EQ(*card->activation, "softmax");
  EXPECT_EQ(*card->task, "segment");
  // A space axis without an id is x (the spec's default).
  const auto no_id = readBioimageioRdf(writeFile(
      dir + "/no_id.yaml", rdfText("{type: space, id: x, size: {min: 64", "{type: space, size: {min: 64")));
  EXPECT_EQ(*no_id.window, "256");
  // A step without kwargs takes the spec's defaults (softmax and sigmoid along channel).
  const auto sigmoid = readBioimageioRdf(
      writeFile(dir + "/sigmoid.yaml",
                rdfText("      - id: softmax\n        kwargs: {axis: channel}", "      - id: sigmoid")));
  EXPECT_EQ(*sigmoid.activation, "sigmoid");
  // The tolerance of torchscript weights: the onnx-only entry is not theirs.
  EXPECT_EQ(card->tolerance.relative, 0.002);
  EXPECT_EQ(card->tolerance.absolute, 0.0005);
  EXPECT_EQ(card->tolerance.mismatched_per_million, 10);
  // A fixed size and no preprocessing: raw values (scale 1), no mean or std; bioimage.io's default tolerance.
  writeFile(dir + "/plain.yaml",
            rdfText("size: {min: 64, step: 32}, unit: micrometer, scale: 0.5}\n      - {type: space, id: x, "
                    "size: {min: 64, step: 32}, unit: micrometer, scale: 0.5}",
                    "size: 96}\n      - {type: space, id: x, size: 128}"));
  std::string text = tiler::test::slurp(dir + "/plain.yaml");
  text.replace(text.find("    preprocessing:"), text.find("outputs:") - text.find("    preprocessing:"), "");
  text.replace(text.find("config:"), std::string::npos, "");
  writeFile(dir + "/plain.yaml", text);
  const auto plain = findModelCard(dir + "/plain.yaml");
  EXPECT_EQ(*plain->window, "128,96");
  EXPECT_FALSE(plain->mpp);
  EXPECT_EQ(*plain->scale, 1.0);
  EXPECT_FALSE(plain->mean);
  EXPECT_EQ(plain->tolerance.relative, 1e-3);
  EXPECT_EQ(plain->tolerance.absolute, 1e-3);
}

namespace {

// rdfText with its preprocessing and postprocessing lists replaced by `pre` and `post` (YAML list items).
std::string rdfWithSteps(const std::string& pre, const std::string& post) {
  std::string text = rdfText();
  const size_t pre_at = text.find("    preprocessing:\n"), pre_end = text.find("outputs:");
  text.replace(pre_at, pre_end - pre_at, "    preprocessing:\n" + pre);
  const size_t post_at = text.find("    postprocessing:\n"), post_end = text.find("weights:");
  text.replace(post_at, post_end - post_at, "    postprocessing:\n" + post);
  return text;
}

}  // namespace

TEST(ModelCard, EveryStepIsReadInTheCardsOrder) {
  const std::string dir = test::scratchDir("card_steps");
  const auto card = readBioimageioRdf(writeFile(
      dir + "/rdf.yaml",
      rdfWithSteps(R"(      - {id: scale_linear, kwargs: {gain: 2, offset: [1, 2, 3], axis: channel}}
      - {id: scale_range, kwargs: {axes: [y, x], min_percentile: 1, max_percentile: 99.8, eps: 1.0e-5, mode: per_sample, reference_tensor: raw}}
      - {id: zero_mean_unit_variance, kwargs: {axes: [batch, channel, y, x], eps: 1.0e-4}}
      - {id: fixed_zero_mean_unit_variance, kwargs: {mean: 0.5, std: 2}}
      - {id: ensure_dtype, kwargs: {dtype: float32}}
      - {id: clip, kwargs: {min: -3, max: 3}}
      - {id: sigmoid}
      - {id: binarize, kwargs: {threshold: [0.2, 0.5, 0.7], axis: channel}}
)",
                   R"(      - {id: sigmoid}
      - {id: scale_linear, kwargs: {gain: 0.5, offset: 0.25}}
      - {id: clip, kwargs: {max: 0.6}}
      - {id: binarize, kwargs: {threshold: 0.4}}
      - {id: ensure_dtype, kwargs: {dtype: uint8}}
)")));
  const auto& pre = card.preprocessing;
  EXPECT_EQ(stepNames(pre),
            "scale_linear, scale_range, zero_mean_unit_variance, scale_linear, clip, sigmoid, binarize");
  ASSERT_EQ(pre.size(), 7u);
  EXPECT_EQ(pre[0].gain, (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(pre[0].offset, (std::vector<double>{1, 2, 3}));
  EXPECT_TRUE(pre[1].per_channel);
  EXPECT_EQ(pre[1].min_percentile, 1);
  EXPECT_EQ(pre[1].max_percentile, 99.8);
  EXPECT_EQ(pre[1].eps, 1e-5);
  EXPECT_FALSE(pre[2].per_channel);
  EXPECT_EQ(pre[2].eps, 1e-4);
  // fixed_zero_mean_unit_variance: (x - 0.5) / (2 + 1e-6), a scale_linear.
  EXPECT_DOUBLE_EQ(pre[3].gain[0], 1 / (2 + 1e-6));
  EXPECT_DOUBLE_EQ(pre[3].offset[0], -0.5 / (2 + 1e-6));
  EXPECT_EQ(pre[4].min, -3);
  EXPECT_EQ(pre[4].max, 3);
  EXPECT_EQ(pre[6].threshold, (std::vector<double>{0.2, 0.5, 0.7}));
  // The chain is more than fixed numbers: no --mean or --std from it, raw values (scale 1) into it.
  EXPECT_FALSE(card.mean);
  EXPECT_FALSE(card.std);
  EXPECT_EQ(*card.scale, 1.0);
  // A leading sigmoid is the activation; the rest follow it, the cast after binarize changing nothing.
  EXPECT_EQ(*card.activation, "sigmoid");
  EXPECT_EQ(stepNames(card.postprocessing), "scale_linear, clip, binarize");
  EXPECT_EQ(card.postprocessing[1].max, 0.6);
  EXPECT_EQ(card.postprocessing[2].threshold, (std::vector<double>{0.4}));
  // Statistics axes default to all of them (the spec's default).
  const auto plain =
      readBioimageioRdf(writeFile(dir + "/plain.yaml", rdfWithSteps("      - {id: zero_mean_unit_variance}\n",
                                                                    "      - {id: softmax}\n")));
  ASSERT_EQ(plain.preprocessing.size(), 1u);
  EXPECT_FALSE(plain.preprocessing[0].per_channel);
  EXPECT_EQ(plain.preprocessing[0].eps, 1e-6);
  EXPECT_TRUE(plain.postprocessing.empty());
  // applyModelCard hands the lists to the job.
  std::vector<ProcessingStep> pre_target, post_target;
  CardTargets targets;
  targets.preprocessing = &pre_target, targets.postprocessing = &post_target;
  applyModelCard(card, {}, targets);
  EXPECT_EQ(pre_target.size(), 7u);
  EXPECT_EQ(post_target.size(), 3u);
}

TEST(ModelCard, StepsTilerCannotFollowAreRefusedByNameWithTheReason) {
  const std::string dir = test::scratchDir("card_steps_bad");
  auto refusal = [&](const std::string& pre, const std::string& post = "      - {id: softmax}\n") {
    const std::string path = writeFile(dir + "/rdf.yaml", rdfWithSteps(pre, post));
    return configError([&] { readBioimageioRdf(path); });
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"      - {id: scale_range, kwargs: {mode: per_dataset, axes: [y, x]}}\n",
       {"inputs[0].preprocessing[0] (scale_range)'s mode per_dataset", "normalises each image by its own"}},
      {"      - {id: zero_mean_unit_variance, kwargs: {axes: [x]}}\n",
       {"preprocessing[0] (zero_mean_unit_variance)'s axes leave out y or x", "never per row or column"}},
      {"      - {id: zero_mean_unit_variance, kwargs: {axes: [z, y, x]}}\n",
       {"(zero_mean_unit_variance)'s axis 'z' is not one of the input's"}},
      {"      - {id: clip, kwargs: {min: 0, max: 255}}\n      - {id: zero_mean_unit_variance}\n",
       {"preprocessing[1] (zero_mean_unit_variance) after clip", "through affine steps only"}},
      {"      - {id: scale_range, kwargs: {reference_tensor: other}}\n",
       {"reference_tensor 'other' is not the input ('raw')"}},
      {"      - {id: scale_range, kwargs: {min_percentile: 99, max_percentile: 1}}\n",
       {"percentiles 99 and 1 are not 0 <= min < max <= 100"}},
      {"      - {id: ensure_dtype, kwargs: {dtype: uint8}}\n",
       {"(ensure_dtype) to 'uint8': tiler feeds float32"}},
      {"      - {id: scale_linear, kwargs: {gain: [1, 2], axis: y}}\n",
       {"(scale_linear) along axis 'y'", "along the channel axis"}},
      {"      - {id: scale_linear, kwargs: {gain: 2, factor: 3}}\n",
       {"(scale_linear)'s kwarg 'factor' is not one tiler knows"}},
      {"      - {id: softmax}\n", {"preprocessing[0] (softmax) is a postprocessing step"}},
      {"      - {id: resize, kwargs: {factor: 2}}\n", {"preprocessing[0] (resize) is not a step tiler has"}},
      {"      - {id: binarize}\n", {"(binarize) has no threshold"}},
      {"      - {id: clip, kwargs: {min: 2, max: 1}}\n", {"(clip)'s min 2 is over its max 1"}},
  };
  for (const auto& [pre, wanted] : cases) {
    const std::string message = refusal(pre);
    for (const auto& fragment : wanted)
      EXPECT_NE(message.find(fragment), std::string::npos) << pre << message;
  }
  const std::string scale_id = "      - {id: scale_linear, kwargs: {gain: 2}}\n";
  for (const std::string& id : {"zero_mean_unit_variance", "scale_range", "scale_mean_variance"}) {
    const std::string message = refusal(scale_id, "      - {id: " + id + "}\n");
    EXPECT_NE(message.find("outputs[0].postprocessing[0] (" + id +
                           "): a postprocessing step over the output's "
                           "statistics needs the whole output"),
              std::string::npos)
        << message;
  }
  const std::string cast =
      refusal(scale_id, "      - {id: sigmoid}\n      - {id: ensure_dtype, kwargs: {dtype: uint8}}\n");
  EXPECT_NE(cast.find("postprocessing[1] (ensure_dtype) to 'uint8': tiler writes float outputs"),
            std::string::npos)
      << cast;
  const std::string along = refusal(scale_id, "      - {id: softmax, kwargs: {axis: y}}\n");
  EXPECT_NE(along.find("(softmax) along y; tiler's is along channel"), std::string::npos) << along;
}

TEST(ModelCard, BioimageioFieldsTilerLacksAreRefusedByName) {
  const std::string dir = test::scratchDir("card_rdf_bad");
  auto refusal = [&](const std::string& from, const std::string& to) {
    const std::string path = writeFile(dir + "/rdf.yaml", rdfText(from, to));
    return configError([&] { readBioimageioRdf(path); });
  };
  const std::string onnx = refusal("  torchscript: {source: weights.pt, pytorch_version: \"1.13\"}\n", "");
  EXPECT_NE(onnx.find("rdf.yaml': weights has onnx only; tiler runs torchscript weights"), std::string::npos)
      << onnx;
  const std::string step = refusal("id: scale_linear", "id: resize");
  EXPECT_NE(step.find("inputs[0].preprocessing[1] (resize) is not a step tiler has"), std::string::npos)
      << step;
  const std::string post = refusal("id: softmax", "id: resize");
  EXPECT_NE(post.find("outputs[0].postprocessing[0] (resize) is not a step tiler has"), std::string::npos)
      << post;
  const std::string axes = refusal("      - type: channel\n        channel_names: [r, g, b]\n", "");
  EXPECT_NE(axes.find("inputs[0].axes are batch,y,x; tiler feeds batch,channel,y,x"), std::string::npos)
      << axes;
  const std::string listed = refusal("type: model", "type: [model, dataset]");
  EXPECT_NE(listed.find("rdf.yaml': field 'type' must be a string, not a list"), std::string::npos) << listed;
  const std::string old_card = refusal("type: model\nformat_version: 0.5.4", "format_version: 0.3.2");
  EXPECT_NE(old_card.find("format_version '0.3.2': tiler reads spec 0.5"), std::string::npos) << old_card;
  const std::string version = refusal("format_version: 0.5.4", "format_version: 0.4.10");
  EXPECT_NE(version.find("format_version '0.4.10'"), std::string::npos) << version;
  const std::string unknown = refusal("license: MIT", "license: MIT\ntiling: {halo: 8}");
  EXPECT_NE(unknown.find("field 'tiling' is not one tiler knows"), std::string::npos) << unknown;
  const std::string url = refusal("source: weights.pt", "source: https://zenodo.org/weights.pt");
  EXPECT_NE(url.find("weights.torchscript.source is a URL"), std::string::npos) << url;
  const std::string yaml = refusal("inputs:", "inputs: [");
  EXPECT_NE(yaml.find("rdf.yaml': not a YAML model description"), std::string::npos) << yaml;
  fs::create_directories(dir + "/empty");
  EXPECT_NE(configError([&] { findModelCard(dir + "/empty"); }).find("without rdf.yaml"), std::string::npos);
}

TEST(ModelCard, FilesOutsideThePackageAreRefusedNamingThePath) {
  const std::string dir = test::scratchDir("card_outside");
  auto refusal = [&](const std::string& from, const std::string& to) {
    const std::string path = writeFile(dir + "/pkg/rdf.yaml", rdfText(from, to));
    return configError([&] { readBioimageioRdf(path); });
  };
  for (const std::string& elsewhere : {"../other/weights.pt", "/etc/weights.pt", "sub/../../weights.pt"}) {
    const std::string out = refusal("source: weights.pt", "source: " + elsewhere);
    EXPECT_NE(out.find("weights.torchscript.source '" + elsewhere + "' lies outside the package"),
              std::string::npos)
        << out;
  }
  const std::string tensor = refusal("source: test_input.npy", "source: ../test_input.npy");
  EXPECT_NE(tensor.find("inputs[0].test_tensor.source '../test_input.npy' lies outside"), std::string::npos)
      << tensor;
  // A link inside the package that leads out of it.
  writeFile(dir + "/secret/weights.pt", "x");
  fs::create_symlink(fs::absolute(dir + "/secret"), dir + "/pkg/linked");
  const std::string linked = refusal("source: weights.pt", "source: linked/weights.pt");
  EXPECT_NE(linked.find("leads outside the package"), std::string::npos) << linked;
  EXPECT_EQ(refusal("source: weights.pt", "source: ./sub/../weights.pt"), "no error");
}

TEST(ModelCard, NumbersTheFlagsWouldRefuseAreRefusedNamingTheCard) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    std::function<void(ModelCard&)> set;
    std::string message;
  };
  const Case cases[] = {
      {[](ModelCard& c) {
         c.std = std::vector<double>{1, 1e-320};
       },
       "(channel 1) is not a positive number of at least 1e-30"},
      {[](ModelCard& c) { c.std = std::vector<double>{-1}; }, "std -1 (channel 0) is not a positive"},
      {[&](ModelCard& c) { c.mean = std::vector<double>{nan}; },
       "mean nan (channel 0) is not a finite number"},
      {[](ModelCard& c) { c.mpp = -0.5; }, "its pixel size -0.5 µm is not a positive number"},
      {[](ModelCard& c) { c.scale = std::numeric_limits<double>::infinity(); }, "input scale inf"}};
  for (const auto& [set, message] : cases) {
    ModelCard card;
    card.path = "zoo/rdf.yaml";
    set(card);
    std::vector<double> mean, std;
    double mpp = 0, scale = 0;
    const std::string error = configError([&] {
      applyModelCard(card, {}, {nullptr, &mpp, &scale, &mean, &std});
    });
    EXPECT_NE(error.find("'zoo/rdf.yaml': its "), std::string::npos) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_EQ(error.find("--"), std::string::npos) << "blames no flag: " << error;
  }
}

TEST(ModelCard, CardsThatAreNoFilesOrExplodeAreRefusedInOneLine) {
  const std::string dir = test::scratchDir("card_hostile");
  // A FIFO as the card, named or as a package's rdf.yaml: refused at once, never waited on.
  ASSERT_EQ(mkfifo((dir + "/pipe.yaml").c_str(), 0600), 0);
  const std::string fifo = configError([&] { findModelCard(dir + "/pipe.yaml"); });
  EXPECT_NE(fifo.find("pipe.yaml': is a FIFO (named pipe)"), std::string::npos) << fifo;
  fs::create_directories(dir + "/pkg");
  ASSERT_EQ(mkfifo((dir + "/pkg/rdf.yaml").c_str(), 0600), 0);
  const std::string in_package = configError([&] { findModelCard(dir + "/pkg"); });
  EXPECT_NE(in_package.find("rdf.yaml': is a FIFO"), std::string::npos) << in_package;
  // Aliases of aliases: a few KiB of YAML that stands for gigabytes.
  std::string bomb = "a: &a [" + std::string(1000, 'x') + "]\n";
  for (int level = 1; level < 8; ++level) {
    bomb += "l" + std::to_string(level) + ": &l" + std::to_string(level) + " [";
    for (int k = 0; k < 20; ++k)
      bomb += std::string(k ? ", " : "") + "*" + (level == 1 ? "a" : "l" + std::to_string(level - 1));
    bomb += "]\n";
  }
  const std::string exploded = configError(
      [&] { readBioimageioRdf(writeFile(dir + "/bomb/rdf.yaml", rdfText("license: MIT", bomb))); });
  EXPECT_NE(exploded.find("with its aliases expanded it holds over 16 MiB"), std::string::npos) << exploded;
  EXPECT_LT(exploded.size(), 300u);
  // A WSInfer config nested 200000 deep.
  writeFile(dir + "/deep/torchscript_model.pt", "x");
  writeFile(dir + "/deep/config.json",
            R"({"spec_version": "1.0", "x": )" + std::string(200000, '[') + std::string(200000, ']') + "}");
  const std::string deep = configError([&] { findModelCard(dir + "/deep"); });
  EXPECT_NE(deep.find("config.json': not JSON: nested deeper than 64 levels"), std::string::npos) << deep;
}

TEST(ModelCard, AFlagWinsAndEachSettingSaysWhereItCameFrom) {
  ModelCard card;
  card.window = "224";
  card.mpp = 0.5;
  card.mean = std::vector<double>{0.5};
  card.activation = "softmax";
  std::string window = "256", activation = "none", task = "auto", classes;
  double mpp = 0.0, scale = 0.0;
  std::vector<double> mean, std;
  const auto from =
      applyModelCard(card, {"mpp"}, {&window, &mpp, &scale, &mean, &std, &classes, &activation, &task});
  EXPECT_EQ(window, "224");
  EXPECT_EQ(mpp, 0.0);  // the flag's (given: left alone)
  EXPECT_EQ(mean, std::vector<double>{0.5});
  EXPECT_EQ(activation, "softmax");
  EXPECT_EQ(task, "auto");
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"window", "card"}, {"mpp", "flag"},        {"scale", "default"},   {"mean", "card"},
      {"std", "default"}, {"classes", "default"}, {"activation", "card"}, {"task", "default"}};
  EXPECT_EQ(from, expected);
}

namespace {

std::map<std::string, std::string> outputFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != "report.json")
      files[e.path().filename().string()] = test::slurp(e.path().string());
  return files;
}

nlohmann::json reportOf(const std::string& dir) {
  return nlohmann::json::parse(test::slurp(dir + "/report.json"));
}

}  // namespace

// A WSInfer-style config.json beside the bundled classifier: a run without flags is the run with its settings
// as flags, byte for byte; a flag wins over the card, and the report says where each setting came from.
TEST(ModelCard, AWsinferCardRunsAsItsSettingsGivenAsFlags) {
  const std::string root = test::scratchDir("card_wsinfer_run");
  fs::create_directories(root + "/zoo");
  fs::create_directories(root + "/plain");
  fs::copy_file(kSamples + "/models/classifier.pt", root + "/zoo/torchscript_model.pt");
  fs::copy_file(kSamples + "/models/classifier.pt", root + "/plain/classifier.pt");
  writeFile(root + "/zoo/config.json", R"({"spec_version": "1.0", "architecture": "test", "num_classes": 2,
    "class_names": ["glass", "blob"], "patch_size_pixels": 48, "spacing_um_px": 1.0,
    "transform": [{"name": "ToTensor"},
                  {"name": "Normalize", "arguments": {"mean": [0.5, 0.4, 0.3], "std": [0.25, 0.2, 0.3]}}]})");
  const std::string common =
      kTiler + " -i " + kSamples + "/images/small.png --input_mpp 0.5 --threads 1 --no_progress";
  const auto card =
      test::runCommand(common + " -m " + root + "/zoo/torchscript_model.pt -o " + root + "/by_card");
  ASSERT_EQ(card.code, 0) << card.output;
  const auto flags = test::runCommand(common + " -m " + root + "/plain/classifier.pt -o " + root +
                                      "/by_flags --window 48 --mpp 1 --mean 0.5,0.4,0.3 --std 0.25,0.2,0.3 "
                                      "--classes glass,blob --activation softmax --task classify");
  ASSERT_EQ(flags.code, 0) << flags.output;
  // A card's value that does not fit the model is the card's fault in the message, not a flag's.
  std::string three_classes = test::slurp(root + "/zoo/config.json");
  for (const auto& [from, to] :
       {std::pair<std::string, std::string>{R"("num_classes": 2)", R"("num_classes": 3)"},
        {R"(["glass", "blob"])", R"(["glass", "blob", "dust"])"}})
    three_classes.replace(three_classes.find(from), from.size(), to);
  writeFile(root + "/three/config.json", three_classes);
  fs::copy_file(kSamples + "/models/classifier.pt", root + "/three/torchscript_model.pt");
  const auto three =
      test::runCommand(common + " -m " + root + "/three/torchscript_model.pt -o " + root + "/by_three");
  EXPECT_EQ(three.code, 1) << three.output;
  EXPECT_NE(three.output.find("the model card's classes ('" + root + "/three/config.json')"),
            std::string::npos)
      << three.output;
  EXPECT_EQ(three.output.find("--classes"), std::string::npos) << three.output;
  const auto by_card = outputFiles(root + "/by_card"), by_flags = outputFiles(root + "/by_flags");
  EXPECT_EQ(by_card.size(), 2u);  // classify's csv and tiles
  EXPECT_TRUE(by_card == by_flags) << "a card's run is the run with its settings as flags, byte for byte";
  const auto report = reportOf(root + "/by_card");
  EXPECT_EQ(report["model_card"], root + "/zoo/config.json");
  EXPECT_EQ(report["model"], root + "/zoo/torchscript_model.pt");
  EXPECT_EQ(report["window"], nlohmann::json({48, 48}));
  EXPECT_EQ(report["task"], "classify");
  const nlohmann::json from = {{"window", "card"},     {"mpp", "card"}, {"scale", "default"},
                               {"mean", "card"},       {"std", "card"}, {"classes", "card"},
                               {"activation", "card"}, {"task", "card"}};
  EXPECT_EQ(report["settings_from"], from);
  EXPECT_FALSE(reportOf(root + "/by_flags").contains("settings_from"));
  // A flag wins, or a --config key: window 32 (--config) over the card's 48; --mean as the card's values,
  // still the flag's; the report says where each came from.
  writeFile(root + "/over.toml", "window = \"32\"\n");
  const auto over = test::runCommand(common + " -m " + root + "/zoo/torchscript_model.pt -o " + root +
                                     "/over --config " + root + "/over.toml --mean 0.5,0.4,0.3");
  ASSERT_EQ(over.code, 0) << over.output;
  const auto over_report = reportOf(root + "/over");
  EXPECT_EQ(over_report["window"], nlohmann::json({32, 32}));
  EXPECT_EQ(over_report["settings_from"]["window"], "flag");
  EXPECT_EQ(over_report["settings_from"]["mean"], "flag");
  EXPECT_EQ(over_report["settings_from"]["mpp"], "card");
  EXPECT_FALSE(outputFiles(root + "/over") == by_card);
  // A field tiler lacks stops the run in one line naming the file.
  writeFile(root + "/zoo/config.json", R"({"num_classes": 2, "class_names": ["glass", "blob"],
    "patch_size_pixels": 48, "spacing_um_px": 1.0, "transform": [{"name": "ToTensor"}, {"name": "RandomCrop"}]})");
  const auto bad = test::runCommand(common + " -m " + root + "/zoo/torchscript_model.pt -o " + root + "/bad");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("config.json': transform RandomCrop is not a step tiler has"), std::string::npos)
      << bad.output;
}

namespace {

// A bioimage.io package made here: a small TorchScript segmentation net, a test input and the test output the
// net gives for it with the card's preprocessing and softmax (PyTorch and NumPy of TILER_PYTHON or the
// system's Python), and the same net with one output channel's weights shifted (altered.pt). Empty, with the
// reason in `why`, where that Python has no PyTorch or NumPy.
std::string makePackage(const std::string& dir, std::string* why) {
  const char* env = std::getenv("TILER_PYTHON");
  const std::string python = env && *env ? env : "/usr/bin/python3";
  if (test::runCommand(python + " -c 'import torch, numpy'").code != 0) {
    *why = python + " has no PyTorch or NumPy to make the package's test tensors";
    return "";
  }
  writeFile(dir + "/make.py", R"(import sys, torch, numpy as np
d = sys.argv[1]
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 2, 1)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
net = Net().eval()
torch.jit.script(net).save(d + '/weights.pt')
x = torch.rand(1, 3, 64, 64) * 255
mean = torch.tensor([0.5, 0.25, 0.5]).view(1, 3, 1, 1)
std = torch.tensor([0.5, 0.25, 1.0]).view(1, 3, 1, 1)
with torch.no_grad():
    y = torch.softmax(net((x / 255 - mean) / (std + 1e-6)), 1)
    net.b.weight[0] += 0.05
np.save(d + '/test_input.npy', x.numpy())
np.save(d + '/test_output.npy', y.numpy())
torch.jit.script(net).save(d + '/altered.pt')
)");
  const auto r = test::runCommand(python + " " + dir + "/make.py " + dir);
  EXPECT_EQ(r.code, 0) << r.output;
  // Fixed 64 px input, no unit (so no --mpp), and neither onnx weights nor their tolerance.
  std::string rdf = rdfText("{min: 64, step: 32}, unit: micrometer, scale: 0.5}", "64}");
  rdf = rdf.replace(rdf.find("{min: 64, step: 32}, unit: micrometer, scale: 0.5}"),
                    std::string("{min: 64, step: 32}, unit: micrometer, scale: 0.5}").size(), "64}");
  rdf.replace(rdf.find("  onnx:"), rdf.find("config:") - rdf.find("  onnx:"), "");
  writeFile(dir + "/rdf.yaml", rdf);
  return r.code == 0 ? dir : "";
}

}  // namespace

// check-model reproduces the package's own test output (exit 0) and fails on altered weights (exit 1), each
// with the largest difference; infer takes the package as -m.
TEST(ModelCard, CheckModelReproducesAPackagesTestTensorsAndFailsOnAlteredWeights) {
  const std::string root = test::scratchDir("card_check");
  std::string why;
  const std::string pkg = makePackage(root + "/pkg", &why);
  if (pkg.empty()) GTEST_SKIP() << why;
  const auto good = test::runCommand(kTiler + " check-model " + pkg);
  EXPECT_EQ(good.code, 0) << good.output;
  EXPECT_NE(good.output.find("8192 values, largest difference "), std::string::npos) << good.output;
  EXPECT_NE(good.output.find(": pass"), std::string::npos) << good.output;
  fs::copy(pkg, root + "/bad");
  fs::copy_file(pkg + "/altered.pt", root + "/bad/weights.pt", fs::copy_options::overwrite_existing);
  const auto bad = test::runCommand(kTiler + " check-model " + root + "/bad/rdf.yaml");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("largest difference "), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find(": FAIL"), std::string::npos) << bad.output;
  // A test input of another channel count than the card's normalisation and model: one line naming the card,
  // its setting as the card's (no flag was given), never a traceback.
  fs::copy(pkg, root + "/gray");
  const auto gray_npy = test::runCommand("/usr/bin/python3 -c \"import numpy as np; np.save('" + root +
                                         "/gray/test_input.npy', np.zeros((1, 1, 64, 64), np.float32))\"");
  ASSERT_EQ(gray_npy.code, 0) << gray_npy.output;
  const auto gray = test::runCommand(kTiler + " check-model " + root + "/gray");
  EXPECT_EQ(gray.code, 1) << gray.output;
  EXPECT_NE(gray.output.find("check-model '" + root + "/gray/rdf.yaml': "), std::string::npos) << gray.output;
  EXPECT_EQ(gray.output.find("--mean"), std::string::npos) << gray.output;
  EXPECT_EQ(std::count(gray.output.begin(), gray.output.end(), '\n'), 1) << gray.output;
  // A card without test tensors has nothing to check.
  const auto none = test::runCommand(kTiler + " check-model " + kSamples + "/models/sample.pt");
  EXPECT_EQ(none.code, 1) << none.output;
  EXPECT_NE(none.output.find("names no test tensors"), std::string::npos) << none.output;
  // The package as infer's -m: its window, normalisation, activation and classes.
  const auto run = test::runCommand(kTiler + " -m " + pkg + " -i " + kSamples +
                                    "/images/small.png --threads 1 --no_progress -o " + root + "/out");
  ASSERT_EQ(run.code, 0) << run.output;
  const auto report = reportOf(root + "/out");
  EXPECT_EQ(report["model"], pkg + "/weights.pt");
  EXPECT_EQ(report["window"], nlohmann::json({64, 64}));
  EXPECT_EQ(report["settings_from"]["scale"], "card");
  EXPECT_EQ(report["settings_from"]["mpp"], "default");
  EXPECT_EQ(report["settings_from"]["activation"], "card");
}

namespace {

// A package whose card has the steps `pre` and `post` (YAML list items) and whose test output NumPy computes
// from them (`numpy_pre`, `numpy_post`: Python lines turning x, then y, in float64) around the tiny net of
// makePackage; `extra` ends the card (a config). Empty where the Python has no PyTorch or NumPy.
std::string makeStepsPackage(const std::string& dir, const std::string& pre, const std::string& post,
                             const std::string& numpy_pre, const std::string& numpy_post, std::string* why) {
  const std::string python = "/usr/bin/python3";
  if (test::runCommand(python + " -c 'import torch, numpy'").code != 0) {
    *why = python + " has no PyTorch or NumPy to make the package's test tensors";
    return "";
  }
  fs::create_directories(dir);
  writeFile(dir + "/make.py", R"(import sys, torch, numpy as np
d = sys.argv[1]
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 2, 1)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
net = Net().eval()
torch.jit.script(net).save(d + '/weights.pt')
raw = (torch.rand(1, 3, 64, 64) ** 2 * 255).numpy()
x = raw.astype(np.float64)
ch = (0, 2, 3)      # statistics over y, x of each channel
every = (0, 1, 2, 3)  # over channel, y, x
def pct(x, q, axes): return np.percentile(x, q, axis=axes, keepdims=True)
sigmoid = lambda v: 1 / (1 + np.exp(-v))
)" + numpy_pre + R"(
with torch.no_grad():
    y = net(torch.from_numpy(x.astype(np.float32))).double().numpy()
)" + numpy_post + R"(
np.save(d + '/test_input.npy', raw)
np.save(d + '/test_output.npy', y.astype(np.float32))
)");
  const auto r = test::runCommand(python + " " + dir + "/make.py " + dir);
  EXPECT_EQ(r.code, 0) << r.output;
  std::string rdf = rdfWithSteps(pre, post);
  const std::string sizes = "{min: 64, step: 32}, unit: micrometer, scale: 0.5}";
  for (int k = 0; k < 2; ++k) rdf.replace(rdf.find(sizes), sizes.size(), "64}");
  rdf.replace(rdf.find("  onnx:"), std::string::npos, "");
  writeFile(dir + "/rdf.yaml", rdf);
  return r.code == 0 ? dir : "";
}

}  // namespace

// check-model runs a card's test input through every step (its statistics of the whole test tensor) and
// matches the test output NumPy computed from the steps' definitions.
TEST(ModelCard, CheckModelFollowsEveryStepAsNumpyComputesIt) {
  const std::string root = test::scratchDir("card_check_steps");
  std::string why;
  const std::string affine = makeStepsPackage(
      root + "/affine", R"(      - {id: scale_linear, kwargs: {gain: 0.5, offset: [0, 1, 2], axis: channel}}
      - {id: scale_range, kwargs: {axes: [y, x], min_percentile: 1, max_percentile: 99.5}}
      - {id: zero_mean_unit_variance, kwargs: {axes: [channel, y, x]}}
      - {id: fixed_zero_mean_unit_variance, kwargs: {mean: 0.1, std: 0.9}}
      - {id: clip, kwargs: {min: -1.5, max: 1.5}}
      - {id: sigmoid}
)",
      R"(      - {id: sigmoid}
      - {id: scale_linear, kwargs: {gain: 2, offset: -0.5}}
      - {id: clip, kwargs: {min: 0, max: 1.2}}
)",
      R"(x = x * 0.5 + np.array([0, 1, 2]).reshape(1, 3, 1, 1)
lo, hi = pct(x, 1, ch), pct(x, 99.5, ch)
x = (x - lo) / (hi - lo + 1e-6)
x = (x - x.mean()) / (x.std() + 1e-6)
x = (x - 0.1) / (0.9 + 1e-6)
x = sigmoid(np.clip(x, -1.5, 1.5))
)",
      R"(y = np.clip(sigmoid(y) * 2 - 0.5, 0, 1.2)
)",
      &why);
  if (affine.empty()) GTEST_SKIP() << why;
  const auto a = test::runCommand(kTiler + " check-model " + affine);
  EXPECT_EQ(a.code, 0) << a.output;
  EXPECT_NE(a.output.find(": pass"), std::string::npos) << a.output;
  const std::string binary = makeStepsPackage(
      root + "/binary",
      R"(      - {id: scale_range, kwargs: {axes: [channel, y, x], min_percentile: 5, max_percentile: 95, eps: 0.001}}
      - {id: binarize, kwargs: {threshold: [0.2, 0.5, 0.6], axis: channel}}
)",
      R"(      - {id: softmax}
      - {id: binarize, kwargs: {threshold: 0.5}}
      - {id: ensure_dtype, kwargs: {dtype: uint8}}
)",
      R"(lo, hi = pct(x, 5, every), pct(x, 95, every)
x = (x - lo) / (hi - lo + 0.001)
x = (x > np.array([0.2, 0.5, 0.6]).reshape(1, 3, 1, 1)).astype(np.float64)
)",
      R"(e = np.exp(y - y.max(1, keepdims=True))
y = ((e / e.sum(1, keepdims=True)) > 0.5).astype(np.float64)
)",
      &why);
  const auto b = test::runCommand(kTiler + " check-model " + binary);
  EXPECT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find(" 0 beyond"), std::string::npos) << b.output;
  // The statistics are the whole tensor's: a card whose range is over each channel gives other numbers.
  std::string per_channel = test::slurp(binary + "/rdf.yaml");
  per_channel.replace(per_channel.find("[channel, y, x]"), 15, "[y, x]");
  fs::copy(binary, root + "/per_channel");
  writeFile(root + "/per_channel/rdf.yaml", per_channel);
  const auto c = test::runCommand(kTiler + " check-model " + root + "/per_channel");
  EXPECT_EQ(c.code, 1) << c.output;
  EXPECT_NE(c.output.find(": FAIL"), std::string::npos) << c.output;
  // Values one a channel must match the channels of the tensor the step meets (the model's 2 outputs here).
  std::string three = test::slurp(affine + "/rdf.yaml");
  const std::string post_gain = "{gain: 2, offset: -0.5}";
  three.replace(three.find(post_gain), post_gain.size(), "{gain: [2, 2, 2], offset: -0.5, axis: channel}");
  fs::copy(affine, root + "/three");
  writeFile(root + "/three/rdf.yaml", three);
  const auto t = test::runCommand(kTiler + " check-model " + root + "/three");
  EXPECT_EQ(t.code, 1) << t.output;
  EXPECT_NE(t.output.find("outputs[0].postprocessing step scale_linear has 3 values, one a channel, but the "
                          "model's tensor there has 2 channels"),
            std::string::npos)
      << t.output;
}
