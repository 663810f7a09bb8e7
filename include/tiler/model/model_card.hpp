// model_card: the settings a model carries with it, read into tiler's option values: a WSInfer config.json
// beside the TorchScript file, or a bioimage.io model description (rdf.yaml, spec 0.5) that names its
// TorchScript weights and test tensors. Promise: every card field that changes how the model is fed or read
// is either taken or refused by name (a ConfigError naming the card file and the field: ONNX-only weights, a
// pre- or postprocessing step tiler cannot follow, with the reason; an axis layout other than batch, channel,
// y, x); descriptive fields
// (names, authors, licence, covers) are left alone. An explicit flag always wins over the card, and the
// report says where each setting came from (settingsFrom). No LibTorch.
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
  std::string weights;  // the TorchScript file it describes
  // The settings it gives (unset: the card says nothing), as the flags of the same names take them.
  std::optional<std::string> window;  // "N" or "W,H"
  std::optional<double> mpp;
  std::optional<double> scale;
  std::optional<std::vector<double>> mean, std;
  std::optional<std::string> classes, activation, task;
  // bioimage.io: the steps tiler follows beyond those settings, in the card's order. preprocessing: the
  // whole chain where it is more than fixed affine steps (those alone are scale, mean and std), applied
  // after tiler's --scale, --mean and --std; postprocessing: the steps after a leading sigmoid or softmax
  // (activation), applied to each window's output. input_id: inputs[0].id.
  std::vector<ProcessingStep> preprocessing, postprocessing;
  std::string input_id;
  // bioimage.io: the test tensors (.npy) and the tolerance they are compared with.
  std::string test_input, test_output;
  CardTolerance tolerance;
};

// The card of `-m`'s value: a bioimage.io description (a .yaml file, or a directory holding rdf.yaml or
// bioimageio.yaml), a WSInfer zoo directory (config.json and torchscript_model.pt), or a model file with a
// WSInfer config.json beside it (one that has WSInfer's keys: another tool's config.json there is not a
// card). nullopt: no card (an empty value: the bundled sample model).
std::optional<ModelCard> findModelCard(const std::string& model);
ModelCard readWsinferConfig(const std::string& config_path, const std::string& weights);
ModelCard readBioimageioRdf(const std::string& rdf_path);

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
  std::vector<ProcessingStep>* preprocessing = nullptr;
  std::vector<ProcessingStep>* postprocessing = nullptr;
};

// The card's numbers held to what the flags of the same names take (a std of 1e-320 or -1, a NaN offset
// would run on garbage): ConfigError naming the card and the setting (not finite, a std, µm/px or scale of 0
// or less, a magnitude under kLeastCardNumber).
void checkCardNumbers(const ModelCard& card);

// The settings a card can give, in the report's order: window, mpp, scale, mean, std, classes, activation,
// task.
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
