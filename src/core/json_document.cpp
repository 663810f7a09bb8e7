#include "tiler/core/json_document.hpp"

namespace tiler {
namespace {

struct TooDeep {};

}  // namespace

std::optional<nlohmann::json> parseJsonDocument(const std::string& text, std::string& error,
                                                const JsonKeep& keep) {
  using Event = nlohmann::json::parse_event_t;
  auto bounded = [&keep](int depth, Event event, nlohmann::json& parsed) {
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth)
      throw TooDeep{};
    if (event == Event::object_end && keep) return keep(depth, parsed);
    return true;
  };
  try {
    return nlohmann::json::parse(text, bounded);
  } catch (const TooDeep&) {
    error = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
  } catch (const nlohmann::json::exception& e) {
    error = e.what();
  }
  return std::nullopt;
}

}  // namespace tiler
