#include "tiler/net/store.hpp"

#include <algorithm>
#include <thread>

#include "tiler/core/error.hpp"

namespace tiler {

std::string Store::wait(const std::string& key, std::chrono::milliseconds timeout,
                        const std::function<void()>& between) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  const auto timedOut = [&](const std::string& why) {
    TILER_THROW(TimeoutError, "waited " << timeout.count() / 1000.0 << " s for '" << key
                                        << "' at the rendezvous store " << endpoint() << why);
  };
  for (;;) {
    // Each poll has what is left of the time (the first at least a moment).
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      if (auto v = get(key, std::max(left, std::chrono::milliseconds(1)))) return *v;
    } catch (const TimeoutError& e) {
      timedOut(": " + e.message());
    }
    if (between) between();
    if (Clock::now() >= deadline) timedOut("");
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now()));
  }
}

int64_t parseStoreInteger(const std::string& text, const std::string& key, const std::string& endpoint) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TILER_CHECK(used > 0 && used == text.size(), DistError,
              "malformed rendezvous data at " << endpoint << ": '" << key << "' holds '" << text.substr(0, 64)
                                              << (text.size() > 64 ? "..." : "") << "', not an integer");
  return value;
}

}  // namespace tiler
