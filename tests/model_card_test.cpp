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
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <torch/script.h>
#include <yaml-cpp/yaml.h>

#include "ended_naming.hpp"
#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/npy.hpp"
#include "tiler/io/zip_archive.hpp"
#include "tiler/model/model_runtime.hpp"

namespace fs = std::filesystem;
using namespace tiler;
using test::configError;

namespace {

const std::string kTiler = std::string(TILER_BIN_DIR) + "/tiler";
const std::string kSamples = std::string(TILER_TEST_SOURCE_DIR) + "/samples";

std::string writeFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
  return path;
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
  EXPECT_NE(field.find("field 'stain_normalization' (\"macenko\") says the patches are fed otherwise"),
            std::string::npos)
      << field;
  const std::string step = refusal([](auto& j) { j["transform"][1]["p"] = 0.5; });
  EXPECT_NE(step.find("transform field 'p' is not WSInfer's"), std::string::npos) << step;
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

// WSInfer's schema allows fields of its own and WSInfer ignores them: read, each named once in a warning.
TEST(ModelCard, WsinferFieldsOutsideItsSchemaAreWarnedOnceAndIgnored) {
  const std::string dir = test::scratchDir("card_wsinfer_extra");
  nlohmann::json j = nlohmann::json::parse(kWsinferConfig);
  j["description"] = "TILs in H&E";
  j["training_set"] = {{"slides", 120}};
  writeFile(dir + "/config.json", j.dump());
  std::ostringstream log;
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  std::optional<ModelCard> card;
  EXPECT_NO_THROW(card = findModelCard(dir + "/m.pt"));
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(card);
  EXPECT_EQ(*card->window, "224");
  EXPECT_EQ(*card->classes, "notumor,tumor");
  const std::string text = log.str();
  for (const std::string field : {"'description'", "'training_set'"}) {
    const size_t at = text.find(field);
    EXPECT_NE(at, std::string::npos) << text;
    EXPECT_EQ(text.find(field, at + 1), std::string::npos) << "named once: " << text;
  }
  EXPECT_NE(text.find("ignored"), std::string::npos) << text;
  EXPECT_EQ(text.find("'architecture'"), std::string::npos) << "a schema field is no surprise: " << text;
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
  EXPECT_FALSE(plain->halo);
}

// The output's halo: y's and x's, alike, as --halo; elsewhere, unequal or leaving no window refused by name.
TEST(ModelCard, BioimageioOutputHaloIsOneBandOfTheSpaceAxes) {
  const std::string dir = test::scratchDir("card_halo");
  const std::string y = "{type: space, id: y, size: {tensor_id: raw, axis_id: y}",
                    x = "{type: space, id: x, size: {tensor_id: raw, axis_id: x}";
  const auto card = [&](const std::string& halo_y, const std::string& halo_x) {
    std::string text = rdfText(y, y + halo_y);
    text.replace(text.find(x), x.size(), x + halo_x);
    return writeFile(dir + "/rdf.yaml", text);
  };
  EXPECT_EQ(readBioimageioRdf(card(", halo: 32", ", halo: 32")).halo, 32);
  EXPECT_EQ(readBioimageioRdf(card(", halo: 0", ", halo: 0")).halo, 0);
  const std::string unequal = configError([&] { readBioimageioRdf(card(", halo: 16", ", halo: 32")); });
  EXPECT_NE(unequal.find("outputs[0]'s halo is 16 on axis y and 32 on axis x"), std::string::npos) << unequal;
  const std::string one = configError([&] { readBioimageioRdf(card("", ", halo: 8")); });
  EXPECT_NE(one.find("halo is 0 on axis y and 8 on axis x"), std::string::npos) << one;
  // The window is 256 (min 64, step 32) at 0.5 µm/px, the output's axes (no scale: 1) 128 px: a halo of 64
  // leaves no pixel of it.
  const std::string wide = configError([&] { readBioimageioRdf(card(", halo: 64", ", halo: 64")); });
  EXPECT_NE(wide.find("outputs[0]'s halo 64 is not less than half the output window (y 128 px, x 128 px, of "
                      "the input's 256 px)"),
            std::string::npos)
      << wide;
  // A 2x upsampling model (its output axes half the input's scale): the halo is of its 128 px output window,
  // not of the 64 px input.
  std::string up = rdfText();
  for (const std::string axis : {"y", "x"}) {
    const std::string in = "{type: space, id: " + axis +
                           ", size: {min: 64, step: 32}, unit: micrometer, scale: 0.5}",
                      out = "{type: space, id: " + axis + ", size: {tensor_id: raw, axis_id: " + axis + "}}";
    up.replace(up.find(in), in.size(), "{type: space, id: " + axis + ", size: 64}");
    up.replace(up.find(out), out.size(),
               "{type: space, id: " + axis + ", size: {tensor_id: raw, axis_id: " + axis +
                   "}, scale: 0.5, halo: HALO}");
  }
  const auto upsampling = [&](const std::string& halo) {
    std::string text = up;
    for (size_t at = text.find("HALO"); at != std::string::npos; at = text.find("HALO"))
      text.replace(at, 4, halo);
    return writeFile(dir + "/up.yaml", text);
  };
  EXPECT_EQ(configError([&] { EXPECT_EQ(readBioimageioRdf(upsampling("40")).halo, 40); }), "no error");
  const std::string up_wide = configError([&] { readBioimageioRdf(upsampling("64")); });
  EXPECT_NE(up_wide.find("halo 64 is not less than half the output window (y 128 px, x 128 px"),
            std::string::npos)
      << up_wide;
  const std::string negative = configError([&] { readBioimageioRdf(card(", halo: -2", ", halo: -2")); });
  EXPECT_NE(negative.find("halo -2 is negative"), std::string::npos) << negative;
  std::string on_channel = rdfText("channel_names: [background, blob]",
                                   "channel_names: [background, blob]\n"
                                   "        halo: 1");
  const std::string channel =
      configError([&] { readBioimageioRdf(writeFile(dir + "/ch.yaml", on_channel)); });
  EXPECT_NE(channel.find("outputs[0] axis 'channel' (channel) has halo 1"), std::string::npos) << channel;
  EXPECT_NE(channel.find("space axes y and x only"), std::string::npos) << channel;
  // The card's halo reaches --halo's target unless the flag is given.
  ModelCard halo_card;
  halo_card.halo = 32;
  int64_t halo = 0;
  auto from = applyModelCard(
      halo_card, {},
      CardTargets{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, &halo});
  EXPECT_EQ(halo, 32);
  EXPECT_EQ(from.back(), (std::pair<std::string, std::string>{"halo", "card"}));
  halo = 4;
  from = applyModelCard(
      halo_card, {"halo"},
      CardTargets{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, &halo});
  EXPECT_EQ(halo, 4);
  EXPECT_EQ(from.back(), (std::pair<std::string, std::string>{"halo", "flag"}));
  halo_card.halo = -1;
  EXPECT_NE(configError([&] { checkCardNumbers(halo_card); }).find("its output halo -1 px is negative"),
            std::string::npos);
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
  // Postprocessing over statistics: of the output or against the input, per sample only, carried through
  // affine steps from the first statistics step on.
  const std::vector<std::pair<std::string, std::vector<std::string>>> post_cases = {
      {"      - {id: scale_mean_variance}\n",
       {"outputs[0].postprocessing[0] (scale_mean_variance) has no reference_tensor"}},
      {"      - {id: scale_mean_variance, kwargs: {reference_tensor: other}}\n",
       {"reference_tensor 'other' is not the input ('raw')", "nor the output ('probs')"}},
      {"      - {id: zero_mean_unit_variance, kwargs: {mode: per_dataset}}\n",
       {"postprocessing[0] (zero_mean_unit_variance)'s mode per_dataset", "scales each image by its own"}},
      {"      - {id: scale_mean_variance, kwargs: {reference_tensor: raw, mode: per_dataset}}\n",
       {"postprocessing[0] (scale_mean_variance)'s mode per_dataset", "tiler does not have"}},
      {"      - {id: scale_mean_variance, kwargs: {reference_tensor: raw, gain: 2}}\n",
       {"(scale_mean_variance)'s kwarg 'gain' is not one tiler knows"}},
      {"      - {id: zero_mean_unit_variance}\n      - {id: clip, kwargs: {max: 1}}\n"
       "      - {id: scale_range}\n",
       {"postprocessing[2] (scale_range) after clip", "where its first statistics step is"}},
  };
  for (const auto& [post, wanted] : post_cases) {
    const std::string message = refusal(scale_id, post);
    for (const auto& fragment : wanted)
      EXPECT_NE(message.find(fragment), std::string::npos) << post << message;
  }
  // A statistics step after a sigmoid of each window's is of the blended sigmoid's values: read.
  const std::string path = writeFile(
      dir + "/ok.yaml",
      rdfWithSteps(scale_id,
                   "      - {id: sigmoid}\n      - {id: clip, kwargs: {min: 0.1}}\n"
                   "      - {id: scale_mean_variance, kwargs: {reference_tensor: raw, axes: [y, x]}}\n"
                   "      - {id: scale_range, kwargs: {reference_tensor: probs}}\n"));
  const ModelCard card = readBioimageioRdf(path);
  EXPECT_EQ(stepNames(card.postprocessing), "clip, scale_mean_variance, scale_range");
  EXPECT_TRUE(card.postprocessing[1].reference_input);
  EXPECT_TRUE(card.postprocessing[1].per_channel);
  EXPECT_FALSE(card.postprocessing[2].reference_input);
  EXPECT_EQ(stepNames(splitAtStatistics(card.postprocessing).first), "clip");
  EXPECT_TRUE(readsInputStatistics(card.postprocessing));
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
  // The version before anything else: a 0.3 card has no type.
  const std::string old_card = refusal("type: model\nformat_version: 0.5.4", "format_version: 0.3.2");
  EXPECT_NE(old_card.find("rdf.yaml': format_version '0.3.2'; tiler reads spec 0.4 and 0.5"),
            std::string::npos)
      << old_card;
  EXPECT_NE(old_card.find("bioimageio update-format"), std::string::npos) << old_card;
  const std::string no_version = refusal("type: model\nformat_version: 0.5.4", "type: model");
  EXPECT_NE(no_version.find("rdf.yaml': no format_version"), std::string::npos) << no_version;
  // A 0.5 card labelled 0.4 is read as 0.4, whose tensors have names, not ids.
  const std::string version = refusal("format_version: 0.5.4", "format_version: 0.4.10");
  EXPECT_NE(version.find("inputs[0] field 'id' is not one tiler knows (spec 0.4)"), std::string::npos)
      << version;
  // A state dict and no TorchScript weights: the one command that converts it.
  const std::string state_dict = refusal("  torchscript: {source: weights.pt, pytorch_version: \"1.13\"}\n",
                                         "  pytorch_state_dict: {source: w.pth, architecture: {source: a.py, "
                                         "callable: Net}}\n");
  EXPECT_NE(state_dict.find("weights has pytorch_state_dict, onnx only"), std::string::npos) << state_dict;
  EXPECT_NE(state_dict.find("scripts/export_model.py --card " + dir + "/rdf.yaml"), std::string::npos)
      << state_dict;
  const std::string unknown = refusal("license: MIT", "license: MIT\ntiling: {halo: 8}");
  EXPECT_NE(unknown.find("field 'tiling' is not one tiler knows"), std::string::npos) << unknown;
  const std::string url = refusal("source: weights.pt", "source: https://zenodo.org/weights.pt");
  EXPECT_NE(url.find("weights.torchscript.source is a URL"), std::string::npos) << url;
  const std::string yaml = refusal("inputs:", "inputs: [");
  EXPECT_NE(yaml.find("rdf.yaml': not a YAML model description"), std::string::npos) << yaml;
  fs::create_directories(dir + "/empty");
  EXPECT_NE(configError([&] { findModelCard(dir + "/empty"); }).find("without rdf.yaml"), std::string::npos);
}

namespace {

// A 0.4 description and its 0.5 twin as bioimageio.spec's converter writes it (channel names channel0...,
// an output size that refers to the input's, the halo on the space axes); SHA replaced by the weights'
// digest.
const char* kRdf04 = R"(format_version: 0.4.10
type: model
name: two-class blobs
description: a test package
authors: [{name: tiler tests}]
license: MIT
documentation: README.md
timestamp: 2024-01-01T00:00:00Z
download_url: https://example.com/
inputs:
  - name: raw
    axes: bcyx
    data_type: float32
    data_range: [-.inf, .inf]
    shape: {min: [1, 3, 64, 64], step: [0, 0, 32, 32]}
    preprocessing:
      - name: scale_linear
        kwargs: {axes: yx, gain: 0.00392156862745098, offset: 0.0}
      - name: zero_mean_unit_variance
        kwargs: {mode: fixed, axes: yx, mean: [0.5, 0.25, 0.5], std: [0.5, 0.25, 1.0]}
outputs:
  - name: probs
    axes: bcyx
    data_type: float32
    data_range: [0, 1]
    halo: [0, 0, 8, 8]
    shape: {reference_tensor: raw, scale: [1, 0, 1, 1], offset: [0, 1, 0, 0]}
    postprocessing:
      - name: sigmoid
test_inputs: [test_input.npy]
test_outputs: [test_output.npy]
sample_inputs: [sample_input.png]
weights:
  torchscript: {source: weights.pt, sha256: SHA}
  pytorch_state_dict:
    source: weights.pth
    architecture: unet.py:UNet
    architecture_sha256: 3aeda0ace2e9a595025fa103a3eae2fd620a95924b3fba00ff5d4451acf4ad53
    kwargs: {in_channels: 3}
    dependencies: conda:environment.yaml
)";

const char* kRdf05Twin = R"(format_version: 0.5.4
type: model
name: two-class blobs
description: a test package
authors: [{name: tiler tests}]
license: MIT
documentation: README.md
timestamp: 2024-01-01T00:00:00Z
inputs:
  - id: raw
    axes:
      - type: batch
      - type: channel
        channel_names: [channel0, channel1, channel2]
      - {type: space, id: y, size: {min: 64, step: 32}}
      - {type: space, id: x, size: {min: 64, step: 32}}
    test_tensor: {source: test_input.npy}
    data: {type: float32, range: [-.inf, .inf]}
    preprocessing:
      - id: scale_linear
        kwargs: {axis: channel, gain: 0.00392156862745098, offset: 0.0}
      - id: fixed_zero_mean_unit_variance
        kwargs: {axis: channel, mean: [0.5, 0.25, 0.5], std: [0.5, 0.25, 1.0]}
outputs:
  - id: probs
    axes:
      - type: batch
      - type: channel
        channel_names: [channel0, channel1]
      - {type: space, id: y, size: {tensor_id: raw, axis_id: y}, halo: 8}
      - {type: space, id: x, size: {tensor_id: raw, axis_id: x}, halo: 8}
    test_tensor: {source: test_output.npy}
    data: {type: float32, range: [0, 1]}
    postprocessing:
      - id: sigmoid
weights:
  torchscript: {source: weights.pt, sha256: SHA}
  pytorch_state_dict:
    source: weights.pth
    architecture:
      source: unet.py
      callable: UNet
      sha256: 3aeda0ace2e9a595025fa103a3eae2fd620a95924b3fba00ff5d4451acf4ad53
      kwargs: {in_channels: 3}
    dependencies: {source: environment.yaml}
)";

std::string withSha(std::string text, const std::string& sha) {
  for (size_t at = text.find("SHA"); at != std::string::npos; at = text.find("SHA", at))
    text.replace(at, 3, sha);
  return text;
}

// A YAML node as text with its mappings' keys sorted: two descriptions compare field by field.
std::string canonical(const YAML::Node& node) {
  if (!node) return "~";
  if (node.IsScalar()) return node.Scalar();
  std::string out;
  if (node.IsSequence()) {
    for (const auto& item : node) out += (out.empty() ? "" : ", ") + canonical(item);
    return "[" + out + "]";
  }
  std::map<std::string, std::string> sorted;
  for (const auto& kv : node) sorted[kv.first.as<std::string>()] = canonical(kv.second);
  for (const auto& [key, value] : sorted) out += (out.empty() ? "" : ", ") + key + ": " + value;
  return "{" + out + "}";
}

void expectSameCard(const ModelCard& a, const ModelCard& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.mpp, b.mpp);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.mean, b.mean);
  EXPECT_EQ(a.std, b.std);
  EXPECT_EQ(a.classes, b.classes);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.task, b.task);
  EXPECT_EQ(a.test_input, b.test_input);
  EXPECT_EQ(a.test_output, b.test_output);
  EXPECT_EQ(a.tolerance.relative, b.tolerance.relative);
  EXPECT_EQ(a.tolerance.absolute, b.tolerance.absolute);
  EXPECT_EQ(a.tolerance.mismatched_per_million, b.tolerance.mismatched_per_million);
}

// A zip of `dir`'s files (under `top`/ when given), written by Python's zipfile; `extra`: more members, as
// (Python name expression, Python bytes expression).
std::string zipPackage(const std::string& dir, const std::string& zip, const std::string& top = "",
                       const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  std::string script =
      "import zipfile, os, sys\nz = zipfile.ZipFile(sys.argv[2], 'w', zipfile.ZIP_DEFLATED)\n"
      "for f in sorted(os.listdir(sys.argv[1])):\n"
      "    z.write(os.path.join(sys.argv[1], f), '" +
      (top.empty() ? "" : top + "/") + "' + f)\n";
  for (const auto& [name, bytes] : extra) script += "z.writestr(" + name + ", " + bytes + ")\n";
  script += "z.close()\n";
  writeFile(zip + ".py", script);
  const auto r = test::runCommand("/usr/bin/python3 " + zip + ".py " + dir + " " + zip + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.output;
  return zip;
}

}  // namespace

TEST(ModelCard, Bioimageio04CardIsReadAsIts05Twin) {
  const std::string dir = test::scratchDir("card_04");
  writeFile(dir + "/weights.pt", "weights");
  writeFile(dir + "/test_input.npy", "in");
  writeFile(dir + "/test_output.npy", "out");
  const std::string sha = sha256Hex("weights");
  const ModelCard old_card = readBioimageioRdf(writeFile(dir + "/v04.yaml", withSha(kRdf04, sha)));
  const ModelCard twin = readBioimageioRdf(writeFile(dir + "/v05.yaml", withSha(kRdf05Twin, sha)));
  expectSameCard(old_card, twin);
  EXPECT_EQ(*old_card.window, "256");
  EXPECT_EQ(*old_card.activation, "sigmoid");
  EXPECT_EQ(*old_card.classes, "channel0,channel1");
  EXPECT_EQ(old_card.test_input, dir + "/test_input.npy");
  // Field by field, as YAML: tensors, steps, halo and weights in 0.5's shape; what 0.5 lacks is gone.
  const YAML::Node converted = YAML::Load(bioimageioAs05(dir + "/v04.yaml")),
                   expected = YAML::Load(withSha(kRdf05Twin, sha));
  for (const char* field : {"inputs", "outputs", "weights", "name", "documentation", "authors"})
    EXPECT_EQ(canonical(converted[field]), canonical(expected[field])) << field;
  for (const char* gone : {"test_inputs", "test_outputs", "sample_inputs", "download_url"})
    EXPECT_FALSE(converted[gone]) << gone;
  EXPECT_EQ(converted["format_version"].as<std::string>().substr(0, 4), "0.5.");
}

// The spec's own example unet2d_nuclei_broad, 0.4.9 as shipped, converted: what bioimageio.spec's converter
// wrote into its 0.5 twin for the tensors' sizes, halo, steps and weights.
TEST(ModelCard, TheSpecsNucleiExampleConvertsAsTheSpecConvertsIt) {
  const std::string data = std::string(TILER_TEST_SOURCE_DIR) + "/tests/data/bioimageio/";
  const YAML::Node v04 = YAML::Load(bioimageioAs05(data + "unet2d_nuclei_broad_v0_4_9.yaml")),
                   v05 = YAML::LoadFile(data + "unet2d_nuclei_broad_v0_5.yaml");
  const YAML::Node in = v04["inputs"][0], out = v04["outputs"][0];
  EXPECT_EQ(in["id"].as<std::string>(), "raw");
  EXPECT_EQ(canonical(in["axes"][2]), "{id: y, size: 512, type: space}");
  EXPECT_EQ(canonical(in["axes"][3]), "{id: x, size: 512, type: space}");
  EXPECT_EQ(in["axes"][1]["channel_names"].size(), 1u);
  // zero_mean_unit_variance per sample over y and x: 0.5's step of that name, its axes as ids, no mode.
  EXPECT_EQ(canonical(in["preprocessing"][0]), "{id: zero_mean_unit_variance, kwargs: {axes: [y, x]}}");
  EXPECT_EQ(canonical(in["test_tensor"]), "{source: test_input.npy}");
  EXPECT_EQ(canonical(out["axes"][2]), canonical(v05["outputs"][0]["axes"][2]));
  EXPECT_EQ(canonical(out["axes"][3]), "{halo: 32, id: x, size: {axis_id: x, tensor_id: raw}, type: space}");
  EXPECT_EQ(out["axes"][2]["halo"].as<int>(), 32);
  EXPECT_EQ(out["axes"][1]["channel_names"].size(), 1u);  // scale 0, offset 0.5: one channel
  EXPECT_EQ(canonical(out["postprocessing"]), "[{id: sigmoid}]");
  EXPECT_EQ(canonical(out["test_tensor"]), "{source: test_output.npy}");
  EXPECT_EQ(canonical(v04["weights"]["torchscript"]["source"]), "weights.pt");
  EXPECT_EQ(canonical(v04["weights"]["torchscript"]["sha256"]),
            canonical(v05["weights"]["torchscript"]["sha256"]));
  const YAML::Node arch = v04["weights"]["pytorch_state_dict"]["architecture"],
                   arch05 = v05["weights"]["pytorch_state_dict"]["architecture"];
  for (const char* field : {"source", "callable", "sha256", "kwargs"})
    EXPECT_EQ(canonical(arch[field]), canonical(arch05[field])) << field;
}

// Each 0.4 step tiler's steps know comes out in its 0.5 form (the spec's changelog and converter).
TEST(ModelCard, Bioimageio04StepsComeOutInTheir05Form) {
  const std::string dir = test::scratchDir("card_04_steps");
  std::string text = kRdf04;
  const std::string steps = R"(    preprocessing:
      - {name: zero_mean_unit_variance, kwargs: {mode: per_dataset, axes: xy, eps: 1.0e-5}}
      - {name: zero_mean_unit_variance, kwargs: {mode: fixed, axes: cyx, mean: 0.5, std: 0.2}}
      - {name: scale_range, kwargs: {mode: per_sample, axes: yx, min_percentile: 1, max_percentile: 99.8}}
      - {name: clip, kwargs: {min: 0, max: 1}}
      - {name: scale_linear, kwargs: {gain: 2, offset: 1}}
)";
  text.replace(text.find("    preprocessing:"), text.find("outputs:") - text.find("    preprocessing:"),
               steps);
  text.replace(
      text.find("      - name: sigmoid"), std::string("      - name: sigmoid").size(),
      "      - {name: binarize, kwargs: {threshold: 0.5}}\n"
      "      - {name: scale_mean_variance, kwargs: {mode: per_sample, reference_tensor: raw, axes: yx}}");
  const YAML::Node rdf = YAML::Load(bioimageioAs05(writeFile(dir + "/rdf.yaml", text)));
  const YAML::Node pre = rdf["inputs"][0]["preprocessing"], post = rdf["outputs"][0]["postprocessing"];
  EXPECT_EQ(canonical(pre[0]),
            "{id: zero_mean_unit_variance, kwargs: {axes: [x, y], eps: 1.0e-5, mode: per_dataset}}");
  EXPECT_EQ(canonical(pre[1]), "{id: fixed_zero_mean_unit_variance, kwargs: {mean: 0.5, std: 0.2}}");
  EXPECT_EQ(canonical(pre[2]),
            "{id: scale_range, kwargs: {axes: [y, x], max_percentile: 99.8, min_percentile: 1}}");
  EXPECT_EQ(canonical(pre[3]), "{id: clip, kwargs: {max: 1, min: 0}}");
  EXPECT_EQ(canonical(pre[4]), "{id: scale_linear, kwargs: {gain: 2, offset: 1}}");
  EXPECT_EQ(canonical(post[0]), "{id: binarize, kwargs: {threshold: 0.5}}");
  EXPECT_EQ(canonical(post[1]), "{id: scale_mean_variance, kwargs: {axes: [y, x], reference_tensor: raw}}");
  // scale_mean_variance's per_dataset is kept for the reader to refuse by name.
  std::string dataset = text;
  dataset.replace(dataset.find("mode: per_sample, reference_tensor"), std::string("mode: per_sample").size(),
                  "mode: per_dataset");
  EXPECT_EQ(canonical(YAML::Load(
                bioimageioAs05(writeFile(dir + "/smv.yaml", dataset)))["outputs"][0]["postprocessing"][1]),
            "{id: scale_mean_variance, kwargs: {axes: [y, x], mode: per_dataset, reference_tensor: raw}}");
  // A 0.4 zero_mean_unit_variance without a mode is of mode fixed (0.4's default): the card's numbers.
  text = kRdf04;
  text.replace(
      text.find("    preprocessing:"), text.find("outputs:") - text.find("    preprocessing:"),
      "    preprocessing:\n      - {name: zero_mean_unit_variance, kwargs: {axes: xy, mean: 0.5, std: "
      "0.2}}\n");
  const YAML::Node fixed = YAML::Load(bioimageioAs05(writeFile(dir + "/fixed.yaml", text)));
  EXPECT_EQ(canonical(fixed["inputs"][0]["preprocessing"][0]),
            "{id: fixed_zero_mean_unit_variance, kwargs: {axis: channel, mean: 0.5, std: 0.2}}");
  text.replace(text.find(", mean: 0.5"), std::string(", mean: 0.5").size(), "");
  const std::string no_mean = configError([&] { bioimageioAs05(writeFile(dir + "/no_mean.yaml", text)); });
  EXPECT_NE(no_mean.find("of mode fixed (0.4's default) gives no mean"), std::string::npos) << no_mean;
  // per_dataset (of either statistics step) is refused when the card is read, not run on each image's own.
  const std::string per_dataset = configError([&] { readBioimageioRdf(dir + "/rdf.yaml"); });
  EXPECT_NE(per_dataset.find("mode per_dataset"), std::string::npos) << per_dataset;
}

TEST(ModelCard, Bioimageio04FieldsThatChangeHowTheModelIsFedAreRefusedByName) {
  const std::string dir = test::scratchDir("card_04_bad");
  auto refusal = [&](const std::string& from, const std::string& to) {
    std::string text = kRdf04;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    const std::string path = writeFile(dir + "/rdf.yaml", text);
    return configError([&] { bioimageioAs05(path); });
  };
  const std::string field = refusal("license: MIT", "license: MIT\ntiling: true");
  EXPECT_NE(field.find("rdf.yaml': field 'tiling' is not one tiler knows (spec 0.4)"), std::string::npos)
      << field;
  const std::string tests = refusal("test_inputs: [test_input.npy]", "test_inputs: []");
  EXPECT_NE(tests.find("test_inputs must name one .npy file per tensor of inputs"), std::string::npos)
      << tests;
  const std::string halo = refusal("halo: [0, 0, 8, 8]", "halo: [0, 2, 8, 8]");
  EXPECT_NE(halo.find("outputs[0].halo gives the channel axis a halo of 2"), std::string::npos) << halo;
  const std::string step = refusal("step: [0, 0, 32, 32]", "step: [0, 1, 32, 32]");
  EXPECT_NE(step.find("inputs[0].shape.step gives the channel axis a step"), std::string::npos) << step;
  const std::string letter = refusal("axes: bcyx\n    data_type: float32\n    data_range: [-.inf",
                                     "axes: bqyx\n    data_type: float32\n    data_range: [-.inf");
  EXPECT_NE(letter.find("inputs[0].axes 'bqyx': 'q' is not an axis of spec 0.4"), std::string::npos)
      << letter;
  const std::string ref = refusal("reference_tensor: raw, scale: [1, 0, 1, 1]",
                                  "reference_tensor: raw, "
                                  "scale: [1, 1, 1, 1]");
  EXPECT_EQ(ref, "no error");  // the channel count from the input's: 3 + 2 * 1
  // A null scale: a new axis of 2 x offset (the spec's expand_output_shape example).
  std::string expanded = kRdf04;
  expanded.replace(expanded.find("scale: [1, 0, 1, 1], offset: [0, 1, 0, 0]"), 41,
                   "scale: [1, 0, null, 1], offset: [0, 1, 0.5, 0]");
  const YAML::Node new_axis = YAML::Load(bioimageioAs05(writeFile(dir + "/null.yaml", expanded)));
  EXPECT_EQ(canonical(new_axis["outputs"][0]["axes"][2]), "{halo: 8, id: y, size: 1, type: space}");
  const std::string shape =
      refusal("shape: {reference_tensor: raw, scale: [1, 0, 1, 1], offset: [0, 1, 0, 0]}",
              "shape: {min: [1, 2, 64, 64], step: [0, 0, 1, 1]}");
  EXPECT_NE(shape.find("outputs[0].shape is neither a list of sizes nor {reference_tensor, scale, offset}"),
            std::string::npos)
      << shape;
  // A 0.4 z axis converts; the reader then refuses the layout by name.
  std::string text = withSha(kRdf04, std::string(64, '0'));
  text.replace(text.find("axes: bcyx"), 10, "axes: bczyx");
  const std::string shape04 = "{min: [1, 3, 64, 64], step: [0, 0, 32, 32]}";
  text.replace(text.find(shape04), shape04.size(), "[1, 3, 8, 64, 64]");
  // Per-channel values along the one axis a step's axes leave; two left is no axis.
  const std::string two_left = configError([&] { readBioimageioRdf(writeFile(dir + "/z/rdf.yaml", text)); });
  EXPECT_NE(
      two_left.find("inputs[0].preprocessing[0].kwargs.axes 'yx' of tensor axes 'bczyx' leaves axes 'cz'"),
      std::string::npos)
      << two_left;
  for (size_t at = text.find("axes: yx,"); at != std::string::npos; at = text.find("axes: yx,"))
    text.replace(at, 9, "axes: zyx,");
  const std::string z = configError([&] { readBioimageioRdf(writeFile(dir + "/z/rdf.yaml", text)); });
  EXPECT_NE(z.find("inputs[0].axes are batch,channel,z,y,x"), std::string::npos) << z;
}

TEST(ModelCard, CardSha256IsCheckedNamingTheFile) {
  const std::string dir = test::scratchDir("card_sha");
  writeFile(dir + "/weights.pt", "weights");
  writeFile(dir + "/test_input.npy", "in");
  writeFile(dir + "/test_output.npy", "out");
  const std::string good = sha256Hex("weights"), bad = sha256Hex("other weights");
  EXPECT_EQ(configError([&] { readBioimageioRdf(writeFile(dir + "/ok.yaml", withSha(kRdf05Twin, good))); }),
            "no error");
  // The weights' digest is the loader's to check, on the bytes it loads (the card is read without them).
  std::string upper = bad;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](char c) { return std::toupper(c); });
  const ModelCard card = readBioimageioRdf(writeFile(dir + "/bad.yaml", withSha(kRdf05Twin, upper)));
  EXPECT_EQ(card.weights_sha256, bad);
  const std::string mismatch =
      configError([&] { loadTorchScript(card.weights, torch::kCPU, card.weights_sha256, card.path); });
  EXPECT_NE(mismatch.find("'" + dir + "/weights.pt': its sha256 is " + good +
                          ", the card's "
                          "weights.torchscript.sha256 is " +
                          bad + " ('" + dir + "/bad.yaml')"),
            std::string::npos)
      << mismatch;
  // A test tensor's digest too, and a digest that is no digest.
  std::string text = withSha(kRdf05Twin, good);
  text.replace(text.find("{source: test_output.npy}"), 25, "{source: test_output.npy, sha256: " + bad + "}");
  const std::string tensor = configError([&] { readBioimageioRdf(writeFile(dir + "/tensor.yaml", text)); });
  EXPECT_NE(tensor.find("test_output.npy': its sha256 is " + sha256Hex("out") +
                        ", the card's outputs[0].test_tensor.sha256 is " + bad),
            std::string::npos)
      << tensor;
  const std::string short_sha =
      configError([&] { readBioimageioRdf(writeFile(dir + "/short.yaml", withSha(kRdf05Twin, "abc"))); });
  EXPECT_NE(short_sha.find("weights.torchscript.sha256 'abc' is not a SHA-256 digest"), std::string::npos)
      << short_sha;
}

TEST(ModelCard, ZippedPackagesAreReadInPlaceAndMembersStayInside) {
  const std::string dir = test::scratchDir("card_zip");
  writeFile(dir + "/pkg/weights.pt", "weights");
  writeFile(dir + "/pkg/test_input.npy", "in");
  writeFile(dir + "/pkg/test_output.npy", "out");
  writeFile(dir + "/pkg/rdf.yaml", withSha(kRdf04, sha256Hex("weights")));
  const std::string zip = zipPackage(dir + "/pkg", dir + "/pkg.zip");
  const auto card = findModelCard(zip);
  ASSERT_TRUE(card);
  EXPECT_EQ(card->path, zip + "!/rdf.yaml");
  EXPECT_EQ(card->weights, zip + "!/weights.pt");
  EXPECT_EQ(card->test_input, zip + "!/test_input.npy");
  ModelCard from_dir = readBioimageioRdf(dir + "/pkg/rdf.yaml");
  from_dir.weights = card->weights, from_dir.test_input = card->test_input,
  from_dir.test_output = card->test_output;
  expectSameCard(*card, from_dir);
  // In one top folder, as a zip of the package's directory holds it.
  const std::string top = zipPackage(dir + "/pkg", dir + "/top.ZIP", "unet");
  EXPECT_EQ(findModelCard(top)->weights, top + "!/unet/weights.pt");
  // A member the card names that is not in the archive, one outside it, an archive member outside it.
  fs::create_directories(dir + "/bare");
  writeFile(dir + "/bare/test_input.npy", "in");
  writeFile(dir + "/bare/test_output.npy", "out");
  writeFile(dir + "/bare/rdf.yaml", withSha(kRdf04, sha256Hex("weights")));
  const std::string no_weights =
      configError([&] { findModelCard(zipPackage(dir + "/bare", dir + "/bare.zip")); });
  EXPECT_NE(
      no_weights.find("bare.zip': weights.torchscript.source 'weights.pt': member 'weights.pt' is not in "
                      "the archive"),
      std::string::npos)
      << no_weights;
  std::string escaping = withSha(kRdf04, sha256Hex("weights"));
  escaping.replace(escaping.find("source: weights.pt"), 18, "source: ../x");
  writeFile(dir + "/esc/rdf.yaml", escaping);
  writeFile(dir + "/esc/test_input.npy", "in");
  writeFile(dir + "/esc/test_output.npy", "out");
  const std::string outside = configError([&] { findModelCard(zipPackage(dir + "/esc", dir + "/esc.zip")); });
  EXPECT_NE(outside.find("weights.torchscript.source '../x' lies outside the package"), std::string::npos)
      << outside;
  const std::string member = configError([&] {
    findModelCard(zipPackage(dir + "/pkg", dir + "/member.zip", "", {{"'../x'", "b'x'"}}));
  });
  EXPECT_NE(member.find("member.zip': member '../x' names a path outside the archive"), std::string::npos)
      << member;
  // A corrupt archive; an archive without a card; weights whose digest is not the card's.
  writeFile(dir + "/corrupt.zip", "PK\x03\x04 not really");
  const std::string corrupt = configError([&] { findModelCard(dir + "/corrupt.zip"); });
  EXPECT_NE(corrupt.find("corrupt.zip': not a zip archive, or a corrupt one"), std::string::npos) << corrupt;
  fs::remove(dir + "/bare/rdf.yaml");
  const std::string no_card =
      configError([&] { findModelCard(zipPackage(dir + "/bare", dir + "/nocard.zip")); });
  EXPECT_NE(no_card.find("nocard.zip': no rdf.yaml or bioimageio.yaml"), std::string::npos) << no_card;
  writeFile(dir + "/pkg/weights.pt", "altered");
  const auto altered_card = findModelCard(zipPackage(dir + "/pkg", dir + "/altered.zip"));
  ASSERT_TRUE(altered_card);
  const std::string altered = configError([&] {
    loadTorchScript(altered_card->weights, torch::kCPU, altered_card->weights_sha256, altered_card->path);
  });
  EXPECT_NE(altered.find("altered.zip!/weights.pt': its sha256 is " + sha256Hex("altered")),
            std::string::npos)
      << altered;
  // A state dict alone: the command names the zip.
  std::string state_dict = kRdf04;
  state_dict.replace(state_dict.find("  torchscript: {source: weights.pt, sha256: SHA}\n"), 49, "");
  writeFile(dir + "/sd/rdf.yaml", state_dict);
  writeFile(dir + "/sd/test_input.npy", "in");
  writeFile(dir + "/sd/test_output.npy", "out");
  const std::string sd_zip = zipPackage(dir + "/sd", dir + "/sd.zip");
  const std::string sd = configError([&] { findModelCard(sd_zip); });
  EXPECT_NE(sd.find("weights has pytorch_state_dict only; tiler runs torchscript weights: convert the "
                    "pytorch_state_dict with scripts/export_model.py --card " +
                    sd_zip),
            std::string::npos)
      << sd;
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
      {"window", "card"},     {"mpp", "flag"},     {"scale", "default"},
      {"mean", "card"},       {"std", "default"},  {"classes", "default"},
      {"activation", "card"}, {"task", "default"}, {"halo", "default"}};
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
  const nlohmann::json from = {{"window", "card"},     {"mpp", "card"},  {"scale", "default"},
                               {"mean", "card"},       {"std", "card"},  {"classes", "card"},
                               {"activation", "card"}, {"task", "card"}, {"halo", "default"}};
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

// The start of the packages' make.py: a small TorchScript segmentation net (3 -> 2 channels), seeded, saved
// as weights.pt into the directory argv[1] names (`d`), as `net`.
constexpr const char* kTinyNetScript = R"(import sys, torch, numpy as np
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
)";

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
  writeFile(dir + "/make.py", std::string(kTinyNetScript) + R"(x = torch.rand(1, 3, 64, 64) * 255
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

// Each window's probabilities of the largest difference from `whole`'s, relative to 1 or the value: the
// stitched map against a forward of the whole image.
double largestDifference(const std::string& probs, const std::string& whole) {
  const auto a = ImageReader::open(probs), b = ImageReader::open(whole);
  EXPECT_EQ(a->info().width, b->info().width);
  EXPECT_EQ(a->info().height, b->info().height);
  const cv::Mat x = a->readRegion({0, 0, a->info().width, a->info().height}),
                y = b->readRegion({0, 0, b->info().width, b->info().height});
  double worst = 0;
  for (int r = 0; r < x.rows; ++r)
    for (int i = 0; i < x.cols * x.channels(); ++i) {
      const double want = y.ptr<float>(r)[i];
      worst = std::max(worst, std::abs(x.ptr<float>(r)[i] - want) / std::max(1.0, std::abs(want)));
    }
  return worst;
}

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
  writeFile(
      dir + "/make.py", std::string(kTinyNetScript) + R"(raw = (torch.rand(1, 3, 64, 64) ** 2 * 255).numpy()
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

// A model whose outer 12 px of every window are garbage (+100) and exact inside, as bioimage.io's `halo`
// describes one: with the halo given, by the card or by --halo, the stitched map is the whole image's forward
// in every blend mode (the overlap raised to twice the halo), on the host and on the device alike; without
// it, it is not. An --overlap too small for it, or a halo for a model of one vector a window, is refused.
TEST(ModelCard, AnOutputHaloIsNeverBlendedAndTheMapIsTheWholeImagesForward) {
  const std::string root = test::scratchDir("card_halo_run");
  const char* env = std::getenv("TILER_PYTHON");
  const std::string python = env && *env ? env : "/usr/bin/python3";
  if (test::runCommand(python + " -c 'import torch'").code != 0) GTEST_SKIP() << python << " has no PyTorch";
  writeFile(root + "/make.py", R"(import sys, torch
class Band(torch.nn.Module):
    def forward(self, x):
        y = torch.cat([x[:, 0:1] * 0.01, 1.0 - x[:, 1:2] * 0.01], 1)
        band = torch.ones_like(y) * 100.0
        band[:, :, 12:y.shape[2] - 12, 12:y.shape[3] - 12] = 0.0
        return y + band
torch.jit.script(Band()).save(sys.argv[1])
)");
  fs::create_directories(root + "/pkg");
  const auto made = test::runCommand(python + " " + root + "/make.py " + root + "/pkg/weights.pt");
  ASSERT_EQ(made.code, 0) << made.output;
  // The card: 64 px windows, raw values, no activation, the output's halo 12 on y and x.
  std::string rdf = rdfText();
  rdf.replace(rdf.find("    preprocessing:"), rdf.find("outputs:") - rdf.find("    preprocessing:"), "");
  rdf.replace(rdf.find("    postprocessing:"), rdf.find("weights:") - rdf.find("    postprocessing:"), "");
  rdf.replace(rdf.find("  onnx:"), std::string::npos, "");
  for (const std::string axis : {"y", "x"}) {
    const std::string in = "{type: space, id: " + axis +
                           ", size: {min: 64, step: 32}, unit: micrometer, scale: 0.5}",
                      out = "{type: space, id: " + axis + ", size: {tensor_id: raw, axis_id: " + axis + "}}";
    rdf.replace(rdf.find(in), in.size(), "{type: space, id: " + axis + ", size: 64}");
    rdf.replace(rdf.find(out), out.size(),
                "{type: space, id: " + axis + ", size: {tensor_id: raw, axis_id: " + axis + "}, halo: 12}");
  }
  writeFile(root + "/pkg/rdf.yaml", rdf);
  const std::string image = kSamples + "/images/small.png";  // 200 x 150
  const auto tiler = [&](const std::string& model, const std::string& out, const std::string& flags) {
    return test::runCommand(kTiler + " -m " + model + " -i " + image + " -o " + root + "/" + out +
                            " --save labels,probs --threads 1 --no_progress " + flags);
  };
  const std::string pkg = root + "/pkg", weights = root + "/pkg/weights.pt";
  // The whole image's forward: one window of its size, through the card and without it.
  for (const auto& [model, out] : {std::pair{pkg, "whole_card"}, std::pair{weights, "whole"}}) {
    const auto whole = tiler(model, out, "--window 200,150");
    ASSERT_EQ(whole.code, 0) << whole.output;
  }
  const auto card = tiler(pkg, "card", "");
  ASSERT_EQ(card.code, 0) << card.output;
  EXPECT_NE(card.output.find("the overlap along x raised from 0.25 to 0.375 (24 px, twice the halo)"),
            std::string::npos)
      << card.output;
  EXPECT_LE(largestDifference(root + "/card/small_probs.tif", root + "/whole_card/small_probs.tif"), 1e-6);
  const auto report = reportOf(root + "/card");
  EXPECT_EQ(report["halo"], 12);
  EXPECT_EQ(report["settings_from"]["halo"], "card");
  EXPECT_EQ(report["window"], nlohmann::json({64, 64}));
  // --halo 0 over the card's: the garbage between windows is blended in, and the report says the flag's.
  const auto none = tiler(pkg, "card_none", "--halo 0");
  ASSERT_EQ(none.code, 0) << none.output;
  EXPECT_GT(largestDifference(root + "/card_none/small_probs.tif", root + "/whole_card/small_probs.tif"),
            1.0);
  EXPECT_EQ(reportOf(root + "/card_none")["settings_from"]["halo"], "flag");
  EXPECT_EQ(reportOf(root + "/card_none")["halo"], 0);
  // By flag, without a card, in every blend mode; the device stitcher writes the host's bytes.
  for (const std::string blend : {"gaussian", "constant", "crop"}) {
    const auto host = tiler(weights, "flag_" + blend, "--window 64 --halo 12 --blend " + blend);
    ASSERT_EQ(host.code, 0) << host.output;
    EXPECT_LE(
        largestDifference(root + "/flag_" + blend + "/small_probs.tif", root + "/whole/small_probs.tif"),
        1e-6)
        << blend;
    EXPECT_EQ(reportOf(root + "/flag_" + blend)["halo"], 12);
    const auto device =
        tiler(weights, "device_" + blend, "--window 64 --halo 12 --stitch device --blend " + blend);
    ASSERT_EQ(device.code, 0) << device.output;
    EXPECT_EQ(reportOf(root + "/device_" + blend)["stitch"], "device");
    for (const std::string file : {"small_probs.tif", "small_labels.tif"})
      EXPECT_TRUE(test::slurp(root + "/device_" + blend + "/" + file) ==
                  test::slurp(root + "/flag_" + blend + "/" + file))
          << blend << " " << file;
  }
  const auto plain = tiler(weights, "plain", "--window 64");
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_GT(largestDifference(root + "/plain/small_probs.tif", root + "/whole/small_probs.tif"), 1.0);
  EXPECT_EQ(reportOf(root + "/plain")["halo"], 0);
  // An --overlap that shares less than twice the halo, by flag and by the card (named as the card's).
  const auto small = tiler(weights, "small", "--window 64 --halo 12 --overlap 0.25");
  EXPECT_EQ(small.code, 1) << small.output;
  EXPECT_NE(small.output.find("--overlap 0.25 gives windows 16 px of overlap along x"), std::string::npos)
      << small.output;
  EXPECT_NE(small.output.find("less than twice --halo 12 (24 px)"), std::string::npos) << small.output;
  const auto small_card = tiler(pkg, "small_card", "--overlap 0.25");
  EXPECT_EQ(small_card.code, 1) << small_card.output;
  EXPECT_NE(small_card.output.find("less than twice the model card's halo ('" + pkg + "/rdf.yaml') 12"),
            std::string::npos)
      << small_card.output;
  // Half the window, and a model of one vector a window.
  const auto wide = tiler(weights, "wide", "--window 64 --halo 32");
  EXPECT_EQ(wide.code, 1) << wide.output;
  EXPECT_NE(wide.output.find("--halo 32 is not less than half the window (64 px along x"), std::string::npos)
      << wide.output;
  const auto vector = test::runCommand(kTiler + " -m " + kSamples + "/models/classifier.pt -i " + image +
                                       " -o " + root + "/vector --threads 1 --no_progress --halo 4");
  EXPECT_EQ(vector.code, 1) << vector.output;
  EXPECT_NE(vector.output.find("--halo 4 is a band of a map window's edge"), std::string::npos)
      << vector.output;
}

// A zipped package passes check-model as its directory does and runs as -m, its weights loaded from the
// member; weights that are not the ones the card's sha256 describes stop both in one line naming the
// member.
TEST(ModelCard, AZippedPackagePassesCheckModelAsItsDirectory) {
  const std::string root = test::scratchDir("card_check_zip");
  std::string why;
  const std::string pkg = makePackage(root + "/pkg", &why);
  if (pkg.empty()) GTEST_SKIP() << why;
  std::string rdf = test::slurp(pkg + "/rdf.yaml");
  rdf.replace(
      rdf.find("source: weights.pt,"), 19,
      "source: weights.pt, sha256: " + sha256OfFileOrZipMember(pkg + "/weights.pt", int64_t(1) << 30) + ",");
  writeFile(pkg + "/rdf.yaml", rdf);
  const std::string zip = zipPackage(pkg, root + "/pkg.zip", "unet");
  const auto from_dir = test::runCommand(kTiler + " check-model " + pkg);
  const auto from_zip = test::runCommand(kTiler + " check-model " + zip);
  ASSERT_EQ(from_dir.code, 0) << from_dir.output;
  ASSERT_EQ(from_zip.code, 0) << from_zip.output;
  EXPECT_NE(from_zip.output.find("check-model: '" + zip + "!/unet/rdf.yaml': 8192 values"), std::string::npos)
      << from_zip.output;
  // The same numbers, from the same weights and tensors.
  EXPECT_EQ(from_zip.output.substr(from_zip.output.find("8192 values")),
            from_dir.output.substr(from_dir.output.find("8192 values")));
  const auto run = test::runCommand(kTiler + " -m " + zip + " -i " + kSamples +
                                    "/images/small.png --threads 1 --no_progress -o " + root + "/out");
  ASSERT_EQ(run.code, 0) << run.output;
  const auto report = reportOf(root + "/out");
  EXPECT_EQ(report["model"], zip + "!/unet/weights.pt");
  EXPECT_EQ(report["model_card"], zip + "!/unet/rdf.yaml");
  EXPECT_EQ(report["settings_from"]["activation"], "card");
  fs::copy_file(pkg + "/altered.pt", pkg + "/weights.pt", fs::copy_options::overwrite_existing);
  const std::string altered = zipPackage(pkg, root + "/altered.zip", "unet");
  const auto bad = test::runCommand(kTiler + " check-model " + altered);
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("altered.zip!/unet/weights.pt': its sha256 is "), std::string::npos)
      << bad.output;
  const auto bad_run = test::runCommand(kTiler + " -m " + altered + " -i " + kSamples +
                                        "/images/small.png --threads 1 --no_progress -o " + root + "/bad");
  EXPECT_EQ(bad_run.code, 1) << bad_run.output;
  EXPECT_NE(bad_run.output.find("sha256"), std::string::npos) << bad_run.output;
}

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
  // binarize runs on each window: a run whose windows are blended, or views averaged, is refused; with
  // --blend crop each pixel is one window's, and the map holds 0s and 1s alone.
  const std::string small =
      " -i " + kSamples + "/images/small.png --threads 1 --no_progress --save probs -o ";
  const auto blended = test::runCommand(kTiler + " -m " + binary + small + root + "/blended");
  EXPECT_EQ(blended.code, 1) << blended.output;
  EXPECT_NE(blended.output.find("binarize is applied to each window's output, which --blend gaussian blends"),
            std::string::npos)
      << blended.output;
  const auto views =
      test::runCommand(kTiler + " -m " + binary + small + root + "/views --blend crop --tta flip");
  EXPECT_EQ(views.code, 1) << views.output;
  EXPECT_NE(views.output.find("--tta flip averages over views"), std::string::npos) << views.output;
  const auto cropped = test::runCommand(kTiler + " -m " + binary + small + root + "/cropped --blend crop");
  ASSERT_EQ(cropped.code, 0) << cropped.output;
  const auto probs = ImageReader::open(root + "/cropped/small_probs.tif");
  const cv::Mat map = probs->readRegion({0, 0, probs->info().width, probs->info().height});
  for (int r = 0; r < map.rows; ++r)
    for (int i = 0; i < map.cols * map.channels(); ++i) {
      const float v = map.ptr<float>(r)[i];
      ASSERT_TRUE(v == 0.0f || v == 1.0f) << "row " << r << ": " << v;
    }
  // An image of NaN alone (a nodata band) has no statistics to normalise it by: it fails naming the file.
  const auto made = test::runCommand(
      "/usr/bin/python3 -c \"import numpy as np; from PIL import Image; "
      "Image.fromarray(np.full((80, 90), np.nan, np.float32), mode='F').save('" +
      root + "/nan.tif')\"");
  ASSERT_EQ(made.code, 0) << made.output;
  const auto nan = test::runCommand(kTiler + " -m " + affine + " -i " + root +
                                    "/nan.tif --threads 1 --no_progress -o " + root + "/nan");
  EXPECT_NE(nan.code, 0) << nan.output;
  EXPECT_NE(nan.output.find("nan.tif': the model's input channel 0 holds no number"), std::string::npos)
      << nan.output;
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

// A chain of fixed affine steps whose gain comes out negative (an inverted channel) is no --std: it is
// followed step by step, each image's affine map, and check-model matches NumPy's numbers.
TEST(ModelCard, ANegativeFixedGainIsFollowedAsItsSteps) {
  const std::string root = test::scratchDir("card_negative_gain");
  const std::string pre =
      R"(      - {id: scale_linear, kwargs: {gain: -0.01, offset: [1, 2, 0.5], axis: channel}}
      - {id: fixed_zero_mean_unit_variance, kwargs: {mean: 0.5, std: 2}}
)";
  const ModelCard card =
      readBioimageioRdf(writeFile(root + "/rdf.yaml", rdfWithSteps(pre, "      - {id: softmax}\n")));
  EXPECT_FALSE(card.mean.has_value());
  EXPECT_FALSE(card.std.has_value());
  ASSERT_EQ(card.preprocessing.size(), 2u);
  EXPECT_EQ(card.preprocessing[0].gain, std::vector<double>(3, -0.01));
  std::string why;
  const std::string pkg = makeStepsPackage(root + "/pkg", pre, "      - {id: softmax}\n",
                                           R"(x = x * -0.01 + np.array([1, 2, 0.5]).reshape(1, 3, 1, 1)
x = (x - 0.5) / (2 + 1e-6)
)",
                                           R"(e = np.exp(y - y.max(1, keepdims=True))
y = e / e.sum(1, keepdims=True)
)",
                                           &why);
  if (pkg.empty()) GTEST_SKIP() << why;
  const auto check = test::runCommand(kTiler + " check-model " + pkg);
  EXPECT_EQ(check.code, 0) << check.output;
  EXPECT_NE(check.output.find(": pass"), std::string::npos) << check.output;
  const auto run = test::runCommand(kTiler + " -m " + pkg + " -i " + kSamples +
                                    "/images/small.png --threads 1 --no_progress -o " + root + "/out");
  ASSERT_EQ(run.code, 0) << run.output;
  const auto gain = reportOf(root + "/out")["images"][0]["input_normalisation"]["gain"];
  ASSERT_EQ(gain.size(), 3u) << gain;
  // 8-bit values (/ 255 is tiler's own scale, 1 here: the card feeds raw values) times -0.01 / 2.
  EXPECT_NEAR(gain[0].get<double>(), -0.01 / (2 + 1e-6), 1e-12);
}

// A card describes one output: its postprocessing steps are refused with --heads (which would apply them to
// no head), naming the flag and the steps.
TEST(ModelCard, HeadsWithACardsPostprocessingAreRefusedByName) {
  const std::string root = test::scratchDir("card_heads");
  std::string why;
  const std::string pkg =
      makeStepsPackage(root + "/pkg", "      - {id: scale_linear, kwargs: {gain: 2}}\n",
                       R"(      - {id: sigmoid}
      - {id: scale_linear, kwargs: {gain: 2, offset: -0.5}}
      - {id: clip, kwargs: {min: 0, max: 1.2}}
)",
                       "x = x * 2\n", "y = np.clip(sigmoid(y) * 2 - 0.5, 0, 1.2)\n", &why);
  if (pkg.empty()) GTEST_SKIP() << why;
  const auto run =
      test::runCommand(kTiler + " -m " + pkg + " -i " + kSamples +
                       "/images/small.png --heads 0:segment --threads 1 --no_progress -o " + root + "/out");
  EXPECT_EQ(run.code, 1) << run.output;
  EXPECT_NE(
      run.output.find("--heads 0:segment: the model card's outputs[0].postprocessing (scale_linear, clip) "
                      "is of the card's one output"),
      std::string::npos)
      << run.output;
  // The card's one output, as it is, runs.
  const auto one = test::runCommand(kTiler + " -m " + pkg + " -i " + kSamples +
                                    "/images/small.png --threads 1 --no_progress -o " + root + "/one");
  EXPECT_EQ(one.code, 0) << one.output;
}

// A card's weights are read once, where they are loaded: hashed there and loaded from the bytes hashed (a
// file and a zip member alike), so weights replaced after the card was read are caught, never run.
TEST(ModelCard, WeightsAreHashedOnTheBytesTheyAreLoadedFrom) {
  const std::string root = test::scratchDir("card_weights_once");
  std::string why;
  const std::string pkg = makePackage(root + "/pkg", &why);
  if (pkg.empty()) GTEST_SKIP() << why;
  const std::string sha = sha256OfFileOrZipMember(pkg + "/weights.pt", int64_t(1) << 30);
  std::string rdf = test::slurp(pkg + "/rdf.yaml");
  rdf.replace(rdf.find("source: weights.pt,"), 19, "source: weights.pt, sha256: " + sha + ",");
  writeFile(pkg + "/rdf.yaml", rdf);
  const std::string zip = zipPackage(pkg, root + "/pkg.zip");
  const torch::Tensor x = torch::rand({1, 3, 64, 64});
  std::vector<torch::Tensor> outputs;
  for (const std::string& model : {pkg, zip}) {
    const auto card = findModelCard(model);
    ASSERT_TRUE(card) << model;
    EXPECT_EQ(card->weights_sha256, sha) << model;
    torch::jit::Module m = loadTorchScript(card->weights, torch::kCPU, card->weights_sha256, card->path);
    outputs.push_back(m.forward({x}).toTensor());
  }
  EXPECT_TRUE(torch::equal(outputs[0], outputs[1]));
  const auto card = findModelCard(pkg);
  ASSERT_TRUE(card);
  fs::copy_file(pkg + "/altered.pt", pkg + "/weights.pt", fs::copy_options::overwrite_existing);
  const std::string replaced =
      configError([&] { loadTorchScript(card->weights, torch::kCPU, card->weights_sha256, card->path); });
  EXPECT_NE(replaced.find("weights.pt': its sha256 is " +
                          sha256OfFileOrZipMember(pkg + "/altered.pt", int64_t(1) << 30) +
                          ", the card's weights.torchscript.sha256 is " + sha),
            std::string::npos)
      << replaced;
}

// The spec's own example as shipped (its TorchScript weights, test tensors and both cards, unchanged): each
// card passes check-model with its sha256 checked, and over a 2x2 mosaic of its test input (each quarter
// mirrored, so no window sees the same pixels twice) the default run, its statistics of the whole mosaic and
// its output halo followed, is one forward of the whole mosaic within the card's tolerance.
TEST(ModelCard, TheSpecsNucleiExampleRunsAsShippedAndItsMosaicIsOneForward) {
  const char* env = std::getenv("TILER_PYTHON");
  const std::string python = env && *env ? env : "/usr/bin/python3";
  if (test::runCommand(python + " -c 'import torch, numpy, PIL'").code != 0)
    GTEST_SKIP() << python << " has no PyTorch, NumPy or Pillow";
  const std::string root = test::scratchDir("card_nuclei"), pkg = root + "/pkg";
  const std::string data = std::string(TILER_TEST_SOURCE_DIR) + "/tests/data/bioimageio/";
  fs::create_directories(pkg);
  for (const char* file : {"weights.pt", "test_input.npy", "test_output.npy"})
    fs::copy_file(data + "unet2d_nuclei_broad/" + file, pkg + "/" + file);
  fs::copy_file(data + "unet2d_nuclei_broad_v0_5.yaml", pkg + "/bioimageio.yaml");
  fs::copy_file(data + "unet2d_nuclei_broad_v0_4_9.yaml", pkg + "/v0_4_9.bioimageio.yaml");
  for (const std::string& card : {pkg, pkg + "/v0_4_9.bioimageio.yaml"}) {
    const auto checked = test::runCommand(kTiler + " check-model " + card);
    EXPECT_EQ(checked.code, 0) << checked.output;
    EXPECT_NE(checked.output.find(": pass"), std::string::npos) << checked.output;
  }
  writeFile(root + "/whole.py", R"(import sys, numpy as np, torch
from PIL import Image
pkg, root = sys.argv[1], sys.argv[2]
x = np.load(pkg + '/test_input.npy')[0, 0]
m = np.block([[x, x[:, ::-1]], [x[::-1], x[::-1, ::-1]]]).astype(np.float32)
Image.fromarray(m, mode='F').save(root + '/mosaic.tif')
d = m.astype(np.float64)
fed = ((d - d.mean()) / (d.std() + 1e-6)).astype(np.float32)
net = torch.jit.load(pkg + '/weights.pt').eval()
with torch.no_grad():
    y = torch.sigmoid(net(torch.from_numpy(fed)[None, None])).numpy()[0, 0]
Image.fromarray(y.astype(np.float32), mode='F').save(root + '/whole.tif')
print('mean', repr(float(d.mean())), 'std', repr(float(d.std())))  # NumPy 2 reprs np.float64(...)
)");
  const auto whole = test::runCommand(python + " " + root + "/whole.py " + pkg + " " + root);
  ASSERT_EQ(whole.code, 0) << whole.output;
  const auto run = test::runCommand(kTiler + " -m " + pkg + " -i " + root + "/mosaic.tif -o " + root +
                                    "/out --save probs --no_progress");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_LE(largestDifference(root + "/out/mosaic_probs.tif", root + "/whole.tif"), 1e-3);
  const auto report = reportOf(root + "/out");
  EXPECT_EQ(report["halo"], 32);
  const auto& statistics = report["images"][0]["input_statistics"];
  const double mean = std::stod(whole.output.substr(whole.output.find("mean ") + 5)),
               std = std::stod(whole.output.substr(whole.output.find("std ") + 4));
  EXPECT_NEAR(statistics["mean"][0].get<double>(), mean, 1e-9 * mean);
  EXPECT_NEAR(statistics["std"][0].get<double>(), std, 1e-9 * std);
}

namespace {

// make.py of the output-statistics tests: a pointwise net (1x1 convolution, 3 -> 2 channels: a window's
// values are the whole image's forward's, whatever the blend), a 200 x 150 RGB image and a second one, and
// for each card of CHAINS (its postprocessing in YAML, and the same in NumPy over the whole image's output
// `y` with the input `raw`, in float64) the package pkg_<name> (64 px windows, test tensors of a 64 px crop)
// and want_<name>.npy: the chain over the whole image's forward.
constexpr const char* kOutputStatisticsScript = R"(import sys, os, torch, numpy as np
from PIL import Image
d = sys.argv[1]
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 2, 1)
    def forward(self, x):
        return self.a(x / 64.0)
net = Net().eval()
torch.jit.script(net).save(d + '/weights.pt')
rng = np.random.default_rng(0)
img = (rng.random((150, 200, 3)) ** 2 * 255).astype(np.uint8)
os.makedirs(d + '/images', exist_ok=True)
Image.fromarray(img).save(d + '/images/a.png')
Image.fromarray(img[:90, :120].copy()).save(d + '/images/b.png')
ch, every = (0, 2, 3), (0, 1, 2, 3)
sig = lambda v: 1 / (1 + np.exp(-v))
def zmuv(y, axes): return (y - y.mean(axis=axes, keepdims=True)) / (y.std(axis=axes, keepdims=True) + 1e-6)
def srange(y, ref, axes, lo, hi):
    p, q = np.percentile(ref, lo, axis=axes, keepdims=True), np.percentile(ref, hi, axis=axes, keepdims=True)
    return (y - p) / (q - p + 1e-6)
def smv(y, ref, axes):
    m, s = y.mean(axis=axes, keepdims=True), y.std(axis=axes, keepdims=True) + 1e-6
    return (y - m) / s * (ref.std(axis=axes, keepdims=True) + 1e-6) + ref.mean(axis=axes, keepdims=True)
CHAINS = {
  'zmuv': ('''      - {id: sigmoid}
      - {id: zero_mean_unit_variance, kwargs: {axes: [y, x]}}
      - {id: clip, kwargs: {min: -1.5, max: 1.5}}
''', lambda y, raw: np.clip(zmuv(sig(y), ch), -1.5, 1.5)),
  'range': ('''      - {id: scale_linear, kwargs: {gain: 2.0, offset: 1.0}}
      - {id: scale_range, kwargs: {axes: [channel, y, x], min_percentile: 5, max_percentile: 95}}
      - {id: clip, kwargs: {min: 0.0, max: 1.0}}
''', lambda y, raw: np.clip(srange(2 * y + 1, 2 * y + 1, every, 5, 95), 0, 1)),
  'smv': ('''      - {id: scale_mean_variance, kwargs: {reference_tensor: raw, axes: [channel, y, x]}}
''', lambda y, raw: smv(y, raw, every)),
  'ref_range': ('''      - {id: scale_range, kwargs: {reference_tensor: raw, axes: [channel, y, x], min_percentile: 1, max_percentile: 99}}
      - {id: zero_mean_unit_variance, kwargs: {axes: [y, x]}}
''', lambda y, raw: zmuv(srange(y, raw, every, 1, 99), ch)),
}
rdf = open(d + '/rdf.yaml').read()
raw = img.transpose(2, 0, 1)[None].astype(np.float64)
def forward(x):
    with torch.no_grad():
        return net(torch.from_numpy(x.astype(np.float32))).double().numpy()
for name, (steps, numpy) in CHAINS.items():
    p = d + '/pkg_' + name
    os.makedirs(p, exist_ok=True)
    torch.jit.script(net).save(p + '/weights.pt')
    crop = raw[:, :, 40:104, 60:124]
    np.save(p + '/test_input.npy', crop.astype(np.float32))
    np.save(p + '/test_output.npy', numpy(forward(crop), crop).astype(np.float32))
    open(p + '/rdf.yaml', 'w').write(rdf.replace('STEPS\n', steps))
    np.save(d + '/want_' + name + '.npy', numpy(forward(raw), raw)[0].astype(np.float32))
)";

// The largest |a - b| / max(1, |b|) between a probabilities TIFF (HWC, a) and a [C, H, W] .npy (b).
double largestNpyDifference(const std::string& probs, const std::string& npy) {
  const auto r = ImageReader::open(probs);
  const cv::Mat x = r->readRegion({0, 0, r->info().width, r->info().height});
  const NpyArray want = parseNpy(test::slurp(npy), npy);
  EXPECT_EQ(want.shape, (std::vector<int64_t>{x.channels(), x.rows, x.cols})) << npy;
  if (want.shape != std::vector<int64_t>{x.channels(), x.rows, x.cols}) return 1e9;
  double worst = 0;
  for (int c = 0; c < x.channels(); ++c)
    for (int y = 0; y < x.rows; ++y)
      for (int i = 0; i < x.cols; ++i) {
        const double b = want.values[size_t((int64_t(c) * x.rows + y) * x.cols + i)];
        const double a = x.ptr<float>(y)[i * x.channels() + c];
        worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(b)));
      }
  return worst;
}

// Runs make.py (kOutputStatisticsScript) in `root`, with the card it fills in; false where it failed.
bool makeOutputStatisticsPackages(const std::string& root) {
  std::string rdf = rdfWithSteps("", "STEPS\n");
  rdf.replace(rdf.find("    preprocessing:\n"), std::string("    preprocessing:\n").size(), "");
  const std::string sizes = "{min: 64, step: 32}, unit: micrometer, scale: 0.5}";
  for (int k = 0; k < 2; ++k) rdf.replace(rdf.find(sizes), sizes.size(), "64}");
  rdf.replace(rdf.find("  onnx:"), std::string::npos, "");
  writeFile(root + "/rdf.yaml", rdf);
  writeFile(root + "/make.py", kOutputStatisticsScript);
  const auto made = test::runCommand("/usr/bin/python3 " + root + "/make.py " + root);
  EXPECT_EQ(made.code, 0) << made.output;
  return made.code == 0;
}

std::vector<std::string> partialFilesIn(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".partial") found.push_back(e.path().string());
  return found;
}

}  // namespace

// A card's postprocessing over the output's own statistics (zero_mean_unit_variance and scale_range of the
// output, scale_mean_variance and scale_range against the input as reference_tensor, with steps before and
// after them) is the chain over the whole blended map: tiler's probabilities equal NumPy's chain over a
// whole-image forward within 1e-5 x max(1, |value|) (scale_mean_variance's gain of ~119 here: 1e-4; 5e-4
// where percentiles of the output are read: a histogram of 65536 bins, within one bin's width), on one rank
// and two alike byte for byte; check-model follows the same
// chain on its test tensors; --stitch device writes the host's bytes; the report gives the output's
// statistics and map beside the input's.
TEST(ModelCard, PostprocessingOverTheOutputsStatisticsIsTheWholeBlendedMaps) {
  const std::string root = test::scratchDir("card_output_statistics");
  if (test::runCommand("/usr/bin/python3 -c 'import torch, numpy, PIL'").code != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no PyTorch, NumPy or PIL";
  ASSERT_TRUE(makeOutputStatisticsPackages(root));
  const std::string common = " -i " + root + "/images/a.png --save labels,probs --threads 1 --no_progress";
  const std::string ctrun = std::string(TILER_BIN_DIR) + "/ctrun --nproc_per_node 2 --master_port 0 ";
  for (const std::string name : {"zmuv", "range", "smv", "ref_range"}) {
    const std::string pkg = root + "/pkg_" + name, out = root + "/out_" + name, two = root + "/two_" + name;
    const auto check = test::runCommand(kTiler + " check-model " + pkg);
    EXPECT_EQ(check.code, 0) << name << "\n" << check.output;
    const auto one = test::runCommand(kTiler + " -m " + pkg + common + " -o " + out);
    ASSERT_EQ(one.code, 0) << name << "\n" << one.output;
    // float32's rounding of the blended map, times scale_mean_variance's gain of ~119 here: 1e-4.
    const double tolerance = name == "range" ? 5e-4 : name == "smv" ? 1e-4 : 1e-5;
    EXPECT_LE(largestNpyDifference(out + "/a_probs.tif", root + "/want_" + name + ".npy"), tolerance) << name;
    const auto both = test::runCommand(ctrun + kTiler + " -m " + pkg + common + " -o " + two);
    ASSERT_EQ(both.code, 0) << name << "\n" << both.output;
    for (const std::string file : {"a_probs.tif", "a_labels.tif"})
      EXPECT_TRUE(test::slurp(out + "/" + file) == test::slurp(two + "/" + file)) << name << " " << file;
    if (name == "zmuv") {
      // --stitch device: such an image is blended on the host all the same, the same bytes.
      const auto device =
          test::runCommand(kTiler + " -m " + pkg + common + " --stitch device -o " + out + "_dev");
      ASSERT_EQ(device.code, 0) << device.output;
      EXPECT_TRUE(test::slurp(out + "/a_probs.tif") == test::slurp(out + "_dev/a_probs.tif"));
    }
    const auto image = reportOf(two)["images"][0];
    ASSERT_TRUE(image.contains("output_statistics")) << image;
    EXPECT_EQ(image["output_statistics"], reportOf(out)["images"][0]["output_statistics"]) << name;
    EXPECT_EQ(image["output_statistics"]["count"], nlohmann::json({30000.0, 30000.0}));
    EXPECT_EQ(image["output_normalisation"]["gain"].size(), 2u);
    EXPECT_EQ(image.contains("input_statistics"), name == "smv" || name == "ref_range") << image;
  }
  // The numbers used, under plain keys: the output's 5th and 95th percentiles over all channels
  // (scale_range), the input's mean and std as read (scale_mean_variance's reference).
  const auto range = reportOf(root + "/out_range")["images"][0];
  EXPECT_TRUE(range["output_statistics"]["all"]["percentiles"].contains("5")) << range;
  EXPECT_TRUE(range["output_statistics"]["all"]["percentiles"].contains("95")) << range;
  const auto smv = reportOf(root + "/out_smv")["images"][0];
  EXPECT_NEAR(smv["input_statistics"]["all"]["count"].get<double>(), 90000, 0);
  EXPECT_GT(smv["input_statistics"]["all"]["std"].get<double>(), 10);
}

// A failure of the blended output's temporary file fails its image alone, with a message naming it and the
// directory, and leaves no output of it (not even a partial file): a TMPDIR that is no directory, and the
// file's disk full (TILER_FAULT stage write).
TEST(ModelCard, TheTemporaryFileOfTheOutputsStatisticsFailsItsImageAlone) {
  const std::string root = test::scratchDir("card_output_statistics_faults");
  if (test::runCommand("/usr/bin/python3 -c 'import torch, numpy, PIL'").code != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no PyTorch, NumPy or PIL";
  ASSERT_TRUE(makeOutputStatisticsPackages(root));
  const std::string args = kTiler + " -m " + root + "/pkg_zmuv -i " + root +
                           "/images --save labels,probs --threads 1 --no_progress -o ";
  writeFile(root + "/not_a_dir", "");
  const auto nodir = test::runCommand("TMPDIR=" + root + "/not_a_dir " + args + root + "/nodir");
  EXPECT_EQ(nodir.code, kExitSomeFailed) << nodir.output;
  for (const auto& image : reportOf(root + "/nodir")["images"]) {
    EXPECT_EQ(image["status"], "error") << image;
    EXPECT_NE(image["error"].get<std::string>().find("temporary file"), std::string::npos) << image;
    EXPECT_NE(image["error"].get<std::string>().find("TMPDIR"), std::string::npos) << image;
  }
  EXPECT_TRUE(partialFilesIn(root + "/nodir").empty());
  EXPECT_FALSE(fs::exists(root + "/nodir/a_probs.tif"));
  // The disk full under the first image's temporary file: b (the second) is written as without the fault.
  const auto full =
      test::runCommand("TILER_FAULT=rank:0,after_windows:2,kind:throw,stage:write " + args + root + "/full");
  EXPECT_EQ(full.code, kExitSomeFailed) << full.output;
  const auto clean = test::runCommand(args + root + "/clean");
  ASSERT_EQ(clean.code, 0) << clean.output;
  const auto images = reportOf(root + "/full")["images"];
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0]["status"], "error") << images[0];
  const std::string error = images[0]["error"].get<std::string>();
  EXPECT_NE(error.find("blended output's temporary file"), std::string::npos) << error;
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(root + "/full/a_probs.tif"));
  EXPECT_FALSE(fs::exists(root + "/full/a_labels.tif"));
  EXPECT_TRUE(partialFilesIn(root + "/full").empty());
  EXPECT_EQ(images[1]["status"], "ok") << images[1];
  for (const std::string file : {"b_probs.tif", "b_labels.tif"})
    EXPECT_TRUE(test::slurp(root + "/full/" + file) == test::slurp(root + "/clean/" + file)) << file;
}

// Refused before any window is read, naming the steps and why: the output's statistics for a model of one
// vector a window, a per-channel reference of another channel count (check-model too, naming the test
// tensor), and a step's values for another channel count than the output's.
TEST(ModelCard, OutputStatisticsStepsTilerCannotFollowAreRefusedAtTheStart) {
  const std::string root = test::scratchDir("card_output_statistics_refused");
  if (test::runCommand("/usr/bin/python3 -c 'import torch, numpy, PIL'").code != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no PyTorch, NumPy or PIL";
  ASSERT_TRUE(makeOutputStatisticsPackages(root));
  const std::string common = " -i " + root + "/images/a.png --threads 1 --no_progress -o " + root + "/out";
  fs::create_directories(root + "/vector");
  fs::copy_file(root + "/pkg_zmuv/rdf.yaml", root + "/vector/rdf.yaml");
  fs::copy_file(kSamples + "/models/classifier.pt", root + "/vector/weights.pt");
  for (const char* npy : {"/test_input.npy", "/test_output.npy"})
    fs::copy_file(root + "/pkg_zmuv" + npy, root + "/vector" + npy);
  const auto vector = test::runCommand(kTiler + " -m " + root + "/vector --task classify" + common);
  EXPECT_TRUE(test::endedNaming(vector, 1,
                                {"outputs[0].postprocessing", "zero_mean_unit_variance", "statistics",
                                 "--task classify gives no map"}));
  std::string card = test::slurp(root + "/pkg_smv/rdf.yaml");
  card.replace(card.find("axes: [channel, y, x]"), std::string("axes: [channel, y, x]").size(),
               "axes: [y, x]");
  writeFile(root + "/pkg_smv/rdf.yaml", card);
  const auto apart = test::runCommand(kTiler + " -m " + root + "/pkg_smv" + common);
  EXPECT_TRUE(test::endedNaming(apart, 1, {"scale_mean_variance", "y, x", "takes 3 channel(s)", "gives 2"}));
  const auto check = test::runCommand(kTiler + " check-model " + root + "/pkg_smv");
  EXPECT_TRUE(test::endedNaming(check, 1, {"test_output.npy'", "scale_mean_variance", "2 channel(s)"}));
  card = test::slurp(root + "/pkg_range/rdf.yaml");
  card.replace(card.find("      - {id: clip"), 0, "      - {id: scale_linear, kwargs: {gain: [1, 2, 3]}}\n");
  writeFile(root + "/pkg_range/rdf.yaml", card);
  const auto values = test::runCommand(kTiler + " -m " + root + "/pkg_range" + common);
  EXPECT_TRUE(test::endedNaming(values, 1, {"postprocessing", "scale_linear", "3 values", "2 channels"}));
}
