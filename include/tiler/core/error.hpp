// error: the exception hierarchy every module throws, CHECK macros that add [file:line], and the one
// function each main uses to turn an exception into a message on stderr and an exit code.
// Promise: every error that reaches a user names what failed and where; nothing here allocates on the
// success path of a CHECK.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tiler {

// Exit codes of the public interface.
constexpr int kExitOk = 0;
constexpr int kExitFatal = 1;
constexpr int kExitSomeFailed = 2;

// `text` with the secrets a URL may carry replaced by "***": a password in its user information
// (https://user:***@host/...; a name alone there may be a token: https://***@host/...) and the signature and
// credentials of a presigned URL (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token, X-Goog-Signature,
// X-Goog-Credential, Signature, sig, token, access_token). Everything tiler writes about an input (report,
// log lines, error files) passes through it.
std::string redactSecrets(const std::string& text);

class Error : public std::runtime_error {
 public:
  Error(const std::string& what, const char* file = nullptr, int line = 0);
  // The message without the [file:line] suffix.
  const std::string& message() const { return message_; }
  virtual const char* kind() const { return "error"; }

 private:
  std::string message_;
};

#define TILER_DEFINE_ERROR(Name, Base, kind_name)           \
  class Name : public Base {                                \
   public:                                                  \
    using Base::Base;                                       \
    const char* kind() const override { return kind_name; } \
  }

TILER_DEFINE_ERROR(IoError, Error, "io");
TILER_DEFINE_ERROR(ConfigError, Error, "config");
TILER_DEFINE_ERROR(ModelError, Error, "model");
TILER_DEFINE_ERROR(DistError, Error, "dist");
// A timeout is a distributed failure: catch DistError to handle both.
TILER_DEFINE_ERROR(TimeoutError, DistError, "timeout");
// A peer's connection closed under a collective or the store (it exited or was killed): this rank's failure
// follows that peer's, it is not a cause of its own.
TILER_DEFINE_ERROR(PeerLostError, DistError, "peer_lost");

#undef TILER_DEFINE_ERROR

// TILER_THROW(IoError, "'" << path << "': bad header") throws with [file:line] context.
#define TILER_THROW(ErrorType, stream_expr)                     \
  do {                                                          \
    std::ostringstream tiler_throw_os_;                         \
    tiler_throw_os_ << stream_expr;                             \
    throw ErrorType(tiler_throw_os_.str(), __FILE__, __LINE__); \
  } while (0)

#define TILER_CHECK(cond, ErrorType, stream_expr)     \
  do {                                                \
    if (!(cond)) TILER_THROW(ErrorType, stream_expr); \
  } while (0)

// Prefix added to every fatal message ("[rank 1] "); set once by the tools when the rank is known.
void setErrorRankPrefix(const std::string& prefix);
const std::string& errorRankPrefix();

// Prints "<tool>: error: <message>" on stderr, writes the torchelastic JSON error file when
// TORCHELASTIC_ERROR_FILE is set, and returns kExitFatal. Call from a catch block in main.
// A PeerLostError under an agent that runs every rank of the world (TORCHELASTIC_RUN_ID set, LOCAL_WORLD_SIZE
// equal to WORLD_SIZE: torchrun or ctrun on one node) then waits, up to kFollowOnHold or until the agent is
// gone, for the agent to stop this process: the agent sees the vanished rank fail at its next check (torchrun
// every --monitor_interval) and names it the root cause, where a follow-on that exited first would be named
// (torchrun stamps a worker without an error file when it finds it dead). The job ends when it would anyway:
// the agent ends the group at that check either way.
constexpr std::chrono::seconds kFollowOnHold{10};
int reportFatal(const std::string& tool, const std::exception& e);

// Writes TORCHELASTIC_ERROR_FILE, when set, as torch.distributed.elastic's ErrorHandler does (atomically):
// {"message": {"message": "<type>: <message>", "extraInfo": {"py_callstack": <traceback>, "timestamp":
// "<whole seconds since the epoch>"}}}. torchrun orders failures by that timestamp and prints py_callstack as
// the failure's traceback; ctrun prints the inner message.
void writeElasticErrorFile(const std::string& type, const std::string& message, const std::string& traceback);
// The unqualified name of e's dynamic type ("DistError", "runtime_error"), as Python's type(e).__name__.
std::string exceptionTypeName(const std::exception& e);

// `what` without the "\nException raised from ..." backtrace LibTorch's c10::Error appends to its message
// (a message wrapped with it would keep the backtrace in the middle, and lose what follows when cut).
std::string withoutBacktrace(std::string what);
// The first line of a message (a library's error that goes on with its context or stack).
std::string firstLine(const std::string& what);

// A one-line message for any exception: tiler's without [file:line], LibTorch's without their backtrace,
// std::bad_alloc as "out of memory", anything else as "unknown exception".
std::string describeException(const std::exception_ptr& e);
// describeException, prefixed with "'<path>': " unless the message names the path already.
std::string describeImageException(const std::exception_ptr& e, const std::string& path);

// `text` made valid UTF-8 for JSON and HDF5's UTF-8 strings: valid sequences kept, every other byte written
// as the four characters \xNN, so that a file name that is not UTF-8 still names its file in a report.
std::string utf8Safe(const std::string& text);
bool isUtf8(const std::string& text);

}  // namespace tiler
