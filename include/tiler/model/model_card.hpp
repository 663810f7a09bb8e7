// model_card: the settings a model carries with it, read into tiler's option values: a WSInfer config.json
// beside the TorchScript file, or a bioimage.io model description (rdf.yaml / bioimageio.yaml, spec 0.4.x or
// 0.5.x) that names its TorchScript weights and test tensors, in a package directory or a zipped package read
// in place. Promise: the format_version is checked first (0.3 and older, or none, refused naming it and
// `bioimageio update-format`); a 0.4 card is converted to 0.5's shape at the YAML level as bioimageio.spec
// converts it, so one reader sees one shape. Every card field that changes how the model is fed or read is
// either taken or refused by name (a ConfigError naming the card file and the field: ONNX-only weights, a
// state dict without TorchScript weights (naming scripts/export_model.py --card), a pre- or postprocessing
// step tiler cannot follow, with the reason; an axis layout other than batch, channel, y, x; a halo on an
// axis other than y and x or unequal on them); descriptive fields (names, authors, licence, covers) are left
// alone, and so are a WSInfer config's fields outside its schema (which WSInfer's schema allows and WSInfer
// ignores): each is named once in a warning. The files a card names lie in its package (a zip's: its members,
// named ARCHIVE!/MEMBER), and where it gives their sha256 they are checked: the test tensors' when the card
// is read, the weights' by the model's loader on the bytes it loads (weights_sha256). An explicit
// flag always wins over the card, and the report says where each setting came from (settingsFrom). No
// LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tiler/core/processing.hpp"

namespace tiler {

// bioimage.io's reproducibility tolerance: an output element is off when |out - expected| > absolute +
// relative * |expected|; a check passes with at most mismatched_per_million such elements.
struct CardTolerance {
  double relative = 1e-3, absolute = 1e-3, mismatched_per_million = 100;
};

// The largest card file read, and the most its YAML may stand for with its aliases expanded.
constexpr int64_t kMaxCardBytes = int64_t(4) << 20;
constexpr int64_t kMaxCardExpandedBytes = int64_t(16) << 20;
// The smallest magnitude a card's non-zero number may have (a std of 1e-320 divides into infinity).
constexpr double kLeastCardNumber = 1e-30;

struct ModelCard {
  std::string kind;     // "wsinfer" | "bioimageio"
  std::string path;     // the card file
  std::string weights;  // the TorchScript file it describes (in a zip: ARCHIVE!/MEMBER)
  // bioimage.io: weights.torchscript.sha256 (lowercase; empty: none), checked on the bytes the model loads
  // (JobOptions::model_sha256), not when the card is read.
  std::string weights_sha256;
  // The settings it gives (unset: the card says nothing), as the flags of the same names take them.
  std::optional<std::string> window;  // "N" or "W,H"
  std::optional<double> mpp;
  std::optional<double> scale;
  std::optional<std::vector<double>> mean, std;
  std::optional<std::string> classes, activation, task;
  // bioimage.io: the output's halo (px of the output, its y and x axes' alike): the band of each window's
  // edge the model cannot compute reliably (--halo).
  std::optional<int64_t> halo;
  // bioimage.io: the steps tiler follows beyond those settings, in the card's order. preprocessing: the
  // whole chain where it is more than fixed affine steps of a positive gain (those alone are scale, mean
  // and std), applied after tiler's --scale, --mean and --std; postprocessing: the steps after a leading
  // sigmoid or softmax (activation), applied to each window's output up to the first step over statistics,
  // the rest to each image's blended output (splitAtStatistics). input_id: inputs[0].id.
  std::vector<ProcessingStep> preprocessing, postprocessing;
  std::string input_id;
  // bioimage.io: the test tensors (.npy) and the tolerance they are compared with.
  std::string test_input, test_output;
  CardTolerance tolerance;
};

// The card of `-m`'s value: a bioimage.io description (a .yaml file, a directory holding rdf.yaml or
// bioimageio.yaml, or a zipped package: a .zip holding one at its root or in its one top folder), a WSInfer
// zoo directory (config.json and torchscript_model.pt), or a model file with a WSInfer config.json beside it
// (one that has WSInfer's keys: another tool's config.json there is not a card). nullopt: no card (an empty
// value: the bundled sample model).
std::optional<ModelCard> findModelCard(const std::string& model);
ModelCard readWsinferConfig(const std::string& config_path, const std::string& weights);
ModelCard readBioimageioRdf(const std::string& rdf_path);
// A zipped package: its card, weights and test tensors are members (ARCHIVE!/MEMBER), never extracted.
ModelCard readBioimageioZip(const std::string& zip_path);
// The description in `rdf_path` as YAML of spec 0.5's shape, as the reader sees it: a 0.4 card converted, a
// 0.5 card as it is; its version checked, nothing else (no field is taken, no file looked at).
std::string bioimageioAs05(const std::string& rdf_path);

// The option fields a card's settings go to (null: the command has no such flag).
struct CardTargets {
  std::string* window = nullptr;
  double* mpp = nullptr;
  double* scale = nullptr;
  std::vector<double>* mean = nullptr;
  std::vector<double>* std = nullptr;
  std::string* classes = nullptr;
  std::string* activation = nullptr;
  std::string* task = nullptr;
  int64_t* halo = nullptr;
  std::vector<ProcessingStep>* preprocessing = nullptr;
  std::vector<ProcessingStep>* postprocessing = nullptr;
};

// The card's numbers held to what the flags of the same names take (a std of 1e-320 or -1, a NaN offset
// would run on garbage): ConfigError naming the card and the setting (not finite, a std, µm/px or scale of 0
// or less, a magnitude under kLeastCardNumber, a negative halo).
void checkCardNumbers(const ModelCard& card);

// The settings a card can give, in the report's order: window, mpp, scale, mean, std, classes, activation,
// task, halo.
const std::vector<std::string>& cardSettingNames();

// Sets each target that the card gives and `given` (the setting names the user set by flag or --config) does
// not hold, after checkCardNumbers, and the step lists (no flag sets them). Returns where each setting came
// from, in cardSettingNames()' order: "flag", "card" or "default".
std::vector<std::pair<std::string, std::string>> applyModelCard(const ModelCard& card,
                                                                const std::set<std::string>& given,
                                                                const CardTargets& targets);

// `message` with the flag of each setting the card gave (`settings_from`, applyModelCard's) named as the
// card's: "--classes names 3 class(es)" becomes "the model card's classes ('<card_path>') names 3 ...", so a
// message never sends the user looking for a flag they did not give.
std::string cardBlamed(std::string message,
                       const std::vector<std::pair<std::string, std::string>>& settings_from,
                       const std::string& card_path);

}  // namespace tiler
