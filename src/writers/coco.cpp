#include "tiler/writers/coco.hpp"

#include <spdlog/fmt/fmt.h>

#include <nlohmann/json.hpp>

#include "tiler/io/image_io.hpp"

namespace tiler {

CocoFile::CocoFile(const std::string& path, const std::string& description, const std::string& file_name,
                   double width, double height)
    : file_(path) {
  file_.write(fmt::format(
      "{{\"info\": {{\"description\": {}, \"version\": \"{}\"}}, \"licenses\": [], "
      "\"images\": [{{\"id\": 1, \"file_name\": {}, \"width\": {}, \"height\": {}}}], "
      "\"annotations\": [",
      nlohmann::json(description).dump(), kTilerSoftware, nlohmann::json(file_name).dump(), width, height));
}

void CocoFile::add(int64_t id, int category, const std::string& name, double x1, double y1, double x2,
                   double y2, float score) {
  categories_.emplace(category, name);
  file_.write(fmt::format(
      "{}\n{{\"id\": {}, \"image_id\": 1, \"category_id\": {}, \"bbox\": [{},{},{},{}], \"area\": {}, "
      "\"segmentation\": [[{},{},{},{},{},{},{},{}]], \"score\": {}, \"iscrowd\": 0}}",
      annotations_ > 0 ? "," : "", id, category, x1, y1, x2 - x1, y2 - y1, (x2 - x1) * (y2 - y1), x1, y1, x2,
      y1, x2, y2, x1, y2, score));
  ++annotations_;
}

void CocoFile::finish() {
  std::string categories;
  for (const auto& [id, name] : categories_)
    categories += fmt::format("{}{{\"id\": {}, \"name\": {}, \"supercategory\": \"object\"}}",
                              categories.empty() ? "" : ", ", id, nlohmann::json(name).dump());
  file_.write("\n], \"categories\": [" + categories + "]}\n");
  file_.finish();
}

}  // namespace tiler
