// model_card: WSInfer's config.json and bioimage.io's rdf.yaml (spec 0.5) read into the settings of the
// flags of the same names (see the header). YAML through yaml-cpp, JSON through nlohmann_json.
#include "tiler/model/model_card.hpp"

#include <yaml-cpp/yaml.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tiler/core/error.hpp"
#include "tiler/core/json_document.hpp"
#include "tiler/core/platform.hpp"

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

std::string joinPath(const std::string& rdf, const std::string& field, const YAML::Node& source) {
  TILER_CHECK(source && source.IsScalar(), ConfigError, "'" << rdf << "': " << field << " is missing");
  const std::string value = source.as<std::string>();
  TILER_CHECK(value.find("://") == std::string::npos, ConfigError,
              "'" << rdf << "': " << field << " is a URL (" << value
                  << "); tiler reads a package's files from its directory: download the package");
  // A package is its directory: a card that names a file elsewhere (an absolute path, ../, a link out of it)
  // would run or check against files that are not the package's.
  const fs::path p = fs::path(value).lexically_normal();
  const bool escapes = p.is_absolute() || p.empty() || *p.begin() == "..";
  TILER_CHECK(!escapes, ConfigError,
              "'" << rdf << "': " << field << " '" << value
                  << "' lies outside the package; a card names its files relative to its own directory");
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

void refuseUnknownKeys(const YAML::Node& node, const std::set<std::string>& known, const std::string& rdf,
                       const std::string& where) {
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    TILER_CHECK(known.count(key), ConfigError,
                "'" << rdf << "': " << where << "field '" << key << "' is not one tiler knows (spec 0.5)");
  }
}

// Per-channel y = a * x + b, the affine map a chain of fixed preprocessing steps makes.
struct Affine {
  std::vector<double> a{1.0}, b{0.0};
  void widen(size_t n) {
    if (a.size() == 1 && n > 1) a.assign(n, a[0]), b.assign(n, b[0]);
  }
};

std::vector<double> scalarOrList(const YAML::Node& node, double fallback) {
  if (!node) return {fallback};
  if (node.IsSequence()) return node.as<std::vector<double>>();
  return {node.as<double>()};
}

void applyStep(Affine& f, const std::vector<double>& gain, const std::vector<double>& offset,
               const std::string& rdf) {
  const size_t n = std::max(gain.size(), offset.size());
  TILER_CHECK(gain.size() == offset.size() || gain.size() == 1 || offset.size() == 1, ConfigError,
              "'" << rdf << "': a preprocessing step has " << gain.size() << " gains and " << offset.size()
                  << " offsets");
  TILER_CHECK(f.a.size() == 1 || n == 1 || f.a.size() == n, ConfigError,
              "'" << rdf << "': preprocessing steps give " << f.a.size() << " and " << n << " channels");
  f.widen(n);
  for (size_t c = 0; c < f.a.size(); ++c) {
    const double g = gain[gain.size() == 1 ? 0 : c], o = offset[offset.size() == 1 ? 0 : c];
    f.a[c] *= g;
    f.b[c] = f.b[c] * g + o;
  }
}

// inputs[0].preprocessing as --scale, --mean and --std: (x * scale - mean) / std.
void readPreprocessing(const YAML::Node& steps, const std::string& rdf, ModelCard& card) {
  Affine f;
  for (const auto& step : steps) {
    const std::string id = step["id"] ? step["id"].as<std::string>() : "";
    const YAML::Node kw = step["kwargs"] ? step["kwargs"] : YAML::Node(YAML::NodeType::Map);
    if (id == "ensure_dtype") {
      const std::string dtype = kw && kw["dtype"] ? kw["dtype"].as<std::string>() : "";
      TILER_CHECK(dtype == "float32" || dtype == "float64", ConfigError,
                  "'" << rdf << "': preprocessing ensure_dtype " << dtype << ": tiler feeds float32");
    } else if (id == "scale_linear") {
      applyStep(f, scalarOrList(kw["gain"], 1.0), scalarOrList(kw["offset"], 0.0), rdf);
    } else if (id == "fixed_zero_mean_unit_variance") {
      // bioimageio.core divides by std + 1e-6.
      std::vector<double> gain = scalarOrList(kw["std"], 1.0), offset = scalarOrList(kw["mean"], 0.0);
      for (double& g : gain) g = 1.0 / (g + 1e-6);
      for (size_t c = 0; c < offset.size(); ++c) offset[c] *= -gain[gain.size() == 1 ? 0 : c];
      applyStep(f, gain, offset, rdf);
    } else {
      TILER_THROW(
          ConfigError,
          "'" << rdf << "': preprocessing '" << id
              << "' is not a step tiler has (it normalises every window with fixed numbers: ensure_dtype "
                 "float32, scale_linear, fixed_zero_mean_unit_variance)");
    }
  }
  card.scale = 1.0;  // bioimage.io feeds the tensor's values as they are
  std::vector<double> mean, std;
  for (size_t c = 0; c < f.a.size(); ++c) {
    TILER_CHECK(f.a[c] > 0, ConfigError,
                "'" << rdf << "': preprocessing scales channel " << c << " by " << f.a[c]
                    << "; tiler's --std must be positive");
    std.push_back(1.0 / f.a[c]);
    mean.push_back(-f.b[c] / f.a[c]);
  }
  if (f.a.size() > 1 || f.a[0] != 1.0 || f.b[0] != 0.0) card.mean = mean, card.std = std;
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

void readInput(const YAML::Node& input, const std::string& rdf, ModelCard& card) {
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
  if (input["preprocessing"])
    readPreprocessing(input["preprocessing"], rdf, card);
  else
    readPreprocessing(YAML::Node(YAML::NodeType::Sequence), rdf, card);
  card.test_input = joinPath(rdf, "inputs[0].test_tensor.source", input["test_tensor"]["source"]);
}

void readOutput(const YAML::Node& output, const std::string& rdf, ModelCard& card) {
  refuseUnknownKeys(output,
                    {"id", "description", "axes", "test_tensor", "sample_tensor", "data", "postprocessing"},
                    rdf, "outputs[0] ");
  const YAML::Node axes = output["axes"];
  const std::string layout = axes ? axesText(axes) : "missing";
  TILER_CHECK(layout == "batch,channel,y,x" || layout == "batch,channel", ConfigError,
              "'" << rdf << "': outputs[0].axes are " << layout
                  << "; tiler reads batch,channel,y,x (segment) or batch,channel (classify)");
  card.task = layout == "batch,channel" ? "classify" : "segment";
  const YAML::Node names = axes[1]["channel_names"];
  if (names && names.IsSequence() && names.size() > 1)
    card.classes = classesText(names.as<std::vector<std::string>>(), rdf, "output channel name");
  card.activation = "none";
  for (const auto& step : output["postprocessing"]) {
    const std::string id = step["id"] ? step["id"].as<std::string>() : "";
    if (id == "sigmoid" || id == "softmax") {
      const YAML::Node kwargs = step["kwargs"];
      const std::string axis = kwargs && kwargs["axis"] ? kwargs["axis"].as<std::string>() : "channel";
      TILER_CHECK(
          axis == "channel", ConfigError,
          "'" << rdf << "': postprocessing " << id << " along " << axis << "; tiler's is along channel");
      card.activation = id;
    } else if (id != "ensure_dtype") {
      TILER_THROW(ConfigError, "'" << rdf << "': postprocessing '" << id
                                   << "' is not a step tiler has (sigmoid, softmax, ensure_dtype)");
    }
  }
  card.test_output = joinPath(rdf, "outputs[0].test_tensor.source", output["test_tensor"]["source"]);
}

void readWeights(const YAML::Node& weights, const std::string& rdf, ModelCard& card) {
  TILER_CHECK(weights && weights.IsMap(), ConfigError, "'" << rdf << "': weights is missing");
  std::string formats;
  for (const auto& kv : weights) formats += (formats.empty() ? "" : ", ") + kv.first.as<std::string>();
  TILER_CHECK(weights["torchscript"], ConfigError,
              "'" << rdf << "': weights has " << formats << " only; tiler runs torchscript weights");
  card.weights = joinPath(rdf, "weights.torchscript.source", weights["torchscript"]["source"]);
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

ModelCard readBioimageioRdf(const std::string& rdf_path) {
  YAML::Node rdf;
  try {
    rdf = YAML::Load(cardText(rdf_path));
  } catch (const YAML::Exception& e) {
    TILER_THROW(ConfigError, "'" << rdf_path << "': not a YAML model description: " << e.what());
  }
  int64_t budget = kMaxCardExpandedBytes;
  TILER_CHECK(yamlFitsExpanded(rdf, budget), ConfigError,
              "'" << rdf_path << "': with its aliases expanded it holds over "
                  << byteSizeText(kMaxCardExpandedBytes) << "; a model card is far smaller");
  TILER_CHECK(rdf.IsMap(), ConfigError, "'" << rdf_path << "': not a YAML mapping");
  // The version first: an older card's other fields differ (0.3 had no type).
  const std::string version = scalarField(rdf, "format_version", rdf_path);
  TILER_CHECK(version.rfind("0.5.", 0) == 0, ConfigError,
              "'" << rdf_path << "': format_version '" << version
                  << "': tiler reads spec 0.5 descriptions (bioimageio.spec converts older ones)");
  const std::string type = scalarField(rdf, "type", rdf_path);
  TILER_CHECK(type == "model", ConfigError, "'" << rdf_path << "': type '" << type << "' is not a model");
  TILER_CHECK(!rdf["run_mode"], ConfigError,
              "'" << rdf_path
                  << "': field 'run_mode' asks for a way to run the "
                     "model that tiler does not have");
  refuseUnknownKeys(rdf, rdfTopLevelFields(), rdf_path, "");
  ModelCard card;
  card.kind = "bioimageio";
  card.path = rdf_path;
  try {
    for (const char* io : {"inputs", "outputs"})
      TILER_CHECK(rdf[io] && rdf[io].IsSequence() && rdf[io].size() == 1, ConfigError,
                  "'" << rdf_path << "': " << io << " must hold one tensor; tiler feeds and reads one");
    readInput(rdf["inputs"][0], rdf_path, card);
    readOutput(rdf["outputs"][0], rdf_path, card);
    readWeights(rdf["weights"], rdf_path, card);
    const YAML::Node output_id = rdf["outputs"][0]["id"];
    readTolerance(rdf["config"], output_id ? output_id.as<std::string>() : "output", card);
  } catch (const YAML::Exception& e) {
    TILER_THROW(ConfigError, "'" << rdf_path << "': " << e.what());
  }
  return card;
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
  const std::string ext = fs::path(model).extension().string();
  if (ext == ".yaml" || ext == ".yml") return readBioimageioRdf(model);
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
  static const std::vector<std::string> names = {"window", "mpp",     "scale",      "mean",
                                                 "std",    "classes", "activation", "task"};
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
