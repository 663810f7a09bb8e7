// error: the exception hierarchy every module throws, CHECK macros that add [file:line], and the one
// function each main uses to turn an exception into a message on stderr and an exit code.
// Promise: every error that reaches a user names what failed and where; nothing here allocates on the
// success path of a CHECK.
#pragma once

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
int reportFatal(const std::string& tool, const std::exception& e);

// Writes {"message": ..., "rank": ..., "time": ...} to TORCHELASTIC_ERROR_FILE if set (atomically).
void writeElasticErrorFile(const std::string& message);

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
