// rendezvous: the stores agents meet at (net/): the properties every Store keeps, over the TCP store and the
// file store alike (set/get/add/wait, bounded calls, concurrent adds, whole values); the TCP store's server
// (a host that goes away, clients that misbehave, bounds) and the file store's files (keys of any bytes, a
// run's keys removed). The agents themselves are tested as real processes in launcher_test (Rendezvous.*).
#include "tiler/net/file_store.hpp"
#include "tiler/net/tcp_store.hpp"

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
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

using std::chrono::milliseconds;
// The bound of one call where a test does not say.
constexpr milliseconds kCall{2000};

// One kind of store and its clients, each as another node would have it.
class StoreKind {
 public:
  explicit StoreKind(const std::string& kind) : kind_(kind) {
    if (kind == "tcp") {
      server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
    } else {
      directory_ = std::filesystem::path(::testing::TempDir()) /
                   ("rendezvous_files_" + std::to_string(getpid()) + "_" + std::to_string(++made_));
      std::filesystem::remove_all(directory_);
    }
  }
  ~StoreKind() {
    if (!directory_.empty()) std::filesystem::remove_all(directory_);
  }
  std::unique_ptr<Store> client() const {
    if (server_) return std::make_unique<TcpStore>("127.0.0.1", server_->port(), milliseconds(2000));
    return std::make_unique<FileStore>(directory_.string());
  }
  const std::filesystem::path& directory() const { return directory_; }

 private:
  std::string kind_;
  std::unique_ptr<TcpStoreServer> server_;
  std::filesystem::path directory_;
  static inline int made_ = 0;
};

class StoreContract : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Stores, StoreContract, ::testing::Values("tcp", "file"),
                         [](const auto& info) { return info.param; });

TEST_P(StoreContract, SetGetAddAndWaitAcrossClients) {
  const StoreKind kind(GetParam());
  auto a = kind.client(), b = kind.client();
  EXPECT_EQ(a->get("k", kCall), std::nullopt);
  a->set("k", "value with spaces", kCall);
  EXPECT_EQ(b->get("k", kCall), "value with spaces");
  a->set("k", "replaced", kCall);
  EXPECT_EQ(b->get("k", kCall), "replaced");
  a->set("empty", "", kCall);
  EXPECT_EQ(b->get("empty", kCall), "");
  EXPECT_EQ(a->add("n", 1, kCall), 1);
  EXPECT_EQ(b->add("n", 2, kCall), 3);
  EXPECT_EQ(a->add("n", 0, kCall), 3);
  EXPECT_EQ(b->get("n", kCall), "3");
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(200));
    b->set("ready", "yes", kCall);
  });
  EXPECT_EQ(a->wait("ready", milliseconds(2000)), "yes");
  later.join();
  EXPECT_THROW(a->add("k", 1, kCall), DistError);  // not a counter: refused, the client stays usable
  EXPECT_EQ(a->get("n", kCall), "3");
}

// Concurrent adds of 1 hand out 1..N, each exactly once: the c10d and file rendezvous rank nodes by them.
TEST_P(StoreContract, ConcurrentAddsCountEveryClientOnce) {
  const StoreKind kind(GetParam());
  constexpr int kClients = 8, kAdds = 25;
  std::vector<std::vector<int64_t>> got(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      auto store = kind.client();
      for (int i = 0; i < kAdds; ++i)
        got[size_t(c)].push_back(store->add("arrivals", 1, milliseconds(10000)));
    });
  for (auto& t : clients) t.join();
  std::set<int64_t> seen;
  for (const auto& mine : got) {
    EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
    seen.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(seen.size(), size_t(kClients * kAdds)) << "no sum handed out twice";
  EXPECT_EQ(*seen.begin(), 1);
  EXPECT_EQ(*seen.rbegin(), kClients * kAdds);
  EXPECT_EQ(kind.client()->add("arrivals", 0, kCall), kClients * kAdds);
}

TEST_P(StoreContract, AWaitIsBoundedAndNamesTheKeyAndTheStore) {
  const StoreKind kind(GetParam());
  auto store = kind.client();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    store->wait("never", milliseconds(300));
    FAIL() << "waited forever";
  } catch (const TimeoutError& e) {
    EXPECT_NE(e.message().find("'never'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(store->endpoint()), std::string::npos) << e.message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(5000));
  int polls = 0;
  EXPECT_THROW(
      store->wait("never", milliseconds(300), [&] { throw std::runtime_error(std::to_string(++polls)); }),
      std::runtime_error)
      << "`between` runs between polls and may stop the wait";
}

// A value replaced while others read it is read whole: the old one or the new one, never a mixture.
TEST_P(StoreContract, AValueIsReadWholeWhileItIsReplaced) {
  const StoreKind kind(GetParam());
  const std::string first(20000, 'a'), second(30000, 'b');
  auto writer = kind.client(), reader = kind.client();
  writer->set("v", first, kCall);
  std::atomic<bool> stop{false};
  std::thread writing([&] {
    for (int i = 0; !stop; ++i) writer->set("v", i % 2 ? first : second, kCall);
  });
  int mixed = 0;
  for (int i = 0; i < 300; ++i) {
    const auto v = reader->get("v", kCall);
    mixed += !v || (*v != first && *v != second);
  }
  stop = true;
  writing.join();
  EXPECT_EQ(mixed, 0);
}

TEST(Store, EveryCallIsBoundedAndAGoneHostIsAnError) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const int port = server->port();
  TcpStore c("127.0.0.1", port, milliseconds(500));
  server.reset();
  EXPECT_THROW(c.get("k", kCall), DistError);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(TcpStore("127.0.0.1", port, milliseconds(300)), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(10000)) << "no hang past its timeout";
  // A second host on a taken port is refused (the agent then joins as a client).
  TcpStoreServer first("", 0);
  EXPECT_THROW(TcpStoreServer second("", first.port()), DistError);
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

// A call that timed out leaves its reply to come late: the next call must get its own, not that one.
TEST(Store, AReplyThatCameTooLateIsNotTakenForTheNextOne) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::atomic<bool> first_timed_out{false};
  // A store that answers its first request only once the client has given up on it.
  std::thread slow_store([&] {
    const int fd = accept(listener, nullptr, nullptr);
    std::string got;
    char buf[256];
    for (int lines = 0; lines < 2;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, size_t(n));
      for (; lines < 2 && std::count(got.begin(), got.end(), '\n') > lines; ++lines) {
        while (lines == 0 && !first_timed_out) std::this_thread::sleep_for(milliseconds(10));
        sendAll(fd, lines == 0 ? "VAL late\n" : "VAL mine\n");
      }
    }
    ::close(fd);
  });
  TcpStore c("127.0.0.1", ntohs(addr.sin_port), kCall);
  EXPECT_THROW(c.get("first", milliseconds(100)), TimeoutError);
  first_timed_out = true;
  EXPECT_EQ(c.get("second", kCall), "mine");
  slow_store.join();
  ::close(listener);
}

TEST(Store, AClientThatNeverReadsStallsOnlyItself) {
  StoreLimits limits;
  limits.max_unread_reply_bytes = 64 << 10;
  limits.stall_timeout = milliseconds(500);
  TcpStoreServer server("127.0.0.1", 0, limits);
  TcpStore writer("127.0.0.1", server.port(), milliseconds(2000));
  writer.set("big", std::string(1 << 20, 'x'), kCall);
  // 200 pipelined GETs of 1 MB, none of the replies read: a blocking send() froze the whole store here.
  const int hog = rawClient(server.port());
  std::string gets;
  for (int i = 0; i < 200; ++i) gets += "GET big\n";
  sendAll(hog, gets);
  TcpStore other("127.0.0.1", server.port(), milliseconds(2000));
  for (int i = 0; i < 20; ++i) {
    other.set("k", std::to_string(i), kCall);
    EXPECT_EQ(other.add("n", 1, kCall),
              i + 1);  // each call bounded by the client's 2 s: a frozen store throws
  }
  usleep(1500000);  // three stall timeouts, none of its replies read
  EXPECT_TRUE(closedByServer(hog, milliseconds(5000))) << "a client that does not read is dropped";
  ::close(hog);
  EXPECT_EQ(other.get("k", kCall), "19");
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
  TcpStoreServer server("127.0.0.1", 0, limits);
  TcpStore writer("127.0.0.1", server.port(), milliseconds(5000));
  const std::string big(1 << 20, 'x');
  writer.set("big", big, milliseconds(5000));
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
  TcpStore reader("127.0.0.1", server.port(), milliseconds(30000));
  EXPECT_EQ(reader.get("big", milliseconds(30000)), big) << "served once the hogs are dropped";
  for (int fd : hogs) ::close(fd);
}

// A client that reads its replies, but slowly, while it keeps asking: the store holds what is still to send,
// not everything it ever sent that client (the sent part of a reply buffer was kept until it drained whole).
TEST(Store, ASlowReaderCostsWhatIsUnsentNotWhatWasSent) {
  StoreLimits limits;
  limits.max_unread_reply_bytes = 2 << 20;
  TcpStoreServer server("127.0.0.1", 0, limits);
  TcpStore writer("127.0.0.1", server.port(), milliseconds(5000));
  const std::string big(1 << 20, 'x');
  writer.set("big", big, milliseconds(5000));
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
  TcpStoreServer server("127.0.0.1", 0, limits);
  const int silent = rawClient(server.port());
  TcpStore talker("127.0.0.1", server.port(), milliseconds(2000));
  for (int i = 0; i < 12; ++i) {
    talker.set("beat", std::to_string(i), kCall);
    usleep(100000);
  }
  EXPECT_TRUE(closedByServer(silent, milliseconds(3000)));
  ::close(silent);
  EXPECT_EQ(talker.get("beat", kCall), "11") << "the talking client is still connected";
}

TEST(Store, ValuesKeysAndTheWholeStoreAreBounded) {
  StoreLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 100;
  limits.max_store_bytes = 400;
  TcpStoreServer server("127.0.0.1", 0, limits);
  TcpStore c("127.0.0.1", server.port(), milliseconds(2000));
  c.set("a", std::string(100, 'v'), kCall);
  try {
    c.set("b", std::string(101, 'v'), kCall);
    FAIL() << "a value over the bound was kept";
  } catch (const DistError& e) {
    EXPECT_NE(e.message().find("at most 100"), std::string::npos) << e.message();
  }
  EXPECT_THROW(c.set("123456789", "v", kCall), DistError);
  c.set("a", std::string(100, 'w'), kCall);  // replacing a value does not count it twice
  c.set("b", std::string(100, 'v'), kCall);
  c.set("c", std::string(100, 'v'), kCall);
  try {
    c.set("d", std::string(100, 'v'), kCall);
    FAIL() << "the store grew past its bound";
  } catch (const DistError& e) {
    EXPECT_NE(e.message().find("store full"), std::string::npos) << e.message();
  }
  EXPECT_EQ(c.get("d", kCall), std::nullopt);
  EXPECT_EQ(c.get("a", kCall), std::string(100, 'w'));
}

TEST(Store, ALineLongerThanAnyRequestDropsItsClient) {
  StoreLimits limits;
  limits.max_value_bytes = 1000;
  TcpStoreServer server("127.0.0.1", 0, limits);
  const int garbage = rawClient(server.port());
  sendAll(garbage, std::string(5000, 'g'));
  EXPECT_TRUE(closedByServer(garbage, milliseconds(5000)));
  ::close(garbage);
  TcpStore c("127.0.0.1", server.port(), milliseconds(2000));
  c.set("still", "served", kCall);
  EXPECT_EQ(c.get("still", kCall), "served");
}

TEST(Store, ListensOnTheAddressTheEndpointNames) {
  EXPECT_EQ(TcpStoreServer("127.0.0.1", 0).boundAddress(), "127.0.0.1");
  EXPECT_EQ(TcpStoreServer("localhost", 0).boundAddress(), "127.0.0.1");
  EXPECT_EQ(TcpStoreServer("", 0).boundAddress(), "0.0.0.0");
  EXPECT_THROW(TcpStoreServer("192.0.2.77", 0), ConfigError) << "TEST-NET-1 is no address of this machine";
  // A loopback endpoint is not reachable at the machine's other addresses.
  TcpStoreServer loopback("127.0.0.1", 0);
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
  EXPECT_THROW(TcpStore(other, loopback.port(), milliseconds(300)), TimeoutError) << other;
  TcpStoreServer everywhere("", 0);
  EXPECT_NO_THROW(TcpStore(other, everywhere.port(), milliseconds(2000))) << other;
}

TEST(Store, NoSpinningAtTheDescriptorLimit) {
  // The store in a child process allowed a few descriptors; this process opens more connections than that.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TcpStoreServer server("127.0.0.1", 0);
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
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore c("127.0.0.1", server.port(), milliseconds(2000));
  c.set("size", "two", kCall);
  EXPECT_THROW(parseStoreInteger(c.wait("size", milliseconds(500)), "size", c.endpoint()), DistError);
}

TEST(FileStore, KeysOfAnyBytesRoundTripAndARunsKeysAreRemovedAlone) {
  const StoreKind kind("file");
  auto a = kind.client(), b = kind.client();
  const std::vector<std::string> keys = {"run/0/hb/1", ".hidden",     "a%2Fb",
                                         "sp ace",     "run/0/x=y+1", "\xc3\xbc"};
  for (const auto& key : keys) a->set(key, "value of " + key, kCall);
  for (const auto& key : keys) EXPECT_EQ(b->get(key, kCall), "value of " + key) << key;
  EXPECT_EQ(a->add("run/0/joined", 2, kCall), 2);
  b->set("runner/0/hb/1", "kept", kCall);
  for (const auto& entry : std::filesystem::directory_iterator(kind.directory()))
    EXPECT_NE(entry.path().filename().string().front(), '.') << "a temporary file was left: " << entry.path();
  static_cast<FileStore&>(*a).removeKeys("run/");
  EXPECT_EQ(b->get("run/0/hb/1", kCall), std::nullopt);
  EXPECT_EQ(b->get("run/0/x=y+1", kCall), std::nullopt);
  EXPECT_EQ(b->add("run/0/joined", 0, kCall), 0);
  EXPECT_EQ(b->get("runner/0/hb/1", kCall), "kept");
  EXPECT_EQ(b->get(".hidden", kCall), "value of .hidden");
  EXPECT_EQ(a->add("run/0/joined", 1, kCall), 1) << "a counter removed counts again from 0";
}

TEST(FileStore, ItsDirectoryIsMadeAndWhatItCannotHoldIsRefusedByName) {
  const StoreKind kind("file");
  EXPECT_FALSE(std::filesystem::exists(kind.directory()));
  auto store = kind.client();
  EXPECT_TRUE(std::filesystem::is_directory(kind.directory()));
  const std::string file = kind.directory().string() + "/plain";
  std::ofstream(file) << "x";
  try {
    FileStore nowhere(file + "/sub");
    FAIL() << "a store under a file";
  } catch (const DistError& e) {
    EXPECT_NE(e.message().find(file + "/sub"), std::string::npos) << e.message();
  }
  EXPECT_THROW(store->set(std::string(300, 'k'), "v", kCall), DistError);
  EXPECT_THROW(store->set("big", std::string(FileStore::kMaxValueBytes + 1, 'v'), kCall), DistError);
  std::ofstream(kind.directory().string() + "/huge=") << std::string(FileStore::kMaxValueBytes + 1, 'v');
  EXPECT_THROW(store->get("huge", kCall), DistError) << "a value too large to be one of ours";
}

TEST(Store, FlagsParse) {
  EXPECT_EQ(parseEndpoint("node0:29400", "--rdzv_endpoint"), std::make_pair(std::string("node0"), 29400));
  EXPECT_THROW(parseEndpoint("node0", "--rdzv_endpoint"), ConfigError);
  EXPECT_THROW(parseEndpoint("node0:0", "--rdzv_endpoint"), ConfigError);
  EXPECT_THROW(parseEndpoint("node0:70000", "--rdzv_endpoint"), ConfigError);
  EXPECT_TRUE(isLocalHost("127.0.0.1"));
  EXPECT_TRUE(isLocalHost("localhost"));
  EXPECT_FALSE(isLocalHost("192.0.2.77"));  // TEST-NET-1
}

}  // namespace
}  // namespace tiler
