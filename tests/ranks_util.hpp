// Ranks as threads: a world of DistContexts over one in-process c10d::HashStore, for the dist and step
// exchange tests.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "tiler/dist/dist.hpp"

namespace tiler::test {

inline WorldInfo worldOf(int rank, int size) {
  WorldInfo w;
  w.rank = rank;
  w.world_size = size;
  w.local_rank = rank;
  w.local_world_size = size;
  return w;
}

using ConfigureRank = std::function<void(int rank, DistOptions&)>;

// Runs fn(ctx) on `size` threads sharing one in-process store; returns every rank's exception (or null).
// `configure` may change a rank's options.
inline std::vector<std::exception_ptr> runRanksCollect(
    int size, const std::function<void(DistContext&)>& fn,
    std::chrono::milliseconds timeout = std::chrono::seconds(30), const ConfigureRank& configure = nullptr) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        DistOptions o;
        o.timeout = timeout;
        if (configure) configure(r, o);
        DistContext ctx(worldOf(r, size), o, torch::Device(torch::kCPU), store);
        fn(ctx);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// runRanksCollect, rethrowing the first failure.
inline void runRanks(int size, const std::function<void(DistContext&)>& fn,
                     std::chrono::milliseconds timeout = std::chrono::seconds(30),
                     const ConfigureRank& configure = nullptr) {
  for (auto& e : runRanksCollect(size, fn, timeout, configure))
    if (e) std::rethrow_exception(e);
}

}  // namespace tiler::test
