#include "tiler/infer/summary.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "tiler/stitch/outputs.hpp"
#include "tiler/writers/memory_output.hpp"

namespace tiler {
namespace {

std::vector<double> valuesOf(const torch::Tensor& t) {
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

}  // namespace

int writeRunReport(WindowCatalog& catalog, const RunSummary& run, const RanksAtEnd& ranks,
                   const std::string& path) {
  for (size_t r = 1; r < ranks.results.size(); ++r) OutputStage::applyResults(catalog, ranks.results[r]);
  for (const auto& t : ranks.fetched) addFetchedBytes(catalog, valuesOf(t));
  std::vector<RankStats> per_rank;
  for (const auto& t : ranks.stats) per_rank.push_back(RankStats::unpack(valuesOf(t)));
  nlohmann::json j = inferReport(run, catalog, per_rank);
  if (isMemoryOutput(path))
    keepMemoryText(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  else
    writeJsonAtomically(path, j);
  int failed = 0, ok = 0, skipped = 0;
  for (const auto& e : j["images"]) {
    failed += e["status"] == "error";
    ok += e["status"] == "ok";
    skipped += e["status"] == "skipped";
  }
  spdlog::info("{} image(s) done, {} skipped, {} failed in {:.1f} s ({:.1f} windows/s); report: {}", ok,
               skipped, failed, run.seconds, j["windows_per_second"].get<double>(), path);
  for (const auto& e : j["images"])
    if (e["status"] == "error") spdlog::error("{}", e["error"].get<std::string>());
  return exitCodeOf(j);
}

}  // namespace tiler
