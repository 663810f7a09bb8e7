#include "tiler/ctrun/launcher.hpp"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/ctrun/agent.hpp"
#include "tiler/ctrun/failures.hpp"
#include "tiler/ctrun/options.hpp"
#include "tiler/ctrun/signals.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// A new directory named `prefix` and six random characters (mkdtemp), made with its parents.
std::string makeUniqueDirectory(const fs::path& prefix, const char* what) {
  std::error_code ec;
  fs::create_directories(prefix.parent_path(), ec);
  std::string tmpl = prefix.string() + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  TILER_CHECK(mkdtemp(buf.data()) != nullptr, LaunchError,
              "cannot make a directory for " << what << " under " << prefix.parent_path() << ": "
                                             << std::strerror(errno));
  return buf.data();
}

// Where error files (and logs) live, one directory per run. With --log_dir, torchrun's
// `<dir>/<run_id>_<random>` (never an earlier run's: a second run with the same id, or another node writing
// to the same shared directory, keeps its own logs), said on stderr; without, a temporary one, removed at the
// end.
struct RunDirectory {
  std::string path;
  bool temporary = false;
  explicit RunDirectory(const LaunchOptions& o) : temporary(o.log_dir.empty()) {
    if (!temporary) {
      path = makeUniqueDirectory(fs::path(o.log_dir) / (o.run_id + "_"), "the workers' logs");
      std::cerr << "ctrun: logs under " << path << "\n";
      return;
    }
    path = makeUniqueDirectory(fs::temp_directory_path() / "ctrun-", "the workers' error files");
  }
  ~RunDirectory() {
    if (temporary) removeTree(path);
  }
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
};

}  // namespace

Launcher::Launcher(LaunchOptions options) : options_(std::move(options)) {}

int Launcher::run() {
  const ctrun::LaunchPlan plan = ctrun::settleOptions(options_);
  ctrun::installSignalPipe(plan.signals);
  const RunDirectory run_dir(options_);
  return ctrun::runAgent(options_, plan, run_dir.path);
}

}  // namespace tiler
