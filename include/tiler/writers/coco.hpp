// writers/coco: --save coco, <stem>_coco.json: one image's boxes as a COCO detection result, with every
// member pycocotools' COCO and COCOeval read and nothing that changes from run to run (no date). Streamed: an
// annotation a line as it comes, the categories (those seen, by id) at finish. Written under its partial name
// and committed by the commit protocol (output_file.hpp). No LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tiler/writers/output_file.hpp"

namespace tiler {

class CocoFile : public OutputWriter {
 public:
  // `file_name` and its size (pixels) are the one image's; `description` goes into `info`.
  CocoFile(const std::string& path, const std::string& description, const std::string& file_name,
           double width, double height);
  // Annotation `id` (from 1): a box (x1, y1)-(x2, y2) of category `category` (from 1, named `name`).
  void add(int64_t id, int category, const std::string& name, double x1, double y1, double x2, double y2,
           float score);
  void finish() override;
  void commit(std::vector<std::string>& renamed) override { file_.commit(renamed); }

 private:
  TextFile file_;
  std::map<int, std::string> categories_;  // those seen: id -> name
  int64_t annotations_ = 0;
};

}  // namespace tiler
