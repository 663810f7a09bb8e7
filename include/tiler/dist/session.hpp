// session: one rank of a job, from joining the world to the exit code every rank agrees on. Both commands
// (infer, finetune) hold one: it owns the process group, the step exchange over it, the job's directory
// lock and the run's clock, so that the jobs keep only their plan and their loop.
// Promise: setup() and finish() never leave a rank behind: a failure on any rank becomes a RankFailure on
// every rank at the same call (the failing rank's message), and finish() returns rank 0's exit code on every
// rank. Not thread safe: the rank's main thread calls it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tiler/core/grid.hpp"
#include "tiler/core/job_options.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/dist/dist.hpp"
#include "tiler/dist/exchange.hpp"
#include "tiler/dist/loader.hpp"

namespace tiler {

// The process group's options from the flags both jobs share (--backend, --timeout); a ConfigError for a
// --timeout checkTimeout refuses.
DistOptions distOptionsFor(const JobOptions& options);
// The longest --timeout, in seconds (24.8 days): 2^31 - 1 ms, what poll() and the collectives' millisecond
// timers hold. Past 9.2e9 s a deadline on the nanosecond clock overflowed, to a timeout "after 1e10 s" at
// once.
constexpr double kMaxTimeoutSeconds = 2147483.647;
// A ConfigError unless `seconds` (--timeout) is a number in (0, kMaxTimeoutSeconds].
void checkTimeout(double seconds);

// The flags both jobs share, parsed and checked by the one function infer's plan and finetune both call
// first, so that either refuses a value in the same words: a ConfigError naming the flag for --window,
// --overlap, --pad, --batch_size, --prefetch, --timeout, --threads, --scale or --channels. (--device,
// --precision and --backend are checked where they are resolved, modelOptionsFor's runner and
// distOptionsFor's process group, for both jobs alike.)
struct JobPlan {
  GridSpec spec;  // --window, --overlap
  PadMode pad = PadMode::kConstant;
  std::vector<int> channels;  // --channels; empty: all, in order
};
JobPlan planJob(const JobOptions& options);

class RankSession {
 public:
  // A rank of `world` (joinWorld() for a tool's process); its clock starts now.
  explicit RankSession(WorldInfo world);
  ~RankSession();
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  const WorldInfo& world() const { return world_; }
  int rank() const { return world_.rank; }
  bool leader() const { return world_.rank == 0; }
  double seconds() const;  // since the session began

  // Joins the process group once the model's device is known (rendezvous through world.master_addr);
  // the second form takes a group made elsewhere (ranks as threads in tests).
  void connect(const DistOptions& options, const torch::Device& device);
  void connect(std::unique_ptr<DistContext> dist);
  DistContext& dist() { return *dist_; }
  StepExchange& exchange() { return *exchange_; }

  // Setup that one rank can fail alone (its inputs, its directory): every rank throws there, together.
  template <typename F>
  void setup(const std::string& what, F&& body) {
    exchange_->check(captureFailure(std::forward<F>(body)), what);
  }
  // Creates `dir` and holds its lock until the session ends: a ConfigError naming `dir` (as `what`: "output
  // directory", "--checkpoint_dir") when it cannot be written or another run holds it. Call it inside
  // setup(), on the rank that writes there.
  void lockDirectory(const std::string& dir, const std::string& what);

  // The end of the run: rank 0 runs `leader_body` (its report), whose return is the exit code; that code,
  // or rank 0's failure, reaches every rank.
  template <typename F>
  int finish(F&& leader_body) {
    int code = 0;
    std::optional<std::string> fatal;
    if (leader()) fatal = captureFailure([&] { code = leader_body(); });
    return exchange_->agreeOnExitCode(code, fatal);
  }

 private:
  WorldInfo world_;
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<DistContext> dist_;
  std::unique_ptr<StepExchange> exchange_;  // over dist_
  std::unique_ptr<DirectoryLock> lock_;     // lockDirectory(), released last
};

}  // namespace tiler
