// rendezvous: the agents' store (set/get/add/wait, bounded calls, a host that goes away) and flag parsing.
// The agents themselves are tested as real processes in launcher_test (Rendezvous.*).
#include "tiler/rendezvous.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "tiler/error.hpp"

namespace tiler {
namespace {

using std::chrono::milliseconds;

TEST(Store, SetGetAddAndWaitAcrossClients) {
  StoreServer server("127.0.0.1", 0);
  StoreClient a("127.0.0.1", server.port(), milliseconds(2000));
  StoreClient b("127.0.0.1", server.port(), milliseconds(2000));
  EXPECT_EQ(a.get("k"), std::nullopt);
  a.set("k", "value with spaces");
  EXPECT_EQ(b.get("k"), "value with spaces");
  a.set("empty", "");
  EXPECT_EQ(b.get("empty"), "");
  EXPECT_EQ(a.add("n", 1), 1);
  EXPECT_EQ(b.add("n", 2), 3);
  EXPECT_EQ(a.add("n", 0), 3);
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(200));
    b.set("ready", "yes");
  });
  EXPECT_EQ(a.wait("ready", milliseconds(2000)), "yes");
  later.join();
  EXPECT_THROW(a.add("k", 1), DistError);  // not an integer: refused, the connection stays usable
  EXPECT_EQ(a.get("n"), "3");
}

TEST(Store, EveryCallIsBoundedAndAGoneHostIsAnError) {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0);
  const int port = server->port();
  StoreClient c("127.0.0.1", port, milliseconds(500));
  try {
    c.wait("never", milliseconds(300));
    FAIL() << "waited forever";
  } catch (const TimeoutError& e) {
    EXPECT_NE(e.message().find("'never'"), std::string::npos);
  }
  server.reset();
  EXPECT_THROW(c.get("k"), DistError);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(StoreClient("127.0.0.1", port, milliseconds(300)), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000));
  // A second host on a taken port is refused (the agent then joins as a client).
  StoreServer first("", 0);
  EXPECT_THROW(StoreServer second("", first.port()), DistError);
}

TEST(Store, FlagsParse) {
  EXPECT_EQ(parseEndpoint("node0:29400", "--rdzv_endpoint"), std::make_pair(std::string("node0"), 29400));
  EXPECT_THROW(parseEndpoint("node0", "--rdzv_endpoint"), ConfigError);
  EXPECT_THROW(parseEndpoint("node0:0", "--rdzv_endpoint"), ConfigError);
  EXPECT_THROW(parseEndpoint("node0:70000", "--rdzv_endpoint"), ConfigError);
  EXPECT_EQ(parseNodeRange("2"), std::make_pair(2, 2));
  EXPECT_EQ(parseNodeRange("1:4"), std::make_pair(1, 4));
  EXPECT_THROW(parseNodeRange("4:1"), ConfigError);
  EXPECT_THROW(parseNodeRange("0"), ConfigError);
  EXPECT_THROW(parseNodeRange("2x"), ConfigError);
  EXPECT_TRUE(isLocalHost("127.0.0.1"));
  EXPECT_TRUE(isLocalHost("localhost"));
  EXPECT_FALSE(isLocalHost("192.0.2.77"));  // TEST-NET-1
}

}  // namespace
}  // namespace tiler
