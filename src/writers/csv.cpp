#include "tiler/writers/csv.hpp"

namespace tiler {

std::string csvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

CsvFile::CsvFile(const std::string& path, const std::vector<std::string>& columns) : file_(path) {
  std::string header;
  for (size_t i = 0; i < columns.size(); ++i) header += (i ? "," : "") + csvField(columns[i]);
  file_.write(header + "\n");
}

}  // namespace tiler
