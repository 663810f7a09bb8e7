// rendezvous: the agents' store (set/get/add/wait, bounded calls, a host that goes away) and flag parsing.
// The agents themselves are tested as real processes in launcher_test (Rendezvous.*).
#include "tiler/core/rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "tiler/core/error.hpp"

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
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(10000)) << "no hang past its timeout";
  // A second host on a taken port is refused (the agent then joins as a client).
  StoreServer first("", 0);
  EXPECT_THROW(StoreServer second("", first.port()), DistError);
}

// A raw connection to the store, for clients that misbehave.
int rawClient(int port) {
  const int fd = connectTcp("127.0.0.1", port, milliseconds(2000), "test");
  return fd;
}

void sendAll(int fd, const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::send(fd, text.data() + off, text.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += size_t(n);
  }
}

// True once the server has closed `fd` (everything it sent drained), within `timeout`.
bool closedByServer(int fd, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[65536];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
  return false;
}

TEST(Store, AClientThatNeverReadsStallsOnlyItself) {
  StoreLimits limits;
  limits.max_unread_reply_bytes = 64 << 10;
  limits.stall_timeout = milliseconds(500);
  StoreServer server("127.0.0.1", 0, limits);
  StoreClient writer("127.0.0.1", server.port(), milliseconds(2000));
  writer.set("big", std::string(1 << 20, 'x'));
  // 200 pipelined GETs of 1 MB, none of the replies read: a blocking send() froze the whole store here.
  const int hog = rawClient(server.port());
  std::string gets;
  for (int i = 0; i < 200; ++i) gets += "GET big\n";
  sendAll(hog, gets);
  StoreClient other("127.0.0.1", server.port(), milliseconds(2000));
  for (int i = 0; i < 20; ++i) {
    other.set("k", std::to_string(i));
    EXPECT_EQ(other.add("n", 1), i + 1);  // each call bounded by the client's 2 s: a frozen store throws
  }
  usleep(1500000);  // three stall timeouts, none of its replies read
  EXPECT_TRUE(closedByServer(hog, milliseconds(5000))) << "a client that does not read is dropped";
  ::close(hog);
  EXPECT_EQ(other.get("k"), "19");
}

// Many clients that pipeline GETs and read nothing: each stays under its own bound, and all of them
// together under the store's (100 such clients grew it by 750 MiB); a client that reads is served once the
// hogs are dropped.
TEST(Store, RepliesUnreadByAllClientsTogetherAreBounded) {
  StoreLimits limits;
  limits.max_total_unread_reply_bytes = 8 << 20;
  // Long enough that no hog is dropped while the ten are still connecting on a loaded machine (at 1.5 s,
  // under ASan beside a build, the first were dropped before the last came: 3.9 MiB held at most).
  limits.stall_timeout = milliseconds(3000);
  StoreServer server("127.0.0.1", 0, limits);
  StoreClient writer("127.0.0.1", server.port(), milliseconds(5000));
  const std::string big(1 << 20, 'x');
  writer.set("big", big);
  std::string gets;
  for (int i = 0; i < 20; ++i) gets += "GET big\n";
  std::vector<int> hogs;
  size_t most = 0, most_held = 0;
  for (int k = 0; k < 10; ++k) {
    hogs.push_back(rawClient(server.port()));
    sendAll(hogs.back(), gets);
    for (int t = 0; t < 5; ++t) {
      usleep(10000);
      most = std::max(most, server.unreadReplyBytes());
      most_held = std::max(most_held, server.bufferedBytes());
    }
  }
  usleep(300000);
  most = std::max(most, server.unreadReplyBytes());
  // One reply past the bound at most: the bound is checked before each request is answered.
  EXPECT_LE(most, limits.max_total_unread_reply_bytes + big.size() + 64) << most;
  // And that is what the store's memory holds for them (a growing buffer held up to twice its bytes).
  most_held = std::max(most_held, server.bufferedBytes());
  EXPECT_LE(most_held, limits.max_total_unread_reply_bytes + big.size() + (256 << 10)) << most_held;
  EXPECT_GT(most, size_t(4) << 20) << "the hogs did hold replies (the test measures something)";
  // Without the drop the reader would wait forever; 30 s leaves a loaded CI machine room (10 s ran out once
  // beside two builds).
  StoreClient reader("127.0.0.1", server.port(), milliseconds(30000));
  EXPECT_EQ(reader.get("big"), big) << "served once the hogs are dropped";
  for (int fd : hogs) ::close(fd);
}

// A client that reads its replies, but slowly, while it keeps asking: the store holds what is still to send,
// not everything it ever sent that client (the sent part of a reply buffer was kept until it drained whole).
TEST(Store, ASlowReaderCostsWhatIsUnsentNotWhatWasSent) {
  StoreLimits limits;
  limits.max_unread_reply_bytes = 2 << 20;
  StoreServer server("127.0.0.1", 0, limits);
  StoreClient writer("127.0.0.1", server.port(), milliseconds(5000));
  const std::string big(1 << 20, 'x');
  writer.set("big", big);
  const int slow = rawClient(server.port());
  std::string gets;
  for (int i = 0; i < 40; ++i) gets += "GET big\n";
  sendAll(slow, gets);
  size_t received = 0, most = 0;
  char buf[256 << 10];
  const size_t expected = 40 * (big.size() + 5);  // "VAL " + value + "\n"
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (received < expected && std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::recv(slow, buf, sizeof buf, 0);
    if (n <= 0) break;
    received += size_t(n);
    most = std::max(most, server.bufferedBytes());
    usleep(2000);
  }
  EXPECT_EQ(received, expected) << "every reply arrived";
  // Its own bound and one reply past it: far under the 40 MiB sent.
  EXPECT_LE(most, limits.max_unread_reply_bytes + big.size() + (256 << 10)) << most;
  ::close(slow);
}

// A connection that says nothing is dropped after the idle timeout; one that keeps talking is not.
TEST(Store, ASilentClientIsDroppedAfterTheIdleTimeout) {
  StoreLimits limits;
  limits.idle_timeout = milliseconds(400);
  StoreServer server("127.0.0.1", 0, limits);
  const int silent = rawClient(server.port());
  StoreClient talker("127.0.0.1", server.port(), milliseconds(2000));
  for (int i = 0; i < 12; ++i) {
    talker.set("beat", std::to_string(i));
    usleep(100000);
  }
  EXPECT_TRUE(closedByServer(silent, milliseconds(3000)));
  ::close(silent);
  EXPECT_EQ(talker.get("beat"), "11") << "the talking client is still connected";
}

TEST(Store, ValuesKeysAndTheWholeStoreAreBounded) {
  StoreLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 100;
  limits.max_store_bytes = 400;
  StoreServer server("127.0.0.1", 0, limits);
  StoreClient c("127.0.0.1", server.port(), milliseconds(2000));
  c.set("a", std::string(100, 'v'));
  try {
    c.set("b", std::string(101, 'v'));
    FAIL() << "a value over the bound was kept";
  } catch (const DistError& e) {
    EXPECT_NE(e.message().find("at most 100"), std::string::npos) << e.message();
  }
  EXPECT_THROW(c.set("123456789", "v"), DistError);
  c.set("a", std::string(100, 'w'));  // replacing a value does not count it twice
  c.set("b", std::string(100, 'v'));
  c.set("c", std::string(100, 'v'));
  try {
    c.set("d", std::string(100, 'v'));
    FAIL() << "the store grew past its bound";
  } catch (const DistError& e) {
    EXPECT_NE(e.message().find("store full"), std::string::npos) << e.message();
  }
  EXPECT_EQ(c.get("d"), std::nullopt);
  EXPECT_EQ(c.get("a"), std::string(100, 'w'));
}

TEST(Store, ALineLongerThanAnyRequestDropsItsClient) {
  StoreLimits limits;
  limits.max_value_bytes = 1000;
  StoreServer server("127.0.0.1", 0, limits);
  const int garbage = rawClient(server.port());
  sendAll(garbage, std::string(5000, 'g'));
  EXPECT_TRUE(closedByServer(garbage, milliseconds(5000)));
  ::close(garbage);
  StoreClient c("127.0.0.1", server.port(), milliseconds(2000));
  c.set("still", "served");
  EXPECT_EQ(c.get("still"), "served");
}

TEST(Store, ListensOnTheAddressTheEndpointNames) {
  EXPECT_EQ(StoreServer("127.0.0.1", 0).boundAddress(), "127.0.0.1");
  EXPECT_EQ(StoreServer("localhost", 0).boundAddress(), "127.0.0.1");
  EXPECT_EQ(StoreServer("", 0).boundAddress(), "0.0.0.0");
  EXPECT_THROW(StoreServer("192.0.2.77", 0), ConfigError) << "TEST-NET-1 is no address of this machine";
  // A loopback endpoint is not reachable at the machine's other addresses.
  StoreServer loopback("127.0.0.1", 0);
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  std::string other;
  for (ifaddrs* a = list; a != nullptr && other.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) != 0) other = text;
  }
  freeifaddrs(list);
  if (other.empty()) GTEST_SKIP() << "no address other than loopback here";
  EXPECT_THROW(StoreClient(other, loopback.port(), milliseconds(300)), TimeoutError) << other;
  StoreServer everywhere("", 0);
  EXPECT_NO_THROW(StoreClient(other, everywhere.port(), milliseconds(2000))) << other;
}

TEST(Store, NoSpinningAtTheDescriptorLimit) {
  // The store in a child process allowed a few descriptors; this process opens more connections than that.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    StoreServer server("127.0.0.1", 0);
    int fds = 0;
    for (int fd = 0; fd < 1024; ++fd) fds += fcntl(fd, F_GETFD) != -1;
    const rlimit tight{rlim_t(fds + 3), rlim_t(fds + 3)};
    setrlimit(RLIMIT_NOFILE, &tight);
    const int port = server.port();
    (void)!write(ready[1], &port, sizeof port);
    sleep(30);
    _exit(0);
  }
  int port = 0;
  ASSERT_EQ(read(ready[0], &port, sizeof port), ssize_t(sizeof port));
  std::vector<int> clients;
  for (int i = 0; i < 20; ++i) clients.push_back(rawClient(port));
  auto cpuTicks = [&] {
    const std::string stat = [&] {
      std::ifstream in("/proc/" + std::to_string(child) + "/stat");
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }();
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string field;
    long ticks = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i)
      if (i >= 14) ticks += std::stol(field);  // utime, stime
    return ticks;
  };
  usleep(200000);
  const long before = cpuTicks();
  usleep(1000000);
  const long used = cpuTicks() - before;

  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  for (int fd : clients) ::close(fd);
  EXPECT_LT(used, sysconf(_SC_CLK_TCK) / 4) << "CPU ticks in one second at the descriptor limit";
}

TEST(Store, MalformedRendezvousDataIsNamed) {
  EXPECT_EQ(parseStoreInteger("42", "run/0/size", "h:1"), 42);
  try {
    parseStoreInteger("4x2", "run/0/size", "node0:29400");
    FAIL() << "accepted";
  } catch (const DistError& e) {
    EXPECT_NE(e.message().find("malformed rendezvous data at node0:29400: 'run/0/size' holds '4x2'"),
              std::string::npos)
        << e.message();
  }
  EXPECT_THROW(parseStoreInteger("", "k", "e"), DistError);
  EXPECT_THROW(parseStoreInteger("99999999999999999999999", "k", "e"), DistError);
  // A client reads a value set by someone else as the integer the protocol wants: a clear error.
  StoreServer server("127.0.0.1", 0);
  StoreClient c("127.0.0.1", server.port(), milliseconds(2000));
  c.set("size", "two");
  EXPECT_THROW(parseStoreInteger(c.wait("size", milliseconds(500)), "size", c.endpoint()), DistError);
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
