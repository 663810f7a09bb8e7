// tiler: infer (default), finetune, info, overlay, check-model, version: each subcommand's function of its
// argv (cli_commands.hpp), with the command's log sink and exit.
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>

#include "cli_commands.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/version.hpp"
#include "tiler/model/runtime_info.hpp"

namespace {

// tiler's log lines on stdout, each through redactSecrets: an input's URL may carry a password or a
// presigned signature.
class RedactingStdoutSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    const std::string line = tiler::redactSecrets(fmt::to_string(formatted));
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);  // a line at a time, as spdlog's own sink: under ctrun stdout is a pipe
  }
  void flush_() override { std::fflush(stdout); }
};

// A finished job's outputs and report are closed and renamed into place when its command returns; what
// is left to a normal exit is LibTorch's static teardown (deregistering every operator, freeing its heap),
// a fixed cost of every run (docs/performance.md). Sanitizer builds exit normally: their leak and race
// verdicts run at exit.
int exitWithoutTeardown(int code) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return code;
#else
  spdlog::default_logger()->flush();
  std::cout.flush();
  std::fflush(nullptr);
  std::_Exit(code);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("tiler", std::make_shared<RedactingStdoutSink>()));
  spdlog::set_pattern("tiler: %v");
  if (const char* level = std::getenv("TILER_LOG")) spdlog::set_level(spdlog::level::from_str(level));
  std::string sub = argc > 1 ? argv[1] : "";
  try {
    if (sub == "--version" || sub == "version") {
      std::cout << tiler::runtimeInfo("tiler");
      return 0;
    }
    if (sub == "info") return tiler::tools::runInfoCli(argc - 1, argv + 1);
    if (sub == "overlay") return tiler::tools::runOverlayCli(argc - 1, argv + 1);
    if (sub == "check-model") return exitWithoutTeardown(tiler::tools::runCheckModelCli(argc - 1, argv + 1));
    if (sub == "finetune") return exitWithoutTeardown(tiler::tools::runFinetuneCli(argc - 1, argv + 1));
    if (sub == "view") return exitWithoutTeardown(tiler::tools::runViewCli(argc - 1, argv + 1));
    if (sub == "infer") return exitWithoutTeardown(tiler::tools::runInferCli(argc - 1, argv + 1));
    return exitWithoutTeardown(tiler::tools::runInferCli(argc, argv));
  } catch (const std::exception& e) {
    return tiler::reportFatal("tiler", e);
  }
}
