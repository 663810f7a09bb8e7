// writers/csv: the CSV outputs (--save csv, objects_csv): RFC 4180 fields, a header line of column names,
// then a line a row, streamed through a TextFile under its partial name and committed by the commit protocol
// (output_file.hpp). No LibTorch.
#pragma once

#include <string>
#include <vector>

#include "tiler/writers/output_file.hpp"

namespace tiler {

// A CSV field per RFC 4180: quoted (inner quotes doubled) when it holds a comma, a quote or a line break.
std::string csvField(const std::string& text);

class CsvFile : public OutputWriter {
 public:
  // Creates the partial file and writes the header: the column names as fields.
  CsvFile(const std::string& path, const std::vector<std::string>& columns);
  // One row: its fields, already formatted and quoted (csvField) where they are text, comma-separated.
  void row(const std::string& fields) { file_.write(fields + "\n"); }
  void finish() override { file_.finish(); }
  void commit(std::vector<std::string>& renamed) override { file_.commit(renamed); }

 private:
  TextFile file_;
};

}  // namespace tiler
