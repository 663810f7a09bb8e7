#include "tiler/dist/session.hpp"

#include <cmath>
#include <filesystem>
#include <system_error>

namespace fs = std::filesystem;

namespace tiler {

void checkTimeout(double seconds) {
  TILER_CHECK(std::isfinite(seconds) && seconds > 0 && seconds <= kMaxTimeoutSeconds, ConfigError,
              "--timeout must be a number of seconds > 0 and at most " << int64_t(kMaxTimeoutSeconds)
                                                                       << " (24.8 days); got " << seconds);
}

JobPlan planJob(const JobOptions& o) {
  JobPlan p;
  p.spec = parseGridSpec(o.window, o.overlap);
  p.pad = parsePadMode(o.pad);
  TILER_CHECK(o.batch_size >= 1, ConfigError, "--batch_size must be >= 1");
  TILER_CHECK(o.prefetch >= 1, ConfigError, "--prefetch must be >= 1");
  checkTimeout(o.timeout);
  TILER_CHECK(o.threads >= 0, ConfigError,
              "--threads must be >= 0 (0: LibTorch's default); got " << o.threads);
  TILER_CHECK(std::isfinite(o.scale) && o.scale >= 0, ConfigError,
              "--scale must be a finite number >= 0 (0: by sample type); got " << o.scale);
  p.channels = parseChannelList(o.channels);
  return p;
}

DistOptions distOptionsFor(const JobOptions& options) {
  checkTimeout(options.timeout);
  DistOptions d;
  d.backend = options.backend;
  d.timeout = std::chrono::milliseconds(int64_t(options.timeout * 1000));
  return d;
}

RankSession::RankSession(WorldInfo world)
    : world_(std::move(world)), start_(std::chrono::steady_clock::now()) {}

RankSession::~RankSession() = default;

double RankSession::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void RankSession::connect(const DistOptions& options, const torch::Device& device) {
  connect(std::make_unique<DistContext>(world_, options, device));
}

void RankSession::connect(std::unique_ptr<DistContext> dist) {
  dist_ = std::move(dist);
  exchange_ = std::make_unique<StepExchange>(*dist_);
}

void RankSession::lockDirectory(const std::string& dir, const std::string& what) {
  // Two runs into one directory would remove each other's partial files and rename each other's half-written
  // outputs: the second one stops here, before it touches anything.
  std::error_code ec;
  fs::create_directories(dir, ec);
  TILER_CHECK(!ec, ConfigError, "cannot write to the " << what << " '" << dir << "': " << ec.message());
  lock_ = std::make_unique<DirectoryLock>(dir);
  TILER_CHECK(lock_->locked(), ConfigError, what << " '" << dir << "': " << lock_->error());
}

}  // namespace tiler
