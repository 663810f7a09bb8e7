// queue: the bounded FIFO between tiler's threads (read-ahead, output stage, pyramid levels), the work pool
// that compresses output tiles and blends rows, and parallelRows over it (and runBesideOthers, its join). No
// LibTorch.
// Promise: push() blocks while full, pop() while empty; close() releases both sides at once. A pool runs
// every task it was given before its destructor returns; a task's exception reaches its future.
// parallelRows returns once every piece is done, so its body may use the caller's locals.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace tiler {

// Bounded FIFO between two threads. close() wakes both sides: push() then returns false (the item is
// dropped) and pop() drains what is left, then returns nullopt.
template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}
  bool push(T item) {
    std::unique_lock<std::mutex> lock(mutex_);
    not_full_.wait(lock, [&] { return items_.size() < capacity_ || closed_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    not_empty_.wait(lock, [&] { return !items_.empty() || closed_; });
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return item;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    not_empty_.notify_all();
    not_full_.notify_all();
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
  }

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::deque<T> items_;
  bool closed_ = false;
};

// A fixed set of threads running tasks in the order given. The callers bound the work they queue (a writer
// queues the tiles of the rows it has in flight), so the task list itself is not bounded.
class WorkPool {
 public:
  explicit WorkPool(int threads) {
    for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { work(); });
  }
  ~WorkPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  int threads() const { return int(threads_.size()); }

  template <typename F>
  auto submit(F task) -> std::future<decltype(task())> {
    return enqueue(std::move(task), false);
  }
  // Runs before every task queued so far: for a thread that waits on it (the stitcher's row pieces, which
  // the output stage waits for, go ahead of the tiles it has queued for compression).
  template <typename F>
  auto submitUrgent(F task) -> std::future<decltype(task())> {
    return enqueue(std::move(task), true);
  }

 private:
  template <typename F>
  auto enqueue(F task, bool urgent) -> std::future<decltype(task())> {
    // std::function needs a copyable callable: the task lives behind a shared pointer.
    auto packaged = std::make_shared<std::packaged_task<decltype(task())()>>(std::move(task));
    auto result = packaged->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (urgent)
        tasks_.emplace_front([packaged] { (*packaged)(); });
      else
        tasks_.emplace_back([packaged] { (*packaged)(); });
    }
    ready_.notify_one();
    return result;
  }
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, and nothing left to run
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;  // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  std::vector<std::thread> threads_;         // last: started once the members above exist
};

// The rows a piece of parallelRows over image rows is worth at least: 16 rows of 8192 px and 3 channels are
// 1.5 MB (the stitcher's rows, the output stage's conversions).
constexpr int64_t kMinRowsPerPiece = 16;

// Runs `here` on the calling thread, then waits for every one of `others` (started elsewhere before it), and
// rethrows the first failure, here's before the others' in order, once all of them have ended: what they
// share by reference outlives them all.
template <typename F>
void runBesideOthers(std::vector<std::future<void>>& others, const F& here) {
  std::exception_ptr failure;
  try {
    here();
  } catch (...) {
    failure = std::current_exception();
  }
  for (auto& other : others) {
    try {
      other.get();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

// Runs body(first, last) over the rows [0, rows) in pieces of at least `min_rows` rows, up to one per pool
// thread plus one on the calling thread (the others as urgent tasks of `pool`; null: all on the calling
// thread), and returns when all are done, rethrowing the first exception of any. For rows that do not depend
// on each other: the result is the same however they are split.
template <typename F>
void parallelRows(WorkPool* pool, int64_t rows, int64_t min_rows, const F& body) {
  const int64_t pieces =
      pool ? std::clamp<int64_t>(rows / std::max<int64_t>(min_rows, 1), 1, pool->threads() + 1) : 1;
  if (pieces <= 1) {
    if (rows > 0) body(int64_t(0), rows);
    return;
  }
  const auto bound = [rows, pieces](int64_t k) { return rows * k / pieces; };
  std::vector<std::future<void>> others;
  for (int64_t k = 1; k < pieces; ++k)
    others.push_back(
        pool->submitUrgent([&body, first = bound(k), last = bound(k + 1)] { body(first, last); }));
  runBesideOthers(others, [&] { body(int64_t(0), bound(1)); });
}

}  // namespace tiler
