#include "tiler/core/error.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_util.hpp"

namespace tiler {
namespace {

TEST(Error, ThrowAddsFileAndLineButMessageStaysClean) {
  try {
    TILER_THROW(IoError, "'a.tif': bad tile " << 3);
    FAIL() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.message(), "'a.tif': bad tile 3");
    EXPECT_NE(std::string(e.what()).find("'a.tif': bad tile 3 [error_test.cpp:"), std::string::npos)
        << e.what();
    EXPECT_STREQ(e.kind(), "io");
  }
}

TEST(Error, HierarchyLetsCallersCatchByFamily) {
  EXPECT_THROW(TILER_THROW(TimeoutError, "x"), DistError);
  EXPECT_THROW(TILER_THROW(ModelError, "x"), Error);
  EXPECT_THROW(TILER_THROW(ConfigError, "x"), std::runtime_error);
  try {
    TILER_THROW(TimeoutError, "late");
  } catch (const Error& e) {
    EXPECT_STREQ(e.kind(), "timeout");
  }
}

TEST(Error, CheckThrowsOnlyWhenFalse) {
  int evaluated = 0;
  EXPECT_NO_THROW(TILER_CHECK(1 + 1 == 2, ConfigError, "never " << ++evaluated));
  EXPECT_EQ(evaluated, 0) << "the message must not be built on success";
  EXPECT_THROW(TILER_CHECK(false, ConfigError, "boom"), ConfigError);
}

TEST(Error, ReportFatalPrintsOneLineAndWritesTheElasticErrorFile) {
  const std::string path = ::testing::TempDir() + "/error_file_" + std::to_string(getpid()) + ".json";
  std::remove(path.c_str());
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  setErrorRankPrefix("[rank 3] ");
  ::testing::internal::CaptureStderr();
  const auto before = std::time(nullptr);
  int code = reportFatal("tiler", ModelError("'m.pt': not TorchScript", "x.cpp", 7));
  std::string err = ::testing::internal::GetCapturedStderr();
  setErrorRankPrefix("");
  unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(code, kExitFatal);
  EXPECT_EQ(err, "tiler: error: [rank 3] 'm.pt': not TorchScript [x.cpp:7]\n");
  // torch.distributed.elastic's ErrorHandler format: torchrun reads message.extraInfo.timestamp with int().
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["message"]["message"], "ModelError: [rank 3] 'm.pt': not TorchScript [x.cpp:7]");
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"],
            "tiler: error: [rank 3] 'm.pt': not TorchScript [x.cpp:7]");
  const auto stamp = std::stoll(j["message"]["extraInfo"]["timestamp"].get<std::string>());
  EXPECT_GE(stamp, before);
  EXPECT_LE(stamp, std::time(nullptr));
  // As torchrun itself reads it, where python3-torch is installed.
  auto read = test::runCommand(
      "/usr/bin/python3 -c \"from torch.distributed.elastic.multiprocessing.errors import ProcessFailure\n"
      "f = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file='" +
      path +
      "')\n"
      "print(f.timestamp, f.message['message'])\" 2>&1");
  if (read.code != 0 && read.output.find("No module named") != std::string::npos)
    GTEST_SKIP() << "python3-torch is missing: the file was not read by torch's ProcessFailure";
  EXPECT_EQ(read.output, std::to_string(stamp) + " ModelError: [rank 3] 'm.pt': not TorchScript [x.cpp:7]\n");
}

// What each kind of failure is called in the error file, as Python's type(e).__name__ names an exception.
TEST(Error, ExceptionTypeNameIsTheUnqualifiedClass) {
  EXPECT_EQ(exceptionTypeName(TimeoutError("x")), "TimeoutError");
  EXPECT_EQ(exceptionTypeName(PeerLostError("x")), "PeerLostError");
  EXPECT_EQ(exceptionTypeName(std::runtime_error("x")), "runtime_error");
}

// A rank whose peer vanished, run by an agent that watches every rank, stays until the agent stops it (the
// agent then names the vanished rank as the root cause); elsewhere (srun, mpirun, several nodes) it exits.
TEST(Error, AFollowOnFailureWaitsForTheAgentOnlyWhereTheAgentSeesEveryRank) {
  const auto exitsWithin = [](const char* local_world_size, double seconds) {
    const pid_t child = fork();
    if (child == 0) {
      setenv("TORCHELASTIC_RUN_ID", "test", 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("LOCAL_WORLD_SIZE", local_world_size, 1);
      unsetenv("TORCHELASTIC_ERROR_FILE");
      std::freopen("/dev/null", "w", stderr);
      _exit(reportFatal("tiler", PeerLostError("rank 1's connection closed (it exited or was killed)")));
    }
    int status = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (waitpid(child, &status, WNOHANG) == 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
        kill(child, SIGTERM);  // as the agent stops a worker
        waitpid(child, &status, 0);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == kExitFatal;
  };
  EXPECT_FALSE(exitsWithin("2", 1.0)) << "held for the agent";
  EXPECT_TRUE(exitsWithin("1", 5.0)) << "the agent of this node does not run the vanished rank";
}

// LibTorch's errors (--batch_size 100000 asked for 78 GB) printed their 24-frame backtrace at exit.
TEST(Error, ReportFatalDropsLibTorchsBacktrace) {
  ::testing::internal::CaptureStderr();
  reportFatal("tiler", std::runtime_error("DefaultCPUAllocator: not enough memory\nException raised from "
                                          "alloc_cpu at alloc_cpu.cpp:72\nframe #0: c10::Error::Error()"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "tiler: error: DefaultCPUAllocator: not enough memory\n");
  EXPECT_EQ(withoutBacktrace("plain"), "plain");
  EXPECT_EQ(withoutBacktrace("a\nException raised from x\n"), "a");
}

TEST(Error, RedactSecretsHidesPasswordsAndSignaturesOnly) {
  EXPECT_EQ(redactSecrets("'https://ann:s3cr:et@slides.example/a.tif': HTTP 404"),
            "'https://ann:***@slides.example/a.tif': HTTP 404");
  EXPECT_EQ(redactSecrets("https://b.s3.amazonaws.com/a.svs?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F1"
                          "&X-Amz-Signature=deadbeef&x-id=GetObject"),
            "https://b.s3.amazonaws.com/a.svs?X-Amz-Algorithm=AWS4&X-Amz-Credential=***"
            "&X-Amz-Signature=***&x-id=GetObject");
  EXPECT_EQ(redactSecrets("https://acct.blob.core.windows.net/c/a.tif?sv=2021&sig=abc%3D"),
            "https://acct.blob.core.windows.net/c/a.tif?sv=2021&sig=***");
  EXPECT_EQ(redactSecrets("clone https://ghp_abc@github.com/o/r and 'http://u:p@h/x?Token=t#f' then"),
            "clone https://***@github.com/o/r and 'http://u:***@h/x?Token=***#f' then");
  // A long line is scanned, not matched by a recursive regex (which overflowed the stack).
  const std::string long_url = "https://host/" + std::string(1 << 20, 'a') + "?sig=s";
  EXPECT_EQ(redactSecrets(long_url), long_url.substr(0, long_url.size() - 1) + "***");
  for (const std::string kept : {"https://host:8080/a.tif", "/data/user:name@x/a.tif", "s3://bucket/a.tif",
                                 "'https://host/a.tif?page=2': no such file"})
    EXPECT_EQ(redactSecrets(kept), kept);
}

TEST(Error, ExitCodesAreTheContract) {
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitFatal, 1);
  EXPECT_EQ(kExitSomeFailed, 2);
}

TEST(Error, Utf8CheckAndEscape) {
  EXPECT_TRUE(isUtf8(""));
  EXPECT_TRUE(isUtf8("plain"));
  EXPECT_TRUE(isUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\xac"));
  EXPECT_FALSE(isUtf8("\xff"));
  EXPECT_FALSE(isUtf8("\xc3"));              // cut short
  EXPECT_FALSE(isUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(isUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(isUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_EQ(utf8Safe("a\xc3\xa9"), "a\xc3\xa9");
  EXPECT_EQ(utf8Safe("bad\xff\xfe.tif"), "bad\\xff\\xfe.tif");
  EXPECT_EQ(utf8Safe("\xe2\x82"), "\\xe2\\x82");
  EXPECT_TRUE(isUtf8(utf8Safe("\xc0\xaf\xf4\x90\x80\x80x")));
}

}  // namespace
}  // namespace tiler
