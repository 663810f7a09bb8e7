#include "tiler/queue.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace tiler {
namespace {

TEST(Queue, ClosedQueueReleasesABlockedProducer) {
  BoundedQueue<int> q(1);
  ASSERT_TRUE(q.push(1));
  std::atomic<bool> returned{false};
  bool accepted = true;
  std::thread producer([&] {
    accepted = q.push(2);  // blocks: the queue is full
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned);
  q.close();
  producer.join();
  EXPECT_FALSE(accepted);
  EXPECT_EQ(q.pop(), 1) << "what was queued is still delivered";
  EXPECT_EQ(q.pop(), std::nullopt);
}

// N tasks that each wait until all N have started finish only if the pool runs them side by side: a pool of
// N threads does; the writer's tiles are compressed that way.
TEST(Queue, APoolRunsItsThreadsTasksAtOnce) {
  for (int threads : {1, 3}) {
    WorkPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    std::atomic<int> started{0};
    std::vector<std::future<int>> results;
    for (int k = 0; k < threads; ++k) {
      results.push_back(pool.submit([&started, threads, k] {
        ++started;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);  // no hang
        while (started < threads && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        return started.load() == threads ? k : -1;
      }));
    }
    for (int k = 0; k < threads; ++k) EXPECT_EQ(results[size_t(k)].get(), k) << threads << " threads";
  }
}

// A task's exception reaches its future and nothing else: the pool goes on; its destructor runs what was
// queued before it returns.
TEST(Queue, APoolPassesExceptionsOnAndFinishesItsTasks) {
  std::atomic<int> ran{0};
  std::future<void> failed;
  {
    WorkPool pool(2);
    failed = pool.submit([]() -> void { throw std::runtime_error("tile 7 failed"); });
    for (int k = 0; k < 50; ++k) pool.submit([&ran] { ++ran; });
  }
  EXPECT_EQ(ran, 50);
  try {
    failed.get();
    FAIL() << "the task's error was lost";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "tile 7 failed");
  }
}

}  // namespace
}  // namespace tiler
