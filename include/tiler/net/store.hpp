// store: the key-value store ctrun's agents meet at (torch elastic's Store), as one interface over how it is
// reached: a TCP store one agent hosts (tcp_store.hpp) or a directory every node sees (file_store.hpp).
// Promise: every call takes its own timeout and throws DistError naming the store when the store fails or
// refuses, TimeoutError (a DistError) when the time ran out; no call waits past its timeout for the store to
// answer. Keys and values are text; a key written with set is read with get, a key counted with add is read
// with add(key, 0) (or get). A store object is one client: not thread safe, one per thread. No LibTorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace tiler {

class Store {
 public:
  virtual ~Store() = default;
  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) = 0;
  virtual std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds `delta` to the integer at `key` (0 when absent) and returns the sum: concurrent adds of 1 from any
  // number of clients return 1, 2, 3, ... each exactly once.
  virtual int64_t add(const std::string& key, int64_t delta, std::chrono::milliseconds timeout) = 0;
  // The value of `key` once it is set, polled; TimeoutError naming the key and the store after `timeout`.
  // `between` runs between polls (it may throw to stop waiting: ctrun's signals).
  std::string wait(const std::string& key, std::chrono::milliseconds timeout,
                   const std::function<void()>& between = {});
  // What messages call the store: "HOST:PORT", or the directory.
  virtual const std::string& endpoint() const = 0;
  // Whether some process hosts the store (it is lost with that process), and whether it is this one.
  virtual bool hosted() const { return false; }
  virtual bool hostedHere() const { return false; }
};

// The integer stored at `key`; DistError naming the key, its value and the store when it holds anything else
// (a store shared with something else, or a hostile client, must not end an agent with a bare "stoi").
int64_t parseStoreInteger(const std::string& text, const std::string& key, const std::string& endpoint);

}  // namespace tiler
