// A job's rank session with ranks as threads over an in-process store: setup that one rank fails ends every
// rank there with that rank's message, finish() gives every rank rank 0's exit code (or its failure), and
// a directory is locked by one session at a time.
#include "tiler/dist/session.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <stdexcept>

#include "ranks_util.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// Runs body(session) on `size` ranks as threads; returns every rank's exception (or null).
std::vector<std::exception_ptr> runSessions(int size, const std::function<void(RankSession&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(size_t(size), nullptr);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        RankSession session(test::worldOf(r, size));
        DistOptions o;
        o.timeout = std::chrono::seconds(30);
        session.connect(std::make_unique<DistContext>(session.world(), o, torch::Device(torch::kCPU), store));
        body(session);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::string messageOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const RankFailure& f) {
    return std::to_string(f.failedRank()) + ": " + f.message();
  } catch (const std::exception& x) {
    return std::string("not a RankFailure: ") + x.what();
  }
}

class SessionWorlds : public ::testing::TestWithParam<int> {};

TEST_P(SessionWorlds, SetupThatOneRankFailsEndsEveryRankThere) {
  const int size = GetParam();
  const int bad = size - 1;
  std::atomic<int> went_on{0};
  auto errors = runSessions(size, [&](RankSession& s) {
    s.setup("the first check", [] {});
    s.setup("the data check", [&] {
      if (s.rank() == bad) throw IoError("'in.tif': no such file");
    });
    ++went_on;
  });
  EXPECT_EQ(went_on.load(), 0) << "no rank goes past a failed setup";
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(errors[size_t(r)]) << "rank " << r;
    const std::string m = messageOf(errors[size_t(r)]);
    EXPECT_EQ(m.rfind(std::to_string(r == bad ? r : bad) + ": ", 0), 0u) << m;
    EXPECT_NE(m.find("'in.tif': no such file"), std::string::npos) << m;
  }
}

TEST_P(SessionWorlds, FinishGivesEveryRankRankZerosCode) {
  const int size = GetParam();
  std::atomic<int> leaders{0};
  std::vector<int> codes(size_t(size), -1);
  auto errors = runSessions(size, [&](RankSession& s) {
    codes[size_t(s.rank())] = s.finish([&] {
      ++leaders;
      return 2;
    });
  });
  for (auto& e : errors) EXPECT_FALSE(e) << messageOf(e);
  EXPECT_EQ(leaders.load(), 1) << "rank 0 alone runs the leader's part";
  for (int c : codes) EXPECT_EQ(c, 2);
  // A leader that fails (its report cannot be written) fails every rank, with its message.
  errors = runSessions(
      size, [&](RankSession& s) { s.finish([]() -> int { throw IoError("'report.json': disk full"); }); });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_NE(messageOf(e).find("'report.json': disk full"), std::string::npos) << messageOf(e);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, SessionWorlds, ::testing::Values(1, 2, 3));

TEST(Session, ADirectoryIsLockedByOneSessionAtATime) {
  const std::string dir = test::scratchDir("session_lock") + "/out";
  RankSession first(test::worldOf(0, 1)), second(test::worldOf(0, 1));
  first.lockDirectory(dir, "output directory");
  EXPECT_TRUE(fs::is_directory(dir)) << "created";
  try {
    second.lockDirectory(dir, "output directory");
    FAIL() << "two sessions held one directory";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("output directory '" + dir + "': another tiler run"), std::string::npos)
        << e.message();
  }
  try {
    second.lockDirectory("/proc/tiler-cannot-write", "--checkpoint_dir");
    FAIL() << "locked an unwritable directory";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("cannot write to the --checkpoint_dir '/proc/tiler-cannot-write'"),
              std::string::npos)
        << e.message();
  }
  removeTree(test::scratchDir("session_lock"));
}

TEST(Session, TheProcessGroupTakesTheJobsBackendAndTimeout) {
  JobOptions o;
  o.backend = "gloo";
  o.timeout = 2.5;
  const DistOptions d = distOptionsFor(o);
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_EQ(d.timeout, std::chrono::milliseconds(2500));
  EXPECT_TRUE(d.shared_memory);
}

// Past 9.2e9 s the deadline overflowed the nanosecond clock: "timed out after 1e10 s" at once, and 1e308
// became -9.2e15 s. Refused, naming the bound; the bound itself still works.
TEST(Session, ATimeoutPastWhatTheClocksHoldIsRefused) {
  JobOptions o;
  for (const double huge : {1e10, 1e308, kMaxTimeoutSeconds * 1.001}) {
    o.timeout = huge;
    try {
      distOptionsFor(o);
      ADD_FAILURE() << huge << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(e.message().find("--timeout must be a number of seconds > 0 and at most 2147483 (24.8 days)"),
                std::string::npos)
          << e.message();
    }
  }
  o.timeout = kMaxTimeoutSeconds;
  EXPECT_EQ(distOptionsFor(o).timeout, std::chrono::milliseconds(2147483647));
}

// The flags both jobs share are checked by one function: each bad value is refused naming its flag, and a
// good set comes back parsed.
TEST(Session, TheSharedJobFlagsAreParsedOnceAndABadOneIsRefusedNamingItsFlag) {
  JobOptions good;
  good.window = "64,32";
  good.overlap = "0.5";
  good.pad = "replicate";
  good.channels = "2,0-1";
  const JobPlan plan = planJob(good);
  EXPECT_EQ(plan.spec.window_w, 64);
  EXPECT_EQ(plan.spec.window_h, 32);
  EXPECT_EQ(plan.pad, PadMode::kReplicate);
  EXPECT_EQ(plan.channels, (std::vector<int>{2, 0, 1}));
  struct Case {
    std::function<void(JobOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](JobOptions& o) { o.window = "0"; }, "--window: expected N or W,H with positive integers, got '0'"},
      {[](JobOptions& o) { o.overlap = "1"; }, "--overlap must be F or FX,FY with values in [0,1); got '1'"},
      {[](JobOptions& o) { o.pad = "mirror"; }, "--pad must be constant, reflect or replicate; got 'mirror'"},
      {[](JobOptions& o) { o.batch_size = 0; }, "--batch_size must be >= 1"},
      {[](JobOptions& o) { o.prefetch = 0; }, "--prefetch must be >= 1"},
      {[](JobOptions& o) { o.timeout = 1e308; }, "--timeout must be a number of seconds > 0 and at most"},
      {[](JobOptions& o) { o.threads = -1; }, "--threads must be >= 0 (0: LibTorch's default); got -1"},
      {[](JobOptions& o) { o.scale = -1; },
       "--scale must be a finite number >= 0 (0: by sample type); got -1"},
      {[](JobOptions& o) { o.channels = "x"; }, "--channels 'x': 'x' is not a channel index"},
  };
  for (const Case& c : cases) {
    JobOptions o;
    c.set(o);
    try {
      planJob(o);
      ADD_FAILURE() << c.message << ": accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.message().find(c.message), 0u) << e.message();
    }
  }
}

TEST(Session, ItsClockStartsWhenItIsMade) {
  RankSession s(test::worldOf(0, 1));
  const double t = s.seconds();
  EXPECT_GE(t, 0.0);
  EXPECT_LT(t, 60.0) << "no hang";
  EXPECT_TRUE(s.leader());
}

}  // namespace
}  // namespace tiler
