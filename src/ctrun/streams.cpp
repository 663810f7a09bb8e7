#include "tiler/ctrun/streams.hpp"

#include <unistd.h>

#include <cerrno>
#include <optional>
#include <sstream>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

namespace tiler::ctrun {

std::optional<int> wholeNumber(const std::string& text, int lo, int hi) {
  try {
    size_t used = 0;
    const int v = std::stoi(text, &used);
    if (used == text.size() && v >= lo && v <= hi) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

StdStreams StdStreams::parse(const std::string& text, const std::string& flag) {
  StdStreams s;
  if (auto all = wholeNumber(text, 0, 3)) {
    s.all_ = *all;
    return s;
  }
  s.per_rank_ = true;
  std::stringstream in(text);
  std::string pair;
  while (std::getline(in, pair, ',')) {
    const size_t colon = pair.find(':');
    const auto rank = wholeNumber(pair.substr(0, colon), 0, 1 << 20);
    const auto value = colon == std::string::npos ? std::nullopt : wholeNumber(pair.substr(colon + 1), 0, 3);
    TILER_CHECK(rank && value && !s.by_local_rank_.count(*rank), ConfigError,
                flag << " must be 0..3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:N,... (e.g. 0:1,1:2) with "
                     << "each local rank once; got '" << text << "'");
    s.by_local_rank_[*rank] = *value;
  }
  TILER_CHECK(!s.by_local_rank_.empty(), ConfigError,
              flag << " must be 0..3 or LOCAL_RANK:N,...; got '" << text << "'");
  return s;
}

int StdStreams::of(int local_rank) const {
  if (!per_rank_) return all_;
  const auto it = by_local_rank_.find(local_rank);
  return it == by_local_rank_.end() ? 0 : it->second;
}

std::set<int> parseLocalRanksFilter(const std::string& text) {
  std::set<int> ranks;
  if (text.empty()) return ranks;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto rank = wholeNumber(item, 0, 1 << 20);
    TILER_CHECK(rank.has_value(), ConfigError,
                "--local_ranks_filter must be a comma-separated list of local ranks (e.g. 0,1,2); got '"
                    << text << "'");
    ranks.insert(*rank);
  }
  return ranks;
}

void Stream::emit(const std::string& line) {
  if (console_fd >= 0) writeAll(console_fd, prefix + line);
  if (log_fd >= 0) writeAll(log_fd, line);
}

void Stream::drain(bool eof) {
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 || eof) close();
      break;
    }
    pending.append(buf, size_t(n));
    size_t start = 0, nl;
    // Whole lines only, each in one write, so ranks never interleave mid-line. A carriage return ends a line
    // too: a progress bar (tqdm) redraws itself with one, so its updates reach the console as they come, each
    // prefixed, and are not held (and piled up) until the bar's last newline. "\r\n" is one end: a "\r"
    // last waits for what follows.
    while ((nl = pending.find_first_of("\r\n", start)) != std::string::npos) {
      if (pending[nl] == '\r' && nl + 1 == pending.size()) break;
      if (pending[nl] == '\r' && pending[nl + 1] == '\n') ++nl;
      emit(pending.substr(start, nl + 1 - start));
      start = nl + 1;
    }
    pending.erase(0, start);
  }
}

void Stream::close() {
  if (!pending.empty()) emit(pending + "\n");
  pending.clear();
  if (fd >= 0) ::close(fd);
  if (log_fd >= 0) ::close(log_fd);
  fd = log_fd = -1;
}

}  // namespace tiler::ctrun
