#include "tiler/tasks/heads.hpp"

#include <algorithm>
#include <iterator>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/tasks/registry.hpp"

namespace tiler {
namespace {

// The job's flags a head may have of its own (the tasks' own say so in their declarations).
constexpr const char* kJobHeadSettings[] = {"activation", "classes", "save"};

// --head_opt's keys, each the flag of that name for the head.
std::vector<std::string> headSettingKeys() {
  std::vector<std::string> keys(std::begin(kJobHeadSettings), std::end(kJobHeadSettings));
  for (const TaskFlag& flag : taskFlagDeclarations())
    if (flag.head) keys.push_back(flag.name);
  return keys;
}

// "a, b or c".
std::string wordsOr(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

// "np.activation=none" into the head it names.
void applyHeadOption(std::vector<HeadSpec>& heads, const std::string& option) {
  const size_t dot = option.find('.'), eq = option.find('=');
  TILER_CHECK(dot != std::string::npos && eq != std::string::npos && dot < eq && dot > 0, ConfigError,
              "--head_opt takes NAME.KEY=VALUE (KEY: " << headSettingWords() << "); got '" << option << "'");
  const std::string name = option.substr(0, dot), key = option.substr(dot + 1, eq - dot - 1),
                    value = option.substr(eq + 1);
  HeadSpec* head = nullptr;
  for (HeadSpec& h : heads)
    if (h.name == name) head = &h;
  TILER_CHECK(head != nullptr, ConfigError,
              "--head_opt " << option << ": no head '" << name << "' in --heads");
  const std::vector<std::string> keys = headSettingKeys();
  TILER_CHECK(
      std::find(keys.begin(), keys.end(), key) != keys.end(), ConfigError,
      "--head_opt " << option << ": no setting '" << key << "' (a head takes " << headSettingWords() << ")");
  TILER_CHECK(head->settings.emplace(key, value).second, ConfigError,
              "--head_opt " << option << ": " << name << "." << key << " is given twice");
}

}  // namespace

std::string headTaskWords() {
  std::vector<std::string> names;
  for (const Task* t : allTasks())
    if (!t->sendsRecords()) names.push_back(t->name());
  return wordsOr(names);
}

std::string headSettingWords() {
  return wordsOr(headSettingKeys());
}

std::optional<std::string> HeadSpec::setting(const std::string& key) const {
  const auto given = settings.find(key);
  if (given == settings.end()) return std::nullopt;
  return given->second;
}

std::vector<HeadSpec> parseHeads(const std::string& heads, const std::vector<std::string>& options) {
  std::vector<HeadSpec> specs;
  if (heads.empty()) {
    TILER_CHECK(options.empty(), ConfigError, "--head_opt is for the heads --heads names; no --heads given");
    return specs;
  }
  const std::string bad =
      "--heads takes NAME[:TASK],... (NAME: a dict key or a tuple index; TASK: " + headTaskWords() +
      "); got '" + heads + "'";
  TILER_CHECK(heads.back() != ',', ConfigError, bad);
  std::stringstream parts(heads);
  std::string part;
  while (std::getline(parts, part, ',')) {
    HeadSpec spec;
    const size_t colon = part.find(':');
    spec.name = part.substr(0, colon);
    TILER_CHECK(!spec.name.empty() && spec.name.find_first_of("/.=") == std::string::npos, ConfigError, bad);
    if (colon != std::string::npos) spec.task = findTask(part.substr(colon + 1));
    for (const HeadSpec& other : specs)
      TILER_CHECK(other.name != spec.name, ConfigError, "--heads names '" << spec.name << "' twice");
    specs.push_back(spec);
  }
  for (const std::string& option : options) applyHeadOption(specs, option);
  return specs;
}

}  // namespace tiler
