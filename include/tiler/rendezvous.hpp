// rendezvous: how ctrun agents on several nodes meet and share one fate. A small key-value store (one text
// line per request over TCP) hosted by the agent at --rdzv_endpoint; each agent keeps one connection.
// ctrun links no LibTorch (it starts in milliseconds; loading libtorch_cpu for c10d's TCPStore costs far
// more), so the store is this one: set, get, add, and waiting on a key by polling.
// Promise: every call is bounded by the client's timeout and throws DistError (TimeoutError when the time
// ran out) naming the endpoint; a store host that goes away is an error on the next call, never a hang.
// Keys and values are single-line text (no '\n'). Not thread safe: one client per thread. No LibTorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace tiler {

class StoreServer {
 public:
  // Listens on all interfaces at `port` (0: a free one). Throws DistError when the port cannot be bound.
  explicit StoreServer(int port);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const { return port_; }

 private:
  void loop();
  std::string handle(const std::string& request);

  int port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};                   // a byte here stops the loop
  std::map<std::string, std::string> data_;  // the server thread's only
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
  // The value of `key` once it is set; TimeoutError after `timeout`.
  std::string wait(const std::string& key, std::chrono::milliseconds timeout);
  // The address this side of the connection has (what other nodes may reach this host by).
  std::string localAddress() const;
  const std::string& endpoint() const { return endpoint_; }
  // The bound of every later call.
  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::string request(const std::string& line);

  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::string pending_;  // bytes read past the last reply
};

// A connected TCP socket to host:port (any of its addresses), retrying every 20 ms until `timeout` (the
// listener may not be up yet); TimeoutError "<what> at host:port within T s: <last error>" after it.
int connectTcp(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what);

// "host:port" -> (host, port); throws ConfigError naming `flag` on nonsense.
std::pair<std::string, int> parseEndpoint(const std::string& endpoint, const std::string& flag);
// "N" or "MIN:MAX" -> (min, max); throws ConfigError.
std::pair<int, int> parseNodeRange(const std::string& spec);
// True when `host` names this machine (loopback, its hostname, or one of its addresses).
bool isLocalHost(const std::string& host);

}  // namespace tiler
