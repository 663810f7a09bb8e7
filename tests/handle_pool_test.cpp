// The handle pool with a fake library: a lease takes an idle handle before it opens one, handles in use at
// once are distinct, a discarded handle is closed and never handed out again, and the pool closes the rest.
#include "tiler/io/readers/handle_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>

namespace tiler {
namespace {

struct FakeHandle {
  int id = 0;
};
std::atomic<int> g_open{0}, g_closed{0};

FakeHandle* openFake() {
  return new FakeHandle{++g_open};
}
void closeFake(FakeHandle* h) {
  ++g_closed;
  delete h;
}

TEST(HandlePool, ALeaseReusesAnIdleHandleBeforeOpeningOne) {
  g_open = g_closed = 0;
  {
    HandlePool<FakeHandle> pool(closeFake);
    pool.adopt(openFake());  // the header's handle
    int first = 0;
    {
      HandlePool<FakeHandle>::Lease a(pool, openFake);
      first = a.get()->id;
      HandlePool<FakeHandle>::Lease b(pool, openFake);
      EXPECT_NE(a.get(), b.get()) << "two leases at once hold two handles";
      EXPECT_EQ(g_open.load(), 2);
    }
    HandlePool<FakeHandle>::Lease again(pool, openFake);
    EXPECT_EQ(g_open.load(), 2) << "given back, then reused";
    EXPECT_TRUE(again.get()->id == first || again.get()->id == 2);
    EXPECT_EQ(g_closed.load(), 0);
  }
  EXPECT_EQ(g_closed.load(), 2) << "the pool closes every handle it holds";
}

TEST(HandlePool, ADiscardedHandleIsClosedAndNeverHandedOutAgain) {
  g_open = g_closed = 0;
  HandlePool<FakeHandle> pool(closeFake);
  FakeHandle* broken = nullptr;
  {
    HandlePool<FakeHandle>::Lease a(pool, openFake);
    broken = a.get();
    a.discard();
    EXPECT_EQ(g_closed.load(), 1);
  }
  HandlePool<FakeHandle>::Lease b(pool, openFake);
  EXPECT_EQ(g_open.load(), 2) << "a new one was opened";
  EXPECT_EQ(b.get()->id, 2);
  (void)broken;
  // An open that throws leases nothing and gives nothing back.
  EXPECT_THROW(HandlePool<FakeHandle>::Lease(pool, []() -> FakeHandle* { throw std::runtime_error("no"); }),
               std::runtime_error);
}

TEST(HandlePool, ThreadsNeverShareAHandle) {
  g_open = g_closed = 0;
  HandlePool<FakeHandle> pool(closeFake);
  std::atomic<int> in_use[64] = {};
  std::atomic<bool> shared{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        HandlePool<FakeHandle>::Lease l(pool, openFake);
        const int id = l.get()->id;
        ASSERT_LT(id, 64);
        if (in_use[id].fetch_add(1) != 0) shared = true;
        std::this_thread::yield();
        in_use[id].fetch_sub(1);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_FALSE(shared.load());
  EXPECT_LE(g_open.load(), 8) << "at most one handle a thread";
}

}  // namespace
}  // namespace tiler
