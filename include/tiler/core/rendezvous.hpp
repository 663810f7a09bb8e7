// rendezvous: how ctrun agents on several nodes meet and share one fate. A small key-value store (one text
// line per request over TCP) hosted by the agent at --rdzv_endpoint; each agent keeps one connection.
// ctrun links no LibTorch (it starts in milliseconds; loading libtorch_cpu for c10d's TCPStore costs far
// more), so the store is this one: set, get, add, and waiting on a key by polling.
// Promise: every call is bounded by the client's timeout and throws DistError (TimeoutError when the time
// ran out) naming the endpoint; a store host that goes away is an error on the next call, never a hang.
// Keys and values are single-line text (no '\n'), bounded in size (StoreLimits). Not thread safe: one client
// per thread. No authentication (like c10d's TCPStore): whoever reaches the port can read and write keys.
// No LibTorch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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

class StoreServer {
 public:
  // Listens on `bind_host` (the address the endpoint names; "" or "0.0.0.0": every interface; a host name
  // that resolves to a loopback address, as Debian maps a machine's own name, also every interface, since
  // other nodes reach it by another address) at `port` (0: a free one). Throws DistError when it cannot
  // (the port is taken), ConfigError when `bind_host` is not an address of this machine.
  // One thread serves every client with non-blocking I/O: a client that does not read its replies holds
  // back only itself, and is dropped after limits.stall_timeout.
  StoreServer(const std::string& bind_host, int port, StoreLimits limits = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
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

class StoreClient {
 public:
  // Connects to host:port, retrying until `timeout` (the store may not be up yet).
  StoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  std::optional<std::string> get(const std::string& key);
  // Adds `delta` to the integer at `key` (0 when absent) and returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  // The value of `key` once it is set; TimeoutError after `timeout`. `between` runs between polls (it may
  // throw to stop waiting: ctrun's signals).
  std::string wait(const std::string& key, std::chrono::milliseconds timeout,
                   const std::function<void()>& between = {});
  // The address this side of the connection has (what other nodes may reach this host by).
  std::string localAddress() const;
  const std::string& endpoint() const { return endpoint_; }
  // The bound of every later call.
  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::string request(const std::string& line);
  // The value of a "VAL <value>" reply; DistError for anything else.
  std::string valueOf(const std::string& reply, const std::string& key) const;

  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::string pending_;  // bytes read past the last reply
};

// A connected TCP socket to host:port (any of its addresses), retrying every 20 ms until `timeout` (the
// listener may not be up yet); TimeoutError "<what> at host:port within T s: <last error>" after it.
int connectTcp(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what);

// The integer stored at `key`; DistError naming the key, its value and the store when it holds anything else
// (a store shared with something else, or a hostile client, must not end an agent with a bare "stoi").
int64_t parseStoreInteger(const std::string& text, const std::string& key, const std::string& endpoint);

// "host:port" -> (host, port); throws ConfigError naming `flag` on nonsense.
std::pair<std::string, int> parseEndpoint(const std::string& endpoint, const std::string& flag);
// "N" or "MIN:MAX" -> (min, max); throws ConfigError.
std::pair<int, int> parseNodeRange(const std::string& spec);
// True when `host` names this machine (loopback, its hostname, or one of its addresses).
bool isLocalHost(const std::string& host);

}  // namespace tiler
