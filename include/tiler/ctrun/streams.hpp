// streams: a worker's stdout and stderr as ctrun carries them (torch elastic's tail_log and redirects):
// whole lines (ended by a newline, or a progress bar's carriage return), each in one write, to the console
// (prefixed "[rank N]: " with several workers) and/or a log file, and torchrun's -r/--redirects and
// -t/--tee values (3, or 0:1,1:2 per local rank). No LibTorch.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

namespace tiler::ctrun {

// A whole number in [lo, hi] as ctrun's flags take one ("4", not "4x" or " 4"), or nullopt.
std::optional<int> wholeNumber(const std::string& text, int lo, int hi);

// Which of a worker's streams a -r or -t value names: bit 1 stdout, bit 2 stderr.
class StdStreams {
 public:
  // "N" (0..3) for every local rank, or "LOCAL:N,LOCAL:N,..." (ranks not named: 0), as torchrun's
  // Std.from_str; ConfigError naming `flag` otherwise.
  static StdStreams parse(const std::string& text, const std::string& flag);
  int of(int local_rank) const;

 private:
  int all_ = 0;
  std::map<int, int> by_local_rank_;
  bool per_rank_ = false;
};

// --local_ranks_filter "0,2": the local ranks whose output reaches the console (empty: every one);
// ConfigError unless it is a list of ranks >= 0 (settleOptions also refuses ranks the node does not have).
std::set<int> parseLocalRanksFilter(const std::string& text);

// One output stream of one worker: a pipe, a line buffer and where its lines go.
struct Stream {
  int fd = -1;          // read end; -1 when closed
  int console_fd = -1;  // 1 or 2; -1 when not shown on the console
  int log_fd = -1;      // log file; -1 when none
  std::string prefix;   // "[rank N]: " or empty
  std::string pending;  // partial line

  // Reads what the pipe holds and passes on its whole lines; at end of file (or `eof` and nothing more to
  // read) closes the stream, passing on a last partial line.
  void drain(bool eof);
  void close();

 private:
  void emit(const std::string& line);
};

}  // namespace tiler::ctrun
