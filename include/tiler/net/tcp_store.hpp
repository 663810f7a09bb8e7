// tcp_store: the TCP store ctrun's agents meet at (the Store of store.hpp), hosted by one agent: a small
// key-value server (one text line per request) and its client. ctrun links no LibTorch (it starts in
// milliseconds; loading libtorch_cpu for c10d's TCPStore costs far more), so the store is this one: set, get,
// add, and waiting on a key by polling. Also the TCP helpers ctrun and dist share: connecting with retries,
// endpoints, free ports, this machine's addresses.
// Promise: every call is bounded by its timeout and throws DistError (TimeoutError when the time ran out)
// naming the endpoint; a store host that goes away is an error on the next call, never a hang. Keys and
// values are single-line text (no '\n'), bounded in size (StoreLimits). No authentication (like c10d's
// TCPStore): whoever reaches the port can read and write keys. No LibTorch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tiler/net/store.hpp"

namespace tiler {

// What one store accepts, so that no client, slow or hostile, can stall it or grow it without bound.
struct StoreLimits {
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = size_t(1) << 20;
  size_t max_store_bytes = size_t(64) << 20;  // every key and value held
  // Replies a client has not read yet: beyond this its further requests wait in the kernel, unread.
  size_t max_unread_reply_bytes = size_t(4) << 20;
  // The same over every client together (100 clients pipelining 1 MB GETs grew the store by 750 MiB):
  // beyond it no client's requests are handled until replies are read or their clients dropped.
  size_t max_total_unread_reply_bytes = size_t(64) << 20;
  // A client with replies waiting that reads none of them for this long is dropped.
  std::chrono::milliseconds stall_timeout{30000};
  // A client that sends nothing for this long is dropped (an agent polls or beats far more often).
  std::chrono::milliseconds idle_timeout{600000};
  size_t max_clients = 4096;
};

class TcpStoreServer {
 public:
  // Listens on `bind_host` (the address the endpoint names; "" or "0.0.0.0": every interface; a host name
  // that resolves to a loopback address, as Debian maps a machine's own name, also every interface, since
  // other nodes reach it by another address) at `port` (0: a free one). Throws DistError when it cannot
  // (the port is taken), ConfigError when `bind_host` is not an address of this machine.
  // One thread serves every client with non-blocking I/O: a client that does not read its replies holds
  // back only itself, and is dropped after limits.stall_timeout.
  TcpStoreServer(const std::string& bind_host, int port, StoreLimits limits = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }
  // The IPv4 address it listens on ("0.0.0.0": every interface).
  const std::string& boundAddress() const { return bound_address_; }
  // Reply bytes its clients have not read, all together (for tests and logs).
  size_t unreadReplyBytes() const { return unread_total_.load(); }
  // What its clients' buffers hold in memory, all together (for tests): the unread replies and a request's
  // length a client, beyond the few KiB each keeps.
  size_t bufferedBytes() const { return held_total_.load(); }

 private:
  struct Client;
  void loop();
  // One client's turn of the loop: reads, answers within the bounds, sends; drops it when it is gone,
  // talks garbage or stalls. `total`: every client's unread reply bytes, kept current.
  void serveClient(Client& c, short revents, std::chrono::steady_clock::time_point now, size_t& total);
  void acceptClients(std::vector<Client>& clients);
  // Sends what the socket takes now; false when the client is gone.
  bool sendReplies(Client& c, std::chrono::steady_clock::time_point now);
  std::string handle(const std::string& request);
  // The longest request line: "SET <key> <value>".
  size_t maxRequestBytes() const { return limits_.max_key_bytes + limits_.max_value_bytes + 16; }

  StoreLimits limits_;
  int port_ = 0;
  std::string bound_address_;
  int listen_fd_ = -1;
  int spare_fd_ = -1;                        // given up for a moment to refuse a client at the fd limit
  int wake_[2] = {-1, -1};                   // a byte here stops the loop
  std::map<std::string, std::string> data_;  // the server thread's only
  size_t data_bytes_ = 0;                    // keys and values in data_
  std::atomic<size_t> unread_total_{0};      // written by the server thread each turn
  std::atomic<size_t> held_total_{0};        // likewise
  std::thread thread_;
};

// Who hosts the store an agent meets at: never this agent, this one if it can bind the port first (several
// agents of one machine race for it), or this one.
enum class StoreHosting { kNever, kMay, kMust };

class TcpStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout` (the store may not be up yet).
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStore() override;
  // Hosts the store at host:port as `hosting` says (retried: the port can be held a while by the local end of
  // another connection) and connects to it, both until `timeout` (the host may start later); `between` runs
  // between tries (it may throw). The store returned keeps the server it hosts. TimeoutError when no agent
  // hosts it in time, ConfigError when host is no address of this machine and this agent must host.
  static std::unique_ptr<TcpStore> meet(const std::string& host, int port, StoreHosting hosting,
                                        StoreLimits limits, std::chrono::milliseconds timeout,
                                        const std::function<void()>& between);

  void set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) override;
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta, std::chrono::milliseconds timeout) override;
  const std::string& endpoint() const override { return endpoint_; }
  bool hosted() const override { return true; }
  bool hostedHere() const override { return server_ != nullptr; }
  // The address this side of the connection has (what other nodes may reach this host by).
  std::string localAddress() const;

 private:
  std::string request(const std::string& line, std::chrono::milliseconds timeout);
  // The next reply line; TimeoutError at `deadline`, DistError when the connection closed.
  std::string readReply(std::chrono::steady_clock::time_point deadline);
  // The value of a "VAL <value>" reply; DistError for anything else.
  std::string valueOf(const std::string& reply, const std::string& key) const;

  std::string endpoint_;
  int fd_ = -1;
  std::string pending_;                     // bytes read past the last reply
  int64_t unanswered_ = 0;                  // requests sent whose replies are not read yet (they timed out)
  std::unique_ptr<TcpStoreServer> server_;  // the store, when this agent hosts it
};

// A connected TCP socket to host:port (any of its addresses), retrying every 20 ms until `timeout` (the
// listener may not be up yet); TimeoutError "<what> at host:port within T s: <last error>" after it.
int connectTcp(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what);

// "host:port" -> (host, port); throws ConfigError naming `flag` on nonsense.
std::pair<std::string, int> parseEndpoint(const std::string& endpoint, const std::string& flag);
// True when `host` names this machine (loopback, its hostname, or one of its addresses).
bool isLocalHost(const std::string& host);
// How other machines reach this one when no address was given: its host name where this machine resolves it
// (torch elastic hands out the same), else the first IPv4 address of an interface that is up and not
// loopback (a container whose name is in no hosts file or DNS), else 127.0.0.1 (this machine only).
std::string addressOthersReach();
// A free TCP port on 127.0.0.1 (bound and released); ConfigError when none can be had.
int findFreePort();
// True when the TCP port can be bound on all interfaces right now.
bool portIsFree(int port);

}  // namespace tiler
