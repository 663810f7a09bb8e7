#include "tiler/tasks/heads.hpp"

#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/tasks/registry.hpp"

namespace tiler {
namespace {

// "np.activation=none" into the head it names.
void applyHeadOption(std::vector<HeadSpec>& heads, const std::string& option) {
  const size_t dot = option.find('.'), eq = option.find('=');
  TILER_CHECK(dot != std::string::npos && eq != std::string::npos && dot < eq && dot > 0, ConfigError,
              "--head_opt takes NAME.KEY=VALUE (KEY: activation, classes, save, probs_dtype); got '" << option
                                                                                                     << "'");
  const std::string name = option.substr(0, dot), key = option.substr(dot + 1, eq - dot - 1),
                    value = option.substr(eq + 1);
  HeadSpec* head = nullptr;
  for (HeadSpec& h : heads)
    if (h.name == name) head = &h;
  TILER_CHECK(head != nullptr, ConfigError,
              "--head_opt " << option << ": no head '" << name << "' in --heads");
  std::optional<std::string>* field = key == "activation"    ? &head->activation
                                      : key == "classes"     ? &head->classes
                                      : key == "save"        ? &head->save
                                      : key == "probs_dtype" ? &head->probs_dtype
                                                             : nullptr;
  TILER_CHECK(field != nullptr, ConfigError,
              "--head_opt " << option << ": no setting '" << key
                            << "' (a head takes activation, classes, save and probs_dtype)");
  TILER_CHECK(!field->has_value(), ConfigError,
              "--head_opt " << option << ": " << name << "." << key << " is given twice");
  *field = value;
}

// "segment, classify or embed": the tasks a head can be, those whose windows send their predictions (a task
// whose windows send records runs alone), in the registry's order.
std::string headTaskWords() {
  std::vector<std::string> names;
  for (const Task* t : allTasks())
    if (t->recordMaker(TaskOutputs{}) == nullptr) names.push_back(t->name());
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

}  // namespace

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
