// model_card: WSInfer's config.json and bioimage.io's rdf.yaml (spec 0.5) read into the settings of the
// flags of the same names (see the header). YAML through yaml-cpp, JSON through nlohmann_json.
#include "tiler/model/model_card.hpp"

#include <yaml-cpp/yaml.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "tiler/core/error.hpp"
#include "tiler/core/grid.hpp"
#include "tiler/core/json_document.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/npy.hpp"
#include "tiler/io/zip_archive.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// A card file's text: a FIFO or device is refused before it is read, and so is anything of card size.
std::string cardText(const std::string& path) {
  std::string why;
  const auto text = readDocument(path, kMaxCardBytes, why);
  TILER_CHECK(text, ConfigError, "model card '" << path << "': " << why);
  return *text;
}

// The bytes a YAML node stands for with every alias expanded, counted until `budget` runs out: a card of a
// few aliases of aliases can stand for gigabytes (each use of a value copies it).
bool yamlFitsExpanded(const YAML::Node& node, int64_t& budget) {
  if (node.IsScalar()) budget -= int64_t(node.Scalar().size()) + 1;
  budget -= 1;
  if (budget < 0) return false;
  if (node.IsSequence() || node.IsMap())
    for (const auto& item : node) {
      if (node.IsMap() && !(yamlFitsExpanded(item.first, budget) && yamlFitsExpanded(item.second, budget)))
        return false;
      if (node.IsSequence() && !yamlFitsExpanded(item, budget)) return false;
    }
  return true;
}

std::string windowText(int64_t w, int64_t h) {
  return w == h ? std::to_string(w) : std::to_string(w) + "," + std::to_string(h);
}

// Class names as --classes takes them: NAME,NAME,... (a name may hold neither ',' nor ':').
std::string classesText(const std::vector<std::string>& names, const std::string& path,
                        const std::string& field) {
  std::string text;
  for (const auto& name : names) {
    TILER_CHECK(!name.empty() && name.find_first_of(",:") == std::string::npos, ConfigError,
                "'" << path << "': " << field << " '" << name
                    << "' is empty or holds ',' or ':', which --classes cannot carry");
    text += (text.empty() ? "" : ",") + name;
  }
  return text;
}

// ---- WSInfer ----

void readWsinferTransform(const nlohmann::json& step, const std::string& path, int64_t patch, double spacing,
                          ModelCard& card, bool& to_tensor) {
  TILER_CHECK(step.is_object() && step.contains("name") && step["name"].is_string(), ConfigError,
              "'" << path << "': a transform step is not {\"name\": ..., \"arguments\": {...}}");
  for (const auto& [key, value] : step.items())
    TILER_CHECK(key == "name" || key == "arguments", ConfigError,
                "'" << path << "': transform field '" << key << "' is not WSInfer's (name, arguments)");
  const std::string name = step["name"];
  const nlohmann::json args = step.value("arguments", nlohmann::json::object());
  auto only = [&](std::set<std::string> known) {
    for (const auto& [key, value] : args.items())
      TILER_CHECK(
          known.count(key), ConfigError,
          "'" << path << "': transform " << name << "'s argument '" << key << "' is not one tiler takes");
  };
  if (name == "ToTensor") {
    only({});
    to_tensor = true;  // 8-bit values to [0, 1]: tiler's default --scale for u8 (1/255)
  } else if (name == "Normalize") {
    only({"mean", "std", "inplace"});
    card.mean = args.at("mean").get<std::vector<double>>();
    card.std = args.at("std").get<std::vector<double>>();
  } else if (name == "Resize") {
    only({"size"});
    const nlohmann::json size = args.at("size");
    int64_t w = 0, h = 0;
    if (size.is_number_integer()) w = h = size.get<int64_t>();
    if (size.is_array() && size.size() == 1) w = h = size[0].get<int64_t>();
    if (size.is_array() && size.size() == 2) h = size[0].get<int64_t>(), w = size[1].get<int64_t>();
    TILER_CHECK(w > 0 && w == h, ConfigError,
                "'" << path << "': Resize size " << size.dump()
                    << " is not one positive side (tiler resamples square patches alike in x and y)");
    // A patch of `patch` px at `spacing` resized to w px is a window of w px at spacing * patch / w.
    card.window = windowText(w, h);
    card.mpp = spacing * double(patch) / double(w);
  } else {
    TILER_THROW(ConfigError, "'" << path << "': transform " << name
                                 << " is not a step tiler has (Resize, ToTensor, Normalize)");
  }
}

}  // namespace

ModelCard readWsinferConfig(const std::string& config_path, const std::string& weights) {
  std::string why;
  const auto parsed = parseJsonDocument(cardText(config_path), why);
  TILER_CHECK(parsed, ConfigError, "'" << config_path << "': not JSON: " << firstLine(why));
  const nlohmann::json& j = *parsed;
  TILER_CHECK(j.is_object(), ConfigError, "'" << config_path << "': not a JSON object");
  static const std::set<std::string> known = {"spec_version",      "architecture",  "num_classes",
                                              "patch_size_pixels", "spacing_um_px", "class_names",
                                              "transform"};
  // WSInfer's schema allows fields of its own (a zoo entry's notes) and WSInfer ignores them; one that
  // says the patches were fed otherwise (stain-normalised) would have tiler feed the model wrong colours.
  static const std::set<std::string> feeding = {"stain_normalization"};
  std::string ignored;
  for (const auto& [key, value] : j.items()) {
    TILER_CHECK(!feeding.count(key), ConfigError,
                "'" << config_path << "': field '" << key << "' (" << value.dump().substr(0, 80)
                    << ") says the patches are fed otherwise than its transform does, which tiler cannot "
                    << "follow");
    if (!known.count(key)) ignored += (ignored.empty() ? "'" : ", '") + key + "'";
  }
  if (!ignored.empty())
    spdlog::warn("'{}': field(s) {} are not WSInfer's model config fields; ignored, as WSInfer ignores them",
                 config_path, ignored);
  for (const char* key : {"num_classes", "patch_size_pixels", "spacing_um_px", "class_names", "transform"})
    TILER_CHECK(j.contains(key), ConfigError,
                "'" << config_path << "': WSInfer's field '" << key << "' is missing");
  ModelCard card;
  card.kind = "wsinfer";
  card.path = config_path;
  card.weights = weights;
  try {
    const int64_t classes = j["num_classes"].get<int64_t>(), patch = j["patch_size_pixels"].get<int64_t>();
    const double spacing = j["spacing_um_px"].get<double>();
    TILER_CHECK(classes >= 1 && patch >= 1 && spacing > 0 && std::isfinite(spacing), ConfigError,
                "'" << config_path << "': num_classes and patch_size_pixels must be >= 1, spacing_um_px > 0");
    const auto names = j["class_names"].get<std::vector<std::string>>();
    TILER_CHECK(int64_t(names.size()) == classes, ConfigError,
                "'" << config_path << "': class_names has " << names.size() << " name(s), num_classes is "
                    << classes);
    card.window = windowText(patch, patch);
    card.mpp = spacing;
    bool to_tensor = false;
    for (const auto& step : j["transform"])
      readWsinferTransform(step, config_path, patch, spacing, card, to_tensor);
    TILER_CHECK(to_tensor, ConfigError,
                "'" << config_path << "': transform has no ToTensor (WSInfer's models take it)");
    card.classes = classesText(names, config_path, "class name");
    // As WSInfer reads its outputs: softmax over two or more classes, a sigmoid of one logit.
    card.activation = classes > 1 ? "softmax" : "sigmoid";
    card.task = "classify";
  } catch (const nlohmann::json::exception& e) {
    TILER_THROW(ConfigError, "'" << config_path << "': " << firstLine(e.what()));
  }
  return card;
}

namespace {

// ---- bioimage.io ----

// Where a card's files are: its directory, or the zip archive it was read from (members under `folder`).
struct Package {
  std::string zip;     // empty: a directory
  std::string folder;  // the card's folder in the archive: "" or "top/"
  std::shared_ptr<ZipArchive> archive;
};

// The file a card's `field` names (a `source`): in the package only (no URL, no absolute path, no `..`, no
// link out of its directory); a zip member as ARCHIVE!/MEMBER, which must be in the archive.
std::string joinPath(const std::string& rdf, const std::string& field, const YAML::Node& source,
                     const Package& pkg) {
  TILER_CHECK(source && source.IsScalar(), ConfigError, "'" << rdf << "': " << field << " is missing");
  const std::string value = source.as<std::string>();
  TILER_CHECK(value.find("://") == std::string::npos, ConfigError,
              "'" << rdf << "': " << field << " is a URL (" << value
                  << "); tiler reads a package's files from its directory: download the package");
  // A package is its directory: a card that names a file elsewhere (an absolute path, ../, a link out of it)
  // would run or check against files that are not the package's.
  const fs::path p = fs::path(value).lexically_normal();
  const bool escapes = p.is_absolute() || p.empty() || *p.begin() == ".." || !zipMemberNameIsSafe(p.string());
  TILER_CHECK(!escapes, ConfigError,
              "'" << rdf << "': " << field << " '" << value
                  << "' lies outside the package; a card names its files relative to its own directory");
  if (pkg.archive) {
    const std::string member = pkg.folder + p.generic_string();
    TILER_CHECK(pkg.archive->has(member), ConfigError,
                "'" << pkg.zip << "': " << field << " '" << value << "': member '" << member
                    << "' is not in the archive");
    return zipMemberPath(pkg.zip, member);
  }
  const fs::path package = fs::path(rdf).parent_path(), joined = (package / p).lexically_normal();
  std::error_code ec;
  const fs::path real_package = fs::weakly_canonical(package.empty() ? "." : package, ec),
                 real_file = fs::weakly_canonical(joined, ec);
  const auto rel = real_file.lexically_relative(real_package);
  TILER_CHECK(ec || (!rel.empty() && *rel.begin() != ".."), ConfigError,
              "'" << rdf << "': " << field << " '" << value << "' leads outside the package (to "
                  << real_file.string() << ") through a symbolic link");
  return joined.string();
}

// The sha256 the card gives of a file (`descr`: the {source, sha256} node that names it), lowercase; empty
// where it gives none.
std::string statedSha256(const std::string& rdf, const std::string& field, const YAML::Node& descr) {
  if (!descr || !descr.IsMap() || !descr["sha256"]) return {};
  std::string expected = descr["sha256"].as<std::string>();
  std::transform(expected.begin(), expected.end(), expected.begin(), [](char c) { return std::tolower(c); });
  TILER_CHECK(
      expected.size() == 64 && expected.find_first_not_of("0123456789abcdef") == std::string::npos,
      ConfigError,
      "'" << rdf << "': " << field << ".sha256 '" << expected << "' is not a SHA-256 digest (64 hex digits)");
  return expected;
}

// A file's sha256 against the card's, where it gives one.
void checkSha256(const std::string& rdf, const std::string& field, const YAML::Node& descr,
                 const std::string& file, int64_t max_bytes) {
  const std::string expected = statedSha256(rdf, field, descr);
  if (!expected.empty()) requireSha256(file, sha256OfFileOrZipMember(file, max_bytes), expected, field, rdf);
}

void refuseUnknownKeys(const YAML::Node& node, const std::set<std::string>& known, const std::string& rdf,
                       const std::string& where, const char* spec = "0.5") {
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    TILER_CHECK(
        known.count(key), ConfigError,
        "'" << rdf << "': " << where << "field '" << key << "' is not one tiler knows (spec " << spec << ")");
  }
}

std::vector<double> scalarOrList(const YAML::Node& node, double fallback) {
  if (!node) return {fallback};
  if (node.IsSequence()) return node.as<std::vector<double>>();
  return {node.as<double>()};
}

// An axis's id: as given, else the spec's default (its type; "x" for a space axis).
std::string axisId(const YAML::Node& axis);

// Where a step stands in the card, for messages: "inputs[0].preprocessing[2] (scale_range)".
std::string stepWhere(const std::string& list, size_t index, const std::string& id) {
  return list + "[" + std::to_string(index) + "] (" + id + ")";
}

// One pre- or postprocessing step of a 0.5 card (id and kwargs) as tiler follows it; `where` names it in
// messages; `axis_ids` are the input's axes (batch, channel, y, x as the card names them), `input_id` its id,
// `tensor_id` the id of the tensor the step is of. `pre`: a preprocessing step (a postprocessing step's
// statistics are the blended output's, or the input's as read where its reference_tensor names the input).
// nullopt: a step that changes nothing tiler feeds (ensure_dtype to a float type).
std::optional<ProcessingStep> readStep(const YAML::Node& step, const std::string& rdf,
                                       const std::string& where, const std::vector<std::string>& axis_ids,
                                       const std::string& input_id, const std::string& tensor_id, bool pre,
                                       const std::string& previous) {
  TILER_CHECK(step.IsMap() && step["id"], ConfigError, "'" << rdf << "': " << where << " has no id");
  const std::string id = step["id"].as<std::string>();
  const YAML::Node kw = step["kwargs"] ? step["kwargs"] : YAML::Node(YAML::NodeType::Map);
  TILER_CHECK(kw.IsMap(), ConfigError, "'" << rdf << "': " << where << "'s kwargs are not a mapping");
  auto only = [&](const std::set<std::string>& known) {
    for (const auto& kv : kw) {
      const std::string key = kv.first.as<std::string>();
      TILER_CHECK(known.count(key), ConfigError,
                  "'" << rdf << "': " << where << "'s kwarg '" << key << "' is not one tiler knows");
    }
  };
  // A list of values runs along one axis: the channel axis is the only one tiler's steps hold apart.
  auto alongChannel = [&] {
    const YAML::Node axis = kw["axis"];
    if (axis) {
      const std::string name = axis.as<std::string>();
      TILER_CHECK(name == axis_ids[1], ConfigError,
                  "'" << rdf << "': " << where << " along axis '" << name << "': tiler's per-axis values "
                      << "are along the channel axis ('" << axis_ids[1] << "')");
    }
  };
  ProcessingStep s;
  s.id = id;
  if (id == "ensure_dtype") {
    only({"dtype"});
    const std::string dtype = kw["dtype"] ? kw["dtype"].as<std::string>() : "";
    if (dtype == "float32" || dtype == "float64") return std::nullopt;
    // After binarize the values are 0 and 1, which every type holds: the cast changes no value.
    TILER_CHECK(!pre && previous == "binarize" && !dtype.empty(), ConfigError,
                "'" << rdf << "': " << where << " to '" << dtype << "': tiler "
                    << (pre ? "feeds float32"
                            : "writes float outputs (an integer type only "
                              "after binarize, whose 0 and 1 it holds)"));
    return std::nullopt;
  }
  if (id == "scale_linear") {
    only({"gain", "offset", "axis"});
    alongChannel();
    s.gain = scalarOrList(kw["gain"], 1.0), s.offset = scalarOrList(kw["offset"], 0.0);
  } else if (id == "fixed_zero_mean_unit_variance") {
    only({"mean", "std", "axis", "eps"});
    alongChannel();
    const double eps = kw["eps"] ? kw["eps"].as<double>() : 1e-6;
    // bioimageio.core: (x - mean) / (std + eps), a fixed scale_linear.
    s.id = "scale_linear";
    s.gain = scalarOrList(kw["std"], 1.0), s.offset = scalarOrList(kw["mean"], 0.0);
    TILER_CHECK(s.gain.size() == s.offset.size() || s.gain.size() == 1 || s.offset.size() == 1, ConfigError,
                "'" << rdf << "': " << where << " has " << s.offset.size() << " means and " << s.gain.size()
                    << " stds");
    const size_t n = std::max(s.gain.size(), s.offset.size());
    std::vector<double> gain, offset;
    for (size_t c = 0; c < n; ++c) {
      const double std = s.gain[s.gain.size() == 1 ? 0 : c], mean = s.offset[s.offset.size() == 1 ? 0 : c];
      TILER_CHECK(std + eps > 0, ConfigError,
                  "'" << rdf << "': " << where << "'s std " << std << " is not positive");
      gain.push_back(1.0 / (std + eps)), offset.push_back(-mean / (std + eps));
    }
    s.gain = gain, s.offset = offset;
  } else if (id == "scale_range" || id == "zero_mean_unit_variance" || id == "scale_mean_variance") {
    // In postprocessing the statistics are the whole blended output's (never a window's: every window would
    // get numbers of its own), or the input's as read where the step names it as its reference_tensor.
    TILER_CHECK(pre || id != "scale_mean_variance" || kw["reference_tensor"], ConfigError,
                "'" << rdf << "': " << where << " has no reference_tensor (the tensor whose mean and std "
                    << "the output is given)");
    TILER_CHECK(id != "scale_mean_variance" || !pre, ConfigError,
                "'" << rdf << "': " << where << " is a postprocessing step (it matches the output to a "
                    << "reference tensor's statistics)");
    if (kw["reference_tensor"]) {
      const std::string ref = kw["reference_tensor"].as<std::string>();
      TILER_CHECK(ref == input_id || (!pre && ref == tensor_id), ConfigError,
                  "'" << rdf << "': " << where << "'s reference_tensor '" << ref << "' is not the input ('"
                      << input_id << "'), the one tensor tiler feeds"
                      << (pre ? std::string() : ", nor the output ('" + tensor_id + "')"));
      s.reference_input = !pre && ref == input_id;
    }
    if (id == "scale_range") {
      only({"axes", "min_percentile", "max_percentile", "eps", "mode", "reference_tensor"});
      if (kw["min_percentile"]) s.min_percentile = kw["min_percentile"].as<double>();
      if (kw["max_percentile"]) s.max_percentile = kw["max_percentile"].as<double>();
      TILER_CHECK(s.min_percentile >= 0 && s.min_percentile < s.max_percentile && s.max_percentile <= 100,
                  ConfigError,
                  "'" << rdf << "': " << where << "'s percentiles " << s.min_percentile << " and "
                      << s.max_percentile << " are not 0 <= min < max <= 100");
    } else if (id == "scale_mean_variance") {
      only({"axes", "eps", "mode", "reference_tensor"});
    } else {
      only({"axes", "eps", "mode"});
    }
    if (kw["eps"]) s.eps = kw["eps"].as<double>();
    TILER_CHECK(std::isfinite(s.eps) && s.eps >= 0, ConfigError,
                "'" << rdf << "': " << where << "'s eps " << s.eps << " is not a number of 0 or more");
    if (kw["mode"]) {
      const std::string mode = kw["mode"].as<std::string>();
      TILER_CHECK(mode != "per_dataset", ConfigError,
                  "'" << rdf << "': " << where << "'s mode per_dataset: statistics over a dataset tiler does "
                      << "not have (it " << (pre ? "normalises" : "scales") << " each image by its own "
                      << "statistics, per_sample)");
      TILER_CHECK(mode == "per_sample", ConfigError,
                  "'" << rdf << "': " << where << "'s mode '" << mode << "' is not per_sample");
    }
    // Statistics over y, x (each channel) or channel, y, x (all together); the batch axis is one image.
    s.per_channel = false;
    if (kw["axes"]) {
      TILER_CHECK(kw["axes"].IsSequence(), ConfigError,
                  "'" << rdf << "': " << where << "'s axes are not a list of axis ids");
      std::set<std::string> axes;
      for (const auto& a : kw["axes"]) {
        const std::string name = a.as<std::string>();
        TILER_CHECK(std::find(axis_ids.begin(), axis_ids.end(), name) != axis_ids.end(), ConfigError,
                    "'" << rdf << "': " << where << "'s axis '" << name << "' is not one of the input's ("
                        << axis_ids[0] << ", " << axis_ids[1] << ", " << axis_ids[2] << ", " << axis_ids[3]
                        << ")");
        axes.insert(name);
      }
      TILER_CHECK(axes.count(axis_ids[2]) && axes.count(axis_ids[3]), ConfigError,
                  "'" << rdf << "': " << where << "'s axes leave out " << axis_ids[2] << " or " << axis_ids[3]
                      << ": tiler takes statistics over the whole image ([" << axis_ids[2] << ", "
                      << axis_ids[3] << "] per channel or [" << axis_ids[1] << ", " << axis_ids[2] << ", "
                      << axis_ids[3] << "]), never per row or column");
      s.per_channel = !axes.count(axis_ids[1]);
    }
  } else if (id == "clip") {
    only({"min", "max"});
    if (kw["min"]) s.min = kw["min"].as<double>();
    if (kw["max"]) s.max = kw["max"].as<double>();
    TILER_CHECK(!(s.min > s.max), ConfigError,
                "'" << rdf << "': " << where << "'s min " << s.min << " is over its max " << s.max);
  } else if (id == "sigmoid") {
    only({});
  } else if (id == "softmax") {
    TILER_CHECK(!pre, ConfigError, "'" << rdf << "': " << where << " is a postprocessing step");
    only({"axis"});
    const std::string axis = kw["axis"] ? kw["axis"].as<std::string>() : "channel";
    TILER_CHECK(axis == "channel", ConfigError,
                "'" << rdf << "': " << where << " along " << axis << "; tiler's is along channel");
  } else if (id == "binarize") {
    only({"threshold", "axis"});
    alongChannel();
    TILER_CHECK(kw["threshold"], ConfigError, "'" << rdf << "': " << where << " has no threshold");
    s.threshold = scalarOrList(kw["threshold"], 0.0);
  } else {
    TILER_THROW(
        ConfigError,
        "'" << rdf << "': " << where << " is not a step tiler has ("
            << (pre ? "scale_linear, scale_range, zero_mean_unit_variance, fixed_zero_mean_unit_variance, "
                      "clip, sigmoid, binarize, ensure_dtype"
                    : "scale_linear, fixed_zero_mean_unit_variance, clip, sigmoid, softmax, binarize, "
                      "ensure_dtype")
            << ")");
  }
  for (const auto& list : {s.gain, s.offset, s.threshold})
    for (double v : list)
      TILER_CHECK(std::isfinite(v), ConfigError,
                  "'" << rdf << "': " << where << " holds " << v << ", not a finite number");
  TILER_CHECK(s.gain.size() == s.offset.size() || s.gain.size() == 1 || s.offset.size() == 1, ConfigError,
              "'" << rdf << "': " << where << " has " << s.gain.size() << " gains and " << s.offset.size()
                  << " offsets");
  if (s.gain.size() == 1 && s.offset.size() > 1) s.gain.assign(s.offset.size(), s.gain[0]);
  if (s.offset.size() == 1 && s.gain.size() > 1) s.offset.assign(s.gain.size(), s.offset[0]);
  return s;
}

// The steps of a list (of tensor `tensor_id`), in the card's order.
std::vector<ProcessingStep> readSteps(const YAML::Node& steps, const std::string& rdf,
                                      const std::string& list, const std::vector<std::string>& axis_ids,
                                      const std::string& input_id, const std::string& tensor_id, bool pre) {
  std::vector<ProcessingStep> out;
  if (!steps) return out;
  TILER_CHECK(steps.IsSequence(), ConfigError, "'" << rdf << "': " << list << " is not a list of steps");
  std::string previous, non_affine;
  bool statistics = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const YAML::Node step = steps[i];
    const std::string id = step.IsMap() && step["id"] ? step["id"].as<std::string>() : "";
    const std::string where = stepWhere(list, i, id);
    auto s = readStep(step, rdf, where, axis_ids, input_id, tensor_id, pre, previous);
    previous = id;
    if (!s) continue;
    // Statistics are of the image as read (postprocessing: of the blended output where the first statistics
    // step meets it), carried through affine steps only: after a clip or a sigmoid they would be of other
    // values, which one more pass over the whole image would have to gather.
    TILER_CHECK(
        !s->usesStatistics() || non_affine.empty(), ConfigError,
        "'" << rdf << "': " << where << " after " << non_affine << ": tiler gathers the "
            << (pre ? "image's statistics as read" : "output's statistics where its first statistics step is")
            << " and carries them through affine steps only");
    statistics = statistics || s->usesStatistics();
    if (!s->isAffine() && non_affine.empty() && (pre || statistics)) non_affine = s->id;
    out.push_back(*s);
  }
  return out;
}

// inputs[0].preprocessing: fixed affine steps alone, of a positive gain on every channel, become --scale,
// --mean and --std ((x * scale - mean) / std), which a flag still overrides; any other chain is kept as its
// steps (ModelCard::preprocessing).
void readPreprocessing(const YAML::Node& steps, const std::string& rdf,
                       const std::vector<std::string>& axis_ids, const std::string& input_id,
                       ModelCard& card) {
  const auto list = readSteps(steps, rdf, "inputs[0].preprocessing", axis_ids, input_id, input_id, true);
  card.scale = 1.0;  // bioimage.io feeds the tensor's values as they are
  const bool fixed =
      std::all_of(list.begin(), list.end(), [](const ProcessingStep& s) { return s.id == "scale_linear"; });
  if (!fixed) {
    card.preprocessing = list;
    return;
  }
  std::vector<double> a{1.0}, b{0.0};
  for (const auto& s : list) {
    const size_t n = s.gain.size();
    TILER_CHECK(a.size() == 1 || n == 1 || a.size() == n, ConfigError,
                "'" << rdf << "': preprocessing steps give " << a.size() << " and " << n << " channels");
    if (a.size() == 1 && n > 1) a.assign(n, a[0]), b.assign(n, b[0]);
    for (size_t c = 0; c < a.size(); ++c) {
      const double g = s.gain[n == 1 ? 0 : c], o = s.offset[n == 1 ? 0 : c];
      a[c] *= g;
      b[c] = b[c] * g + o;
    }
  }
  // --std is positive (a flag's std of -1 is a mistake), so a gain of 0 or less (an inverted channel) is no
  // std: the chain is followed as steps, each image's affine map, which takes any gain.
  if (std::any_of(a.begin(), a.end(), [](double g) { return !(g > 0); })) {
    card.preprocessing = list;
    return;
  }
  std::vector<double> mean, std;
  for (size_t c = 0; c < a.size(); ++c) {
    std.push_back(1.0 / a[c]);
    mean.push_back(-b[c] / a[c]);
  }
  if (a.size() > 1 || a[0] != 1.0 || b[0] != 0.0) card.mean = mean, card.std = std;
}

// An axis's id: as given, else the spec's default (its type; "x" for a space axis).
std::string axisId(const YAML::Node& axis) {
  if (axis["id"]) return axis["id"].as<std::string>();
  const std::string type = axis["type"] ? axis["type"].as<std::string>() : "?";
  return type == "space" ? "x" : type;
}

// An axis list's types and ids as "batch,channel,y,x".
std::string axesText(const YAML::Node& axes) {
  std::string text;
  for (const auto& axis : axes) {
    const std::string type = axis["type"] ? axis["type"].as<std::string>() : "?";
    text += (text.empty() ? "" : ",") + (type == "space" ? axisId(axis) : type);
  }
  return text;
}

// The window side an input space axis takes: a fixed size, or of {min, step} the first at least 256 px
// (tiler's default window).
int64_t axisSize(const YAML::Node& axis, const std::string& rdf) {
  const YAML::Node size = axis["size"];
  TILER_CHECK(size, ConfigError, "'" << rdf << "': input axis " << axisId(axis) << " has no size");
  if (size.IsScalar()) return size.as<int64_t>();
  TILER_CHECK(size["min"] && size["step"], ConfigError,
              "'" << rdf << "': input axis " << axisId(axis)
                  << "'s size refers to another tensor; tiler takes a fixed size or {min, step}");
  const int64_t min = size["min"].as<int64_t>(), step = size["step"].as<int64_t>();
  if (step <= 0 || min >= 256) return min;
  return min + step * ((256 - min + step - 1) / step);
}

std::optional<double> micrometresOf(const YAML::Node& axis, const std::string& rdf) {
  if (!axis["unit"]) return std::nullopt;
  const std::string unit = axis["unit"].as<std::string>();
  const double scale = axis["scale"] ? axis["scale"].as<double>() : 1.0;
  if (unit == "micrometer") return scale;
  if (unit == "nanometer") return scale / 1000.0;
  if (unit == "millimeter") return scale * 1000.0;
  TILER_THROW(ConfigError, "'" << rdf << "': input axis unit " << unit
                               << " is not one tiler takes (micrometer, nanometer, millimeter)");
}

void readInput(const YAML::Node& input, const std::string& rdf, const Package& pkg, ModelCard& card) {
  refuseUnknownKeys(
      input,
      {"id", "description", "axes", "test_tensor", "sample_tensor", "data", "optional", "preprocessing"}, rdf,
      "inputs[0] ");
  const YAML::Node axes = input["axes"];
  TILER_CHECK(axes && axes.IsSequence() && axesText(axes) == "batch,channel,y,x", ConfigError,
              "'" << rdf << "': inputs[0].axes are " << (axes ? axesText(axes) : "missing")
                  << "; tiler feeds batch,channel,y,x");
  const int64_t h = axisSize(axes[2], rdf), w = axisSize(axes[3], rdf);
  TILER_CHECK(w > 0 && h > 0, ConfigError, "'" << rdf << "': input sizes must be positive");
  card.window = windowText(w, h);
  const auto mpp_y = micrometresOf(axes[2], rdf), mpp_x = micrometresOf(axes[3], rdf);
  TILER_CHECK(mpp_y == mpp_x, ConfigError,
              "'" << rdf << "': the y and x axes' scales differ; tiler's --mpp is one");
  if (mpp_x) card.mpp = *mpp_x;
  const std::vector<std::string> axis_ids = {"batch", axisId(axes[1]), axisId(axes[2]), axisId(axes[3])};
  card.input_id = input["id"] ? input["id"].as<std::string>() : "input";
  readPreprocessing(input["preprocessing"], rdf, axis_ids, card.input_id, card);
  card.test_input = joinPath(rdf, "inputs[0].test_tensor.source", input["test_tensor"]["source"], pkg);
  checkSha256(rdf, "inputs[0].test_tensor", input["test_tensor"], card.test_input, kMaxNpyBytes);
}

// The size along output space axis `axis` of the output of a window of `window` px (its card's input):
// a fixed size, or spec 0.5's reference to an input axis, reference.size * reference.scale / axis.scale +
// offset (a 2x upsampling model's output axis has half the input's scale). nullopt where the card leaves the
// size to the run ({min, step}, or another tensor's axis): the set-up checks the halo against the window the
// model gives.
std::optional<int64_t> outputAxisSize(const YAML::Node& axis, const YAML::Node& input,
                                      const std::string& window) {
  const YAML::Node size = axis["size"];
  if (size && size.IsScalar()) return size.as<int64_t>();
  if (!size || !size.IsMap() || !size["tensor_id"] || !size["axis_id"] || !input.IsMap()) return std::nullopt;
  const std::string input_id = input["id"] ? input["id"].as<std::string>() : "input",
                    ref_axis = size["axis_id"].as<std::string>();
  const YAML::Node axes = input["axes"];
  if (size["tensor_id"].as<std::string>() != input_id || !axes || !axes.IsSequence() || axes.size() != 4)
    return std::nullopt;
  const auto [w, h] = parseWindowSize(window);
  for (size_t k : {size_t(2), size_t(3)}) {
    if (axisId(axes[k]) != ref_axis) continue;
    const double ref_scale = axes[k]["scale"] ? axes[k]["scale"].as<double>() : 1.0,
                 scale = axis["scale"] ? axis["scale"].as<double>() : 1.0;
    if (!(ref_scale > 0) || !(scale > 0)) return std::nullopt;
    const int64_t offset = size["offset"] ? size["offset"].as<int64_t>() : 0;
    return std::llround(double(k == 2 ? h : w) * ref_scale / scale) + offset;
  }
  return std::nullopt;
}

// The output axes' halo (spec 0.5: `halo` on an output space axis), as one --halo: y's and x's alike; a
// halo elsewhere (a channel or time axis) is refused naming the axis, and so is one that leaves no core of
// the output window (of the input window card.window, readInput's, as outputAxisSize finds it).
void readHalo(const YAML::Node& axes, const YAML::Node& input, const std::string& rdf, ModelCard& card) {
  if (!axes || !axes.IsSequence()) return;
  std::optional<int64_t> y, x;
  std::string sizes;  // "y 128 px, x 128 px": the output window's known sides
  std::optional<int64_t> least;
  for (const auto& axis : axes) {
    if (!axis.IsMap() || !axis["halo"]) continue;
    const std::string type = axis["type"] ? axis["type"].as<std::string>() : "?", id = axisId(axis);
    TILER_CHECK(type == "space" && (id == "y" || id == "x"), ConfigError,
                "'" << rdf << "': outputs[0] axis '" << id << "' (" << type << ") has halo "
                    << axis["halo"].as<std::string>()
                    << "; tiler takes a halo on the output's space axes y and x only");
    const int64_t halo = axis["halo"].as<int64_t>();
    TILER_CHECK(halo >= 0, ConfigError,
                "'" << rdf << "': outputs[0] axis " << id << "'s halo " << halo << " is negative");
    (id == "y" ? y : x) = halo;
    if (const auto side = card.window ? outputAxisSize(axis, input, *card.window) : std::nullopt) {
      sizes += (sizes.empty() ? "" : ", ") + id + " " + std::to_string(*side) + " px";
      least = std::min(least.value_or(*side), *side);
    }
  }
  if (!y && !x) return;
  TILER_CHECK(y.value_or(0) == x.value_or(0), ConfigError,
              "'" << rdf << "': outputs[0]'s halo is " << y.value_or(0) << " on axis y and " << x.value_or(0)
                  << " on axis x; tiler's --halo is one band for both");
  const int64_t halo = y.value_or(0);
  TILER_CHECK(!least || 2 * halo < *least, ConfigError,
              "'" << rdf << "': outputs[0]'s halo " << halo << " is not less than half the output window ("
                  << sizes << ", of the input's " << card.window.value_or("") << " px): no window would keep "
                  << "a pixel");
  card.halo = halo;
}

void readOutput(const YAML::Node& output, const YAML::Node& input, const std::string& rdf, const Package& pkg,
                ModelCard& card) {
  refuseUnknownKeys(output,
                    {"id", "description", "axes", "test_tensor", "sample_tensor", "data", "postprocessing"},
                    rdf, "outputs[0] ");
  const YAML::Node axes = output["axes"];
  readHalo(axes, input, rdf, card);
  const std::string layout = axes ? axesText(axes) : "missing";
  TILER_CHECK(layout == "batch,channel,y,x" || layout == "batch,channel", ConfigError,
              "'" << rdf << "': outputs[0].axes are " << layout
                  << "; tiler reads batch,channel,y,x (segment) or batch,channel (classify)");
  card.task = layout == "batch,channel" ? "classify" : "segment";
  const YAML::Node names = axes[1]["channel_names"];
  if (names && names.IsSequence() && names.size() > 1)
    card.classes = classesText(names.as<std::vector<std::string>>(), rdf, "output channel name");
  // A leading sigmoid or softmax is --activation (which a flag overrides, and which sets the label
  // threshold); the steps after it are applied to each window's output after it.
  card.activation = "none";
  auto steps =
      readSteps(output["postprocessing"], rdf, "outputs[0].postprocessing", {"batch", "channel", "y", "x"},
                card.input_id, output["id"] ? output["id"].as<std::string>() : "output", false);
  if (!steps.empty() && (steps[0].id == "sigmoid" || steps[0].id == "softmax")) {
    card.activation = steps[0].id;
    steps.erase(steps.begin());
  }
  card.postprocessing = steps;
  card.test_output = joinPath(rdf, "outputs[0].test_tensor.source", output["test_tensor"]["source"], pkg);
  checkSha256(rdf, "outputs[0].test_tensor", output["test_tensor"], card.test_output, kMaxNpyBytes);
}

void readWeights(const YAML::Node& weights, const std::string& rdf, const Package& pkg, ModelCard& card) {
  TILER_CHECK(weights && weights.IsMap(), ConfigError, "'" << rdf << "': weights is missing");
  std::string formats;
  for (const auto& kv : weights) formats += (formats.empty() ? "" : ", ") + kv.first.as<std::string>();
  // A state dict runs only with its Python architecture: one command makes TorchScript weights of it.
  TILER_CHECK(weights["torchscript"] || !weights["pytorch_state_dict"], ConfigError,
              "'" << rdf << "': weights has " << formats
                  << " only; tiler runs torchscript weights: convert the pytorch_state_dict with "
                     "scripts/export_model.py --card "
                  << (pkg.archive ? pkg.zip : rdf));
  TILER_CHECK(weights["torchscript"], ConfigError,
              "'" << rdf << "': weights has " << formats << " only; tiler runs torchscript weights");
  card.weights = joinPath(rdf, "weights.torchscript.source", weights["torchscript"]["source"], pkg);
  // Checked where the weights are loaded, on the bytes loaded: read once, never hashed here and read again.
  card.weights_sha256 = statedSha256(rdf, "weights.torchscript", weights["torchscript"]);
}

// config.bioimageio.reproducibility_tolerance: the first entry for torchscript weights and this output.
void readTolerance(const YAML::Node& config, const std::string& output_id, ModelCard& card) {
  if (!config || !config["bioimageio"] || !config["bioimageio"]["reproducibility_tolerance"]) return;
  for (const auto& entry : config["bioimageio"]["reproducibility_tolerance"]) {
    auto applies = [&](const char* field, const std::string& value) {
      if (!entry[field] || entry[field].size() == 0) return true;
      const auto list = entry[field].as<std::vector<std::string>>();
      return std::find(list.begin(), list.end(), value) != list.end();
    };
    if (!applies("weights_formats", "torchscript") || !applies("output_ids", output_id)) continue;
    if (entry["relative_tolerance"]) card.tolerance.relative = entry["relative_tolerance"].as<double>();
    if (entry["absolute_tolerance"]) card.tolerance.absolute = entry["absolute_tolerance"].as<double>();
    if (entry["mismatched_elements_per_million"])
      card.tolerance.mismatched_per_million = entry["mismatched_elements_per_million"].as<double>();
    return;
  }
}

// ---- bioimage.io 0.4 to 0.5 ----
// As bioimageio.spec converts a 0.4 description (model/v0_5.py: convert_axes, _convert_proc, _ModelConv), at
// the YAML level, so that everything after reads one shape. What 0.5 has no field for and does not change how
// the model is fed (download_url, rdf_source, sample files) is dropped.

// A 0.4 axis letter's type and 0.5 id.
std::string axisType04(char letter) {
  switch (letter) {
    case 'b':
      return "batch";
    case 'c':
      return "channel";
    case 't':
      return "time";
    case 'i':
      return "index";
    case 'x':
    case 'y':
    case 'z':
      return "space";
    default:
      return "";
  }
}
std::string axisId04(char letter) {
  const std::string type = axisType04(letter);
  return type == "space" ? std::string(1, letter) : type;
}

// 0.4's axes letters ("yx") as 0.5 axis ids (["y", "x"]), in their order.
YAML::Node axisIds04(const std::string& letters) {
  YAML::Node ids(YAML::NodeType::Sequence);
  for (char letter : letters) ids.push_back(axisId04(letter));
  return ids;
}

// The one axis of a tensor that `letters` and batch leave: the axis a step's per-channel lists run along.
std::optional<std::string> complementAxis04(const std::string& tensor_axes, const std::string& letters,
                                            const std::string& rdf, const std::string& field) {
  std::string left;
  for (char a : tensor_axes)
    if (a != 'b' && letters.find(a) == std::string::npos) left += a;
  TILER_CHECK(left.size() <= 1, ConfigError,
              "'" << rdf << "': " << field << ".kwargs.axes '" << letters << "' of tensor axes '"
                  << tensor_axes << "' leaves axes '" << left
                  << "'; spec 0.5 takes one axis for per-axis values");
  if (left.empty()) return std::nullopt;
  return axisId04(left[0]);
}

void copyKeys(const YAML::Node& from, YAML::Node& to, std::initializer_list<const char*> keys) {
  for (const char* key : keys)
    if (from[key]) to[key] = YAML::Clone(from[key]);
}

// A 0.4 pre- or postprocessing step in 0.5's shape: `name` becomes `id`, letters axis ids,
// zero_mean_unit_variance of mode fixed the step fixed_zero_mean_unit_variance. A name 0.4 lacks keeps its
// name as id: the reader refuses it by name.
YAML::Node upgradeStep04(const YAML::Node& step, const std::string& tensor_axes, const std::string& rdf,
                         const std::string& field) {
  TILER_CHECK(step.IsMap() && step["name"] && step["name"].IsScalar(), ConfigError,
              "'" << rdf << "': " << field << " has no name (spec 0.4)");
  const std::string name = step["name"].as<std::string>();
  const YAML::Node kw = step["kwargs"] ? step["kwargs"] : YAML::Node(YAML::NodeType::Map);
  const std::string letters = kw["axes"] && kw["axes"].IsScalar() ? kw["axes"].as<std::string>() : "";
  YAML::Node out(YAML::NodeType::Map), kwargs(YAML::NodeType::Map);
  out["id"] = name;
  if (name == "binarize") {
    copyKeys(kw, kwargs, {"threshold"});
  } else if (name == "clip") {
    copyKeys(kw, kwargs, {"min", "max"});
  } else if (name == "sigmoid") {
  } else if (name == "scale_linear") {
    copyKeys(kw, kwargs, {"gain", "offset"});
    if (kw["axes"])
      if (const auto axis = complementAxis04(tensor_axes, letters, rdf, field)) kwargs["axis"] = *axis;
  } else if (name == "scale_mean_variance") {
    // per_dataset kept for the reader to refuse by name, as below.
    copyKeys(kw, kwargs, {"reference_tensor", "eps"});
    if (kw["mode"] && kw["mode"].as<std::string>() != "per_sample") copyKeys(kw, kwargs, {"mode"});
    if (kw["axes"]) kwargs["axes"] = axisIds04(letters);
  } else if (name == "zero_mean_unit_variance" && (!kw["mode"] || kw["mode"].as<std::string>() == "fixed")) {
    // 0.4's default mode is fixed: the card's own mean and std, not the image's.
    TILER_CHECK(kw["mean"] && kw["std"], ConfigError,
                "'" << rdf << "': " << field << " (zero_mean_unit_variance) of mode fixed"
                    << (kw["mode"] ? "" : " (0.4's default)") << " gives no "
                    << (kw["mean"] ? "std" : "mean"));
    out["id"] = "fixed_zero_mean_unit_variance";
    copyKeys(kw, kwargs, {"mean", "std"});
    if (kw["axes"])
      if (const auto axis = complementAxis04(tensor_axes, letters, rdf, field)) kwargs["axis"] = *axis;
  } else if (name == "zero_mean_unit_variance" || name == "scale_range") {
    // bioimageio.spec turns 0.4's per_dataset into a reduction over the batch axis too; a batch here is one
    // image, so the mode is kept for the reader to refuse by name rather than run on each image's own.
    copyKeys(kw, kwargs, {"eps", "min_percentile", "max_percentile", "reference_tensor"});
    if (kw["mode"] && kw["mode"].as<std::string>() != "per_sample") copyKeys(kw, kwargs, {"mode"});
    if (kw["axes"]) kwargs["axes"] = axisIds04(letters);
  } else {
    kwargs = YAML::Clone(kw);
  }
  if (kwargs.size() > 0) out["kwargs"] = kwargs;
  return out;
}

const std::set<std::string>& tensorFields04(bool input) {
  static const std::set<std::string> in = {"name",       "description", "axes",         "data_type",
                                           "data_range", "shape",       "preprocessing"},
                                     out = {"name",       "description", "axes", "data_type",
                                            "data_range", "shape",       "halo", "postprocessing"};
  return input ? in : out;
}

// The sizes of the 0.4 inputs' axes by tensor name and letter (a parameterized size: its min), for an output
// shape that refers to them.
using SizeRefs04 = std::map<std::string, std::map<char, double>>;

// A 0.4 tensor (axes letters, shape, halo) in 0.5's shape: axis objects with their sizes, `name` as `id`, the
// test tensor `test_source` as test_tensor.source.
YAML::Node upgradeTensor04(const YAML::Node& t, bool input, size_t index, const YAML::Node& test_source,
                           const SizeRefs04& refs, const std::string& rdf) {
  const std::string where = std::string(input ? "inputs[" : "outputs[") + std::to_string(index) + "]";
  TILER_CHECK(t.IsMap(), ConfigError, "'" << rdf << "': " << where << " is not a mapping");
  refuseUnknownKeys(t, tensorFields04(input), rdf, where + " ", "0.4");
  TILER_CHECK(t["axes"] && t["axes"].IsScalar(), ConfigError,
              "'" << rdf << "': " << where << ".axes is missing (spec 0.4: letters such as bcyx)");
  const std::string axes = t["axes"].as<std::string>();
  for (char a : axes)
    TILER_CHECK(!axisType04(a).empty(), ConfigError,
                "'" << rdf << "': " << where << ".axes '" << axes << "': '" << a
                    << "' is not an axis of spec 0.4 (b, c, t, i, x, y, z)");
  const YAML::Node shape = t["shape"];
  TILER_CHECK(shape, ConfigError, "'" << rdf << "': " << where << ".shape is missing");
  const bool fixed = shape.IsSequence(), parameterized = shape.IsMap() && shape["min"] && shape["step"],
             referred = shape.IsMap() && shape["reference_tensor"];
  TILER_CHECK(fixed || (input && parameterized) || (!input && referred), ConfigError,
              "'" << rdf << "': " << where << ".shape is neither a list of sizes nor "
                  << (input ? "{min, step}" : "{reference_tensor, scale, offset}"));
  auto listOf = [&](const YAML::Node& node, const char* what) {
    TILER_CHECK(
        node && node.IsSequence() && node.size() == axes.size(), ConfigError,
        "'" << rdf << "': " << where << "." << what << " must list one number per axis of '" << axes << "'");
    // A null scale is 0.4's new axis of 2 x offset, as a scale of 0.
    std::vector<double> values;
    for (const auto& v : node) values.push_back(v.IsNull() ? 0.0 : v.as<double>());
    return values;
  };
  const std::vector<double> sizes = fixed ? listOf(shape, "shape") : std::vector<double>{},
                            mins = parameterized ? listOf(shape["min"], "shape.min") : std::vector<double>{},
                            steps =
                                parameterized ? listOf(shape["step"], "shape.step") : std::vector<double>{},
                            scales = referred ? listOf(shape["scale"], "shape.scale") : std::vector<double>{},
                            offsets =
                                referred ? listOf(shape["offset"], "shape.offset") : std::vector<double>{},
                            halo =
                                t["halo"] ? listOf(t["halo"], "halo") : std::vector<double>(axes.size(), 0);
  std::string ref_tensor = referred ? shape["reference_tensor"].as<std::string>() : "", ref_axis;
  if (const size_t dot = ref_tensor.find('.'); dot != std::string::npos)
    ref_axis = ref_tensor.substr(dot + 1), ref_tensor = ref_tensor.substr(0, dot);
  YAML::Node out(YAML::NodeType::Map), axis_list(YAML::NodeType::Sequence);
  if (t["name"]) out["id"] = YAML::Clone(t["name"]);
  if (t["description"]) out["description"] = YAML::Clone(t["description"]);
  for (size_t i = 0; i < axes.size(); ++i) {
    const char a = axes[i];
    const std::string type = axisType04(a);
    YAML::Node axis(YAML::NodeType::Map);
    axis["type"] = type;
    TILER_CHECK(halo[i] == 0 || type == "space", ConfigError,
                "'" << rdf << "': " << where << ".halo gives the " << type << " axis a halo of " << halo[i]
                    << "; a halo lies on space axes");
    if (type == "batch") {
      axis_list.push_back(axis);
      continue;
    }
    if (type != "space" && type != "channel") axis["id"] = type;
    if (type == "space") axis["id"] = std::string(1, a);
    // This axis's size: fixed, {min, step} or a reference to an input's axis.
    YAML::Node size;
    int64_t fixed_size = -1;
    if (fixed) {
      fixed_size = int64_t(sizes[i]);
    } else if (parameterized) {
      if (steps[i] == 0) {
        fixed_size = int64_t(mins[i]);
      } else {
        TILER_CHECK(type == "space", ConfigError,
                    "'" << rdf << "': " << where << ".shape.step gives the " << type
                        << " axis a step; tiler steps space axes only");
        size["min"] = int64_t(mins[i]);
        size["step"] = int64_t(steps[i]);
      }
    } else if (scales[i] == 0) {
      fixed_size = int64_t(2 * offsets[i]);  // 0.4's way to make an axis the reference lacks
    } else if (type == "channel") {
      const char from = ref_axis.empty() ? a : ref_axis[0];
      const auto tensor = refs.find(ref_tensor);
      TILER_CHECK(tensor != refs.end() && tensor->second.count(from), ConfigError,
                  "'" << rdf << "': " << where << ".shape.reference_tensor '" << ref_tensor
                      << "' is no input with a '" << from << "' axis");
      fixed_size = int64_t(scales[i] * tensor->second.at(from) + 2 * offsets[i]);
    } else {
      size["tensor_id"] = ref_tensor;
      size["axis_id"] = ref_axis.empty() ? axisId04(a) : ref_axis;
      if (offsets[i] != 0) size["offset"] = int64_t(2 * offsets[i]);
      if (scales[i] != 1) axis["scale"] = 1.0 / scales[i];
    }
    if (type == "channel") {
      TILER_CHECK(fixed_size > 0, ConfigError,
                  "'" << rdf << "': " << where << "'s channel axis has " << fixed_size << " channels");
      YAML::Node names(YAML::NodeType::Sequence);
      for (int64_t c = 0; c < fixed_size; ++c) names.push_back("channel" + std::to_string(c));
      axis["channel_names"] = names;
    } else {
      axis["size"] = fixed_size >= 0 ? YAML::Node(fixed_size) : size;
    }
    if (halo[i] != 0) axis["halo"] = int64_t(halo[i]);
    axis_list.push_back(axis);
  }
  out["axes"] = axis_list;
  YAML::Node test(YAML::NodeType::Map);
  test["source"] = YAML::Clone(test_source);
  out["test_tensor"] = test;
  if (t["data_type"]) {
    YAML::Node data(YAML::NodeType::Map);
    data["type"] = YAML::Clone(t["data_type"]);
    if (t["data_range"]) data["range"] = YAML::Clone(t["data_range"]);
    out["data"] = data;
  }
  const char* steps_field = input ? "preprocessing" : "postprocessing";
  if (t[steps_field]) {
    TILER_CHECK(t[steps_field].IsSequence(), ConfigError,
                "'" << rdf << "': " << where << "." << steps_field << " is not a list");
    YAML::Node converted(YAML::NodeType::Sequence);
    for (size_t k = 0; k < t[steps_field].size(); ++k)
      converted.push_back(upgradeStep04(t[steps_field][k], axes, rdf,
                                        where + "." + steps_field + "[" + std::to_string(k) + "]"));
    out[steps_field] = converted;
  }
  return out;
}

// A 0.4 weights entry in 0.5's shape: pytorch_state_dict's "file.py:Name" or "module.Name" architecture with
// its sha256 and kwargs as one architecture mapping, "conda:env.yaml" dependencies as a file.
YAML::Node upgradeWeights04(const YAML::Node& weights) {
  if (!weights || !weights.IsMap()) return weights;
  YAML::Node out = YAML::Clone(weights);
  YAML::Node sd = out["pytorch_state_dict"];
  if (!sd || !sd.IsMap()) return out;
  if (sd["architecture"] && sd["architecture"].IsScalar()) {
    const std::string arch = sd["architecture"].as<std::string>();
    YAML::Node a(YAML::NodeType::Map);
    if (const size_t colon = arch.rfind(':'); colon != std::string::npos) {
      a["source"] = arch.substr(0, colon);
      a["callable"] = arch.substr(colon + 1);
      if (sd["architecture_sha256"]) a["sha256"] = YAML::Clone(sd["architecture_sha256"]);
    } else {
      const size_t dot = arch.rfind('.');
      a["import_from"] = dot == std::string::npos ? "" : arch.substr(0, dot);
      a["callable"] = dot == std::string::npos ? arch : arch.substr(dot + 1);
    }
    if (sd["kwargs"]) a["kwargs"] = YAML::Clone(sd["kwargs"]);
    sd.remove("architecture_sha256");
    sd.remove("kwargs");
    sd["architecture"] = a;
  }
  if (sd["dependencies"] && sd["dependencies"].IsScalar()) {
    std::string deps = sd["dependencies"].as<std::string>();
    if (deps.rfind("conda:", 0) == 0) deps = deps.substr(6);
    YAML::Node file(YAML::NodeType::Map);
    file["source"] = deps;
    sd["dependencies"] = file;
  }
  return out;
}

YAML::Node upgradeRdf04(const YAML::Node& rdf, const std::string& rdf_path) {
  static const std::set<std::string> fields04 = {
      "format_version", "type",     "name",        "description",  "authors",
      "attachments",    "cite",     "config",      "covers",       "documentation",
      "download_url",   "git_repo", "icon",        "id",           "id_emoji",
      "inputs",         "license",  "links",       "maintainers",  "outputs",
      "packaged_by",    "parent",   "rdf_source",  "run_mode",     "sample_inputs",
      "sample_outputs", "tags",     "test_inputs", "test_outputs", "timestamp",
      "training_data",  "uploader", "version",     "weights",      "badges",
      "dependencies"};
  refuseUnknownKeys(rdf, fields04, rdf_path, "", "0.4");
  YAML::Node out(YAML::NodeType::Map);
  static const std::set<std::string> dropped = {
      "format_version", "download_url", "rdf_source", "sample_inputs", "sample_outputs", "test_inputs",
      "test_outputs",   "inputs",       "outputs",    "weights",       "attachments",    "dependencies"};
  for (const auto& kv : rdf) {
    const std::string key = kv.first.as<std::string>();
    if (!dropped.count(key)) out[key] = YAML::Clone(kv.second);
  }
  out["format_version"] = "0.5.0";
  if (rdf["attachments"] && rdf["attachments"].IsMap() && rdf["attachments"]["files"]) {
    YAML::Node files(YAML::NodeType::Sequence);
    for (const auto& f : rdf["attachments"]["files"]) {
      YAML::Node file(YAML::NodeType::Map);
      file["source"] = YAML::Clone(f);
      files.push_back(file);
    }
    out["attachments"] = files;
  }
  SizeRefs04 refs;
  for (const char* io : {"inputs", "outputs"}) {
    const bool input = std::string(io) == "inputs";
    const char* tests = input ? "test_inputs" : "test_outputs";
    const YAML::Node tensors = rdf[io];
    TILER_CHECK(tensors && tensors.IsSequence(), ConfigError,
                "'" << rdf_path << "': " << io << " is missing");
    // A tensor's own fields first: a 0.5 card labelled 0.4 is told by its tensors' ids.
    for (size_t k = 0; k < tensors.size(); ++k)
      if (tensors[k].IsMap())
        refuseUnknownKeys(tensors[k], tensorFields04(input), rdf_path,
                          std::string(io) + "[" + std::to_string(k) + "] ", "0.4");
    TILER_CHECK(rdf[tests] && rdf[tests].IsSequence() && rdf[tests].size() == tensors.size(), ConfigError,
                "'" << rdf_path << "': " << tests << " must name one .npy file per tensor of " << io
                    << " (spec 0.4)");
    if (input)
      for (const auto& t : tensors) {
        if (!t["name"] || !t["axes"] || !t["axes"].IsScalar() || !t["shape"]) continue;
        const std::string axes = t["axes"].as<std::string>();
        const YAML::Node sizes = t["shape"].IsMap() ? t["shape"]["min"] : t["shape"];
        if (!sizes || !sizes.IsSequence() || sizes.size() != axes.size()) continue;
        for (size_t i = 0; i < axes.size(); ++i)
          refs[t["name"].as<std::string>()][axes[i]] = sizes[i].as<double>();
      }
    YAML::Node converted(YAML::NodeType::Sequence);
    for (size_t k = 0; k < tensors.size(); ++k)
      converted.push_back(upgradeTensor04(tensors[k], input, k, rdf[tests][k], refs, rdf_path));
    out[io] = converted;
  }
  if (rdf["weights"]) out["weights"] = upgradeWeights04(rdf["weights"]);
  return out;
}

const std::set<std::string>& rdfTopLevelFields() {
  static const std::set<std::string> fields = {"type",     "format_version", "id",
                                               "id_emoji", "name",           "description",
                                               "authors",  "attachments",    "cite",
                                               "license",  "git_repo",       "icon",
                                               "links",    "uploader",       "maintainers",
                                               "tags",     "version",        "version_comment",
                                               "covers",   "badges",         "documentation",
                                               "inputs",   "outputs",        "packaged_by",
                                               "parent",   "timestamp",      "training_data",
                                               "weights",  "config"};
  return fields;
}

// A top-level field that must be a string ("" when absent); a list or mapping there is refused naming it.
std::string scalarField(const YAML::Node& rdf, const char* field, const std::string& rdf_path) {
  const YAML::Node node = rdf[field];
  if (!node) return "";
  TILER_CHECK(node.IsScalar(), ConfigError,
              "'" << rdf_path << "': field '" << field << "' must be a string, not a "
                  << (node.IsSequence() ? "list"
                      : node.IsMap()    ? "mapping"
                                        : "null"));
  return node.Scalar();
}

}  // namespace

namespace {

// The spec versions a card's format_version may name: 0.4.x is read as its 0.5 conversion.
void refuseOtherVersions(const std::string& version, const std::string& rdf_path) {
  const std::string how =
      "; tiler reads spec 0.4 and 0.5 descriptions: convert it with bioimageio.core's `bioimageio "
      "update-format` "
      "(or export the model again with a current bioimageio.core)";
  TILER_CHECK(
      !version.empty(), ConfigError,
      "'" << rdf_path << "': no format_version (a description older than spec 0.2, or not one)" << how);
  TILER_CHECK(version.rfind("0.4.", 0) == 0 || version.rfind("0.5.", 0) == 0, ConfigError,
              "'" << rdf_path << "': format_version '" << version << "'" << how);
}

// A card's text as YAML within the bounds of a card, and its format_version, checked before anything else.
YAML::Node loadRdf(const std::string& text, const std::string& rdf_path, std::string& version) {
  YAML::Node rdf;
  try {
    rdf = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    TILER_THROW(ConfigError, "'" << rdf_path << "': not a YAML model description: " << e.what());
  }
  int64_t budget = kMaxCardExpandedBytes;
  TILER_CHECK(yamlFitsExpanded(rdf, budget), ConfigError,
              "'" << rdf_path << "': with its aliases expanded it holds over "
                  << byteSizeText(kMaxCardExpandedBytes) << "; a model card is far smaller");
  TILER_CHECK(rdf.IsMap(), ConfigError, "'" << rdf_path << "': not a YAML mapping");
  // The version first: an older card's other fields differ (0.3 had no type).
  version = scalarField(rdf, "format_version", rdf_path);
  refuseOtherVersions(version, rdf_path);
  return rdf;
}

// A card's text read as a model description: `rdf_path` names it in messages, `pkg` holds its files.
ModelCard readRdfText(const std::string& text, const std::string& rdf_path, const Package& pkg) {
  std::string version;
  YAML::Node rdf = loadRdf(text, rdf_path, version);
  const std::string type = scalarField(rdf, "type", rdf_path);
  TILER_CHECK(type == "model", ConfigError, "'" << rdf_path << "': type '" << type << "' is not a model");
  ModelCard card;
  card.kind = "bioimageio";
  card.path = rdf_path;
  try {
    if (version.rfind("0.4.", 0) == 0) rdf = upgradeRdf04(rdf, rdf_path);
    TILER_CHECK(!rdf["run_mode"], ConfigError,
                "'" << rdf_path
                    << "': field 'run_mode' asks for a way to run the "
                       "model that tiler does not have");
    refuseUnknownKeys(rdf, rdfTopLevelFields(), rdf_path, "");
    for (const char* io : {"inputs", "outputs"})
      TILER_CHECK(rdf[io] && rdf[io].IsSequence() && rdf[io].size() == 1, ConfigError,
                  "'" << rdf_path << "': " << io << " must hold one tensor; tiler feeds and reads one");
    readInput(rdf["inputs"][0], rdf_path, pkg, card);
    readOutput(rdf["outputs"][0], rdf["inputs"][0], rdf_path, pkg, card);
    readWeights(rdf["weights"], rdf_path, pkg, card);
    const YAML::Node output_id = rdf["outputs"][0]["id"];
    readTolerance(rdf["config"], output_id ? output_id.as<std::string>() : "output", card);
  } catch (const YAML::Exception& e) {
    TILER_THROW(ConfigError, "'" << rdf_path << "': " << e.what());
  }
  return card;
}

// The card of a zip package: as bioimageio.spec finds it (rdf.yaml, bioimageio.yaml, model.yaml, or a name
// ending in "." and one of them), at the archive's root or in its one top folder.
std::string cardMember(const ZipArchive& archive) {
  const std::vector<std::string> names = archive.names();
  std::string top;
  bool one_top = !names.empty();
  for (const auto& name : names) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos) one_top = false;
    const std::string first = name.substr(0, slash + 1);
    if (top.empty()) top = first;
    if (first != top) one_top = false;
  }
  for (const std::string& folder : {std::string(), one_top ? top : std::string("\n")})
    for (const char* card : {"rdf.yaml", "bioimageio.yaml", "model.yaml"})
      for (const auto& name : names) {
        if (name.compare(0, folder.size(), folder) != 0) continue;
        const std::string rest = name.substr(folder.size());
        if (rest.find('/') != std::string::npos) continue;
        const std::string dotted = std::string(".") + card;
        if (rest == card || (rest.size() > dotted.size() &&
                             rest.compare(rest.size() - dotted.size(), dotted.size(), dotted) == 0))
          return name;
      }
  TILER_THROW(ConfigError,
              "'" << archive.path()
                  << "': no rdf.yaml or bioimageio.yaml (or NAME.rdf.yaml, NAME.bioimageio.yaml) "
                     "at the archive's root or in its one top folder: not a bioimage.io package");
}

}  // namespace

ModelCard readBioimageioRdf(const std::string& rdf_path) {
  return readRdfText(cardText(rdf_path), rdf_path, Package{});
}

std::string bioimageioAs05(const std::string& rdf_path) {
  std::string version;
  YAML::Node rdf = loadRdf(cardText(rdf_path), rdf_path, version);
  try {
    if (version.rfind("0.4.", 0) == 0) rdf = upgradeRdf04(rdf, rdf_path);
  } catch (const YAML::Exception& e) {
    TILER_THROW(ConfigError, "'" << rdf_path << "': " << e.what());
  }
  YAML::Emitter out;
  out << rdf;
  return out.c_str();
}

ModelCard readBioimageioZip(const std::string& zip_path) {
  Package pkg;
  pkg.zip = zip_path;
  pkg.archive = std::make_shared<ZipArchive>(zip_path);
  const std::string member = cardMember(*pkg.archive);
  pkg.folder = member.substr(0, member.rfind('/') + 1);
  const std::string rdf_path = zipMemberPath(zip_path, member);
  return readRdfText(pkg.archive->readAll(member, kMaxCardBytes), rdf_path, pkg);
}

std::optional<ModelCard> findModelCard(const std::string& model) {
  if (model.empty()) return std::nullopt;
  std::error_code ec;
  if (fs::is_directory(model, ec)) {
    // Whatever stands at the card's name is the card: a FIFO or a device there is refused naming it.
    for (const char* name : {"rdf.yaml", "bioimageio.yaml"})
      if (fs::exists(fs::symlink_status(fs::path(model) / name, ec)))
        return readBioimageioRdf((fs::path(model) / name).string());
    // A WSInfer zoo model as Hugging Face holds it: config.json beside torchscript_model.pt.
    const fs::path config = fs::path(model) / "config.json",
                   weights = fs::path(model) / "torchscript_model.pt";
    if (fs::is_regular_file(config, ec) && fs::is_regular_file(weights, ec))
      return readWsinferConfig(config.string(), weights.string());
    TILER_THROW(ConfigError,
                "-m '" << model
                       << "' is a directory without rdf.yaml or bioimageio.yaml (bioimage.io), or "
                          "config.json and torchscript_model.pt (WSInfer)");
  }
  std::string ext = fs::path(model).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](char c) { return std::tolower(c); });
  if (ext == ".yaml" || ext == ".yml") return readBioimageioRdf(model);
  if (ext == ".zip") return readBioimageioZip(model);
  const fs::path config = fs::path(model).parent_path() / "config.json";
  if (!fs::is_regular_file(config, ec)) return std::nullopt;
  // Another tool's config.json beside the model is no card: WSInfer's has its spacing and patch size.
  std::string why;
  const auto text = readDocument(config.string(), kMaxCardBytes, why);
  const auto j = text ? parseJsonDocument(*text, why) : std::nullopt;
  if (!j || !j->is_object() || (!j->contains("spacing_um_px") && !j->contains("patch_size_pixels")))
    return std::nullopt;
  return readWsinferConfig(config.string(), model);
}

const std::vector<std::string>& cardSettingNames() {
  static const std::vector<std::string> names = {"window",  "mpp",        "scale", "mean", "std",
                                                 "classes", "activation", "task",  "halo"};
  return names;
}

void checkCardNumbers(const ModelCard& card) {
  const auto normal = [](double v) {
    return std::isfinite(v) && (v == 0 || std::abs(v) >= kLeastCardNumber);
  };
  if (card.mpp)
    TILER_CHECK(normal(*card.mpp) && *card.mpp > 0, ConfigError,
                "'" << card.path << "': its pixel size " << *card.mpp << " µm is not a positive number");
  if (card.scale)
    TILER_CHECK(normal(*card.scale) && *card.scale > 0, ConfigError,
                "'" << card.path << "': its input scale " << *card.scale << " is not a positive number");
  if (card.halo)
    TILER_CHECK(*card.halo >= 0, ConfigError,
                "'" << card.path << "': its output halo " << *card.halo << " px is negative");
  for (size_t c = 0; card.mean && c < card.mean->size(); ++c)
    TILER_CHECK(normal((*card.mean)[c]), ConfigError,
                "'" << card.path << "': its normalisation's mean " << (*card.mean)[c] << " (channel " << c
                    << ") is not a finite number");
  for (size_t c = 0; card.std && c < card.std->size(); ++c)
    TILER_CHECK(normal((*card.std)[c]) && (*card.std)[c] > 0, ConfigError,
                "'" << card.path << "': its normalisation's std " << (*card.std)[c] << " (channel " << c
                    << ") is not a positive number of at least " << kLeastCardNumber);
}

std::vector<std::pair<std::string, std::string>> applyModelCard(const ModelCard& card,
                                                                const std::set<std::string>& given,
                                                                const CardTargets& t) {
  checkCardNumbers(card);
  std::vector<std::pair<std::string, std::string>> from;
  auto take = [&](const std::string& name, const auto& value, auto* target) {
    if (given.count(name)) {
      from.emplace_back(name, "flag");
    } else if (value && target) {
      *target = *value;
      from.emplace_back(name, "card");
    } else {
      from.emplace_back(name, "default");
    }
  };
  take("window", card.window, t.window);
  take("mpp", card.mpp, t.mpp);
  take("scale", card.scale, t.scale);
  take("mean", card.mean, t.mean);
  take("std", card.std, t.std);
  take("classes", card.classes, t.classes);
  take("activation", card.activation, t.activation);
  take("task", card.task, t.task);
  take("halo", card.halo, t.halo);
  // The card's step lists have no flags: a run with a card follows them.
  if (t.preprocessing) *t.preprocessing = card.preprocessing;
  if (t.postprocessing) *t.postprocessing = card.postprocessing;
  return from;
}

std::string cardBlamed(std::string message,
                       const std::vector<std::pair<std::string, std::string>>& settings_from,
                       const std::string& card_path) {
  for (const auto& [setting, from] : settings_from) {
    if (from != "card") continue;
    const std::string flag = "--" + setting, named = "the model card's " + setting + " ('" + card_path + "')";
    for (size_t at = message.find(flag); at != std::string::npos; at = message.find(flag, at + 1)) {
      const size_t after = at + flag.size();
      if (after < message.size() && (std::isalnum(uint8_t(message[after])) || message[after] == '_'))
        continue;
      message.replace(at, flag.size(), named);
      at += named.size() - 1;
    }
  }
  return message;
}

}  // namespace tiler
