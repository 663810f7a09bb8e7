#include "tiler/core/queue.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
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

// Every row in exactly one piece, whatever the pool and the piece size; no pool: one piece on the caller.
TEST(Queue, ParallelRowsCoverEachRowOnce) {
  WorkPool pool(3);
  for (WorkPool* p : {static_cast<WorkPool*>(nullptr), &pool}) {
    for (int64_t rows : {0, 1, 15, 16, 17, 63, 64, 200}) {
      std::vector<std::atomic<int>> seen(size_t(rows) + 1);
      std::atomic<int> pieces{0};
      parallelRows(p, rows, 16, [&](int64_t first, int64_t last) {
        ++pieces;
        for (int64_t r = first; r < last; ++r) ++seen[size_t(r)];
      });
      for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(seen[size_t(r)], 1) << rows << " rows, row " << r;
      const int64_t most = p ? std::max<int64_t>(1, std::min<int64_t>(rows / 16, 4)) : 1;
      EXPECT_EQ(pieces, rows == 0 ? 0 : most) << rows << " rows";
    }
  }
}

// A piece that throws: the others still finish before the caller sees the first error.
TEST(Queue, ParallelRowsWaitForEveryPieceAndRethrow) {
  WorkPool pool(3);
  std::atomic<int> finished{0};
  try {
    parallelRows(&pool, 64, 16, [&](int64_t first, int64_t) {
      if (first == 16) throw std::runtime_error("piece 2 failed");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ++finished;
    });
    FAIL() << "the piece's error was lost";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "piece 2 failed");
  }
  EXPECT_EQ(finished, 3);
}

// An urgent task runs before the tasks already queued (the stitcher's rows before queued tiles).
TEST(Queue, AnUrgentTaskGoesAheadOfTheQueue) {
  WorkPool pool(1);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::vector<int> order;
  std::mutex m;
  pool.submit([open] { open.wait(); });  // holds the one thread while the others queue
  auto queued = pool.submit([&] {
    std::lock_guard<std::mutex> lock(m);
    order.push_back(1);
  });
  auto urgent = pool.submitUrgent([&] {
    std::lock_guard<std::mutex> lock(m);
    order.push_back(2);
  });
  gate.set_value();
  queued.get();
  urgent.get();
  EXPECT_EQ(order, (std::vector<int>{2, 1}));
}

}  // namespace
}  // namespace tiler
