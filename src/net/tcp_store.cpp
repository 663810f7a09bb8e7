#include "tiler/net/tcp_store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "tiler/core/error.hpp"

namespace tiler {
namespace {

using Clock = std::chrono::steady_clock;

bool writeAllTo(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

std::string firstWord(const std::string& s, size_t& rest) {
  const size_t space = s.find(' ');
  rest = space == std::string::npos ? s.size() : space + 1;
  return s.substr(0, space);
}

// The IPv4 address to listen on for an endpoint's host (see TcpStoreServer's constructor).
in_addr_t bindAddressFor(const std::string& host) {
  if (host.empty() || host == "0.0.0.0" || host == "*") return htonl(INADDR_ANY);
  in_addr numeric{};
  if (inet_pton(AF_INET, host.c_str(), &numeric) == 1) return numeric.s_addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  TILER_CHECK(rc == 0 && found != nullptr, DistError,
              "cannot host the rendezvous store at '" << host << "': " << gai_strerror(rc));
  const in_addr_t addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr.s_addr;
  freeaddrinfo(found);
  const bool loopback = (ntohl(addr) >> 24) == 127;
  // "localhost" means this machine only; another name mapped to loopback here is reached by other nodes at
  // the address their resolver gives, so it must be heard on every interface.
  if (loopback && host != "localhost") return htonl(INADDR_ANY);
  return addr;
}

}  // namespace

struct TcpStoreServer::Client {
  int fd = -1;
  std::string in;  // bytes received past the last whole request
  // Replies not yet sent, each its own string of its own size (one growing buffer held up to twice what it
  // had to send), the first sent up to `first_sent`.
  std::deque<std::string> replies;
  size_t first_sent = 0;
  size_t unread_bytes = 0;
  Clock::time_point waiting_since{};  // when replies last became non-empty or last drained a byte
  Clock::time_point heard_from{};     // when it last sent a byte (or connected)
  size_t unread() const { return unread_bytes; }
  // What its buffers hold in memory.
  size_t held() const {
    size_t bytes = in.capacity();
    for (const auto& r : replies) bytes += r.capacity();
    return bytes;
  }
  void drop() {
    ::close(fd);
    fd = -1;
  }
  // Small replies share a buffer of up to kKeptBufferBytes (a string apiece would cost its object and slot
  // for each 3-byte "OK"); a large one has its own of its own size.
  void queue(const std::string& body, Clock::time_point now) {
    if (replies.empty()) waiting_since = now;
    unread_bytes += body.size() + 1;
    if (!replies.empty() && replies.back().size() + body.size() + 1 <= kKeptBufferBytes) {
      replies.back().append(body).push_back('\n');
      return;
    }
    std::string reply;
    reply.reserve(std::max(body.size() + 1, body.size() < kKeptBufferBytes / 2 ? kKeptBufferBytes / 4 : 0));
    reply.append(body).push_back('\n');
    replies.push_back(std::move(reply));
  }
  // A drained input buffer gives back what a long request made it grow to.
  void compact() {
    if (in.empty() && in.capacity() > kKeptBufferBytes) std::string().swap(in);
  }
  static constexpr size_t kKeptBufferBytes = 64 << 10;
};

TcpStoreServer::TcpStoreServer(const std::string& bind_host, int port, StoreLimits limits) : limits_(limits) {
  const in_addr_t address = bindAddressFor(bind_host);
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  TILER_CHECK(listen_fd_ >= 0, DistError, "rendezvous store: socket: " << std::strerror(errno));
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = address;
  addr.sin_port = htons(uint16_t(port));
  socklen_t len = sizeof addr;
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listen_fd_, 64) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    // Waiting cannot help: the endpoint names another machine.
    TILER_CHECK(err != EADDRNOTAVAIL, ConfigError,
                "cannot host the rendezvous store at " << bind_host << ": not an address of this machine");
    TILER_THROW(DistError, "cannot host the rendezvous store on "
                               << (bind_host.empty() ? "port " : bind_host + ":") << port << ": "
                               << std::strerror(err));
  }
  port_ = ntohs(addr.sin_port);
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &addr.sin_addr, text, sizeof text);
  bound_address_ = text;
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  TILER_CHECK(pipe2(wake_, O_CLOEXEC) == 0, DistError, "pipe: " << std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char b = 0;
  (void)!write(wake_[1], &b, 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

std::string TcpStoreServer::handle(const std::string& request) {
  size_t rest = 0;
  const std::string op = firstWord(request, rest);
  size_t value_at = 0;
  const std::string key = firstWord(request.substr(rest), value_at);
  const std::string value = request.substr(std::min(request.size(), rest + value_at));
  if (key.size() > limits_.max_key_bytes)
    return "ERR key of " + std::to_string(key.size()) + " bytes (at most " +
           std::to_string(limits_.max_key_bytes) + ")";
  auto it = data_.find(key);
  // Stores `v` at `key`, within the store's bounds; "" or the refusal.
  auto put = [&](const std::string& v) -> std::string {
    if (v.size() > limits_.max_value_bytes)
      return "ERR value of " + std::to_string(v.size()) + " bytes (at most " +
             std::to_string(limits_.max_value_bytes) + ")";
    const size_t before = it == data_.end() ? 0 : key.size() + it->second.size();
    if (data_bytes_ - before + key.size() + v.size() > limits_.max_store_bytes)
      return "ERR store full (" + std::to_string(limits_.max_store_bytes) + " bytes)";
    data_bytes_ = data_bytes_ - before + key.size() + v.size();
    data_[key] = v;
    return "";
  };
  if (op == "SET") {
    const std::string refused = put(value);
    return refused.empty() ? "OK" : refused;
  }
  if (op == "GET") return it == data_.end() ? "NONE" : "VAL " + it->second;
  if (op == "ADD") {
    int64_t sum = 0;
    try {
      sum = (it == data_.end() ? 0 : std::stoll(it->second)) + std::stoll(value);
    } catch (const std::exception&) {
      return "ERR not an integer";
    }
    const std::string text = std::to_string(sum), refused = put(text);
    return refused.empty() ? "VAL " + text : refused;
  }
  return "ERR unknown request";
}

void TcpStoreServer::acceptClients(std::vector<Client>& clients) {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
      // Out of descriptors: the pending connection would keep the listener readable and the loop spinning.
      // A spare descriptor given up for a moment accepts it, to close it at once.
      // (accept reports EMFILE before it looks at the queue, so an empty queue ends the round here.)
      ::close(spare_fd_);
      fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) ::close(fd);
      spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) return;
      continue;
    }
    if (fd < 0) return;  // EAGAIN: none left (or an error the next poll retries)
    if (clients.size() >= limits_.max_clients) {
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Client c;
    c.fd = fd;
    c.heard_from = Clock::now();
    clients.push_back(std::move(c));
  }
}

bool TcpStoreServer::sendReplies(Client& c, Clock::time_point now) {
  while (!c.replies.empty()) {
    const std::string& first = c.replies.front();
    const ssize_t n = ::send(c.fd, first.data() + c.first_sent, first.size() - c.first_sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // the rest when it reads
    if (n <= 0) return false;
    c.first_sent += size_t(n);
    c.unread_bytes -= size_t(n);
    c.waiting_since = now;
    if (c.first_sent == first.size()) {
      c.replies.pop_front();
      c.first_sent = 0;
    }
  }
  return true;
}

void TcpStoreServer::loop() {
  std::vector<Client> clients;
  for (;;) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    size_t total = 0, held = 0;  // reply bytes not read by any client; what all clients' buffers hold
    for (const auto& c : clients) total += c.unread(), held += c.held();
    unread_total_ = total;
    held_total_ = held;
    for (const auto& c : clients) {
      short events = c.unread() > 0 ? POLLOUT : 0;
      // Back-pressure: a client that does not read its replies gets no more of its requests handled, nor
      // does any client while all of them together hold the store's bound; what a client sends meanwhile
      // waits in the kernel, beyond a request's length here.
      if (c.unread() <= limits_.max_unread_reply_bytes && total <= limits_.max_total_unread_reply_bytes &&
          c.in.size() <= maxRequestBytes())
        events |= POLLIN;
      fds.push_back({c.fd, events, 0});
    }
    // Wake up for the stall and idle timeouts of connected clients.
    const int timeout_ms = clients.empty() ? -1 : 250;
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) break;
    const auto now = Clock::now();
    for (size_t i = 2; i < fds.size(); ++i) serveClient(clients[i - 2], fds[i].revents, now, total);
    clients.erase(std::remove_if(clients.begin(), clients.end(), [](const Client& c) { return c.fd < 0; }),
                  clients.end());
    if (fds[1].revents & POLLIN) acceptClients(clients);
  }
  for (auto& c : clients) ::close(c.fd);
}

void TcpStoreServer::serveClient(Client& c, short revents, Clock::time_point now, size_t& total) {
  if ((revents & (POLLERR | POLLNVAL)) || ((revents & POLLHUP) && !(revents & POLLIN))) {
    c.drop();  // gone both ways: its replies could not be delivered
    return;
  }
  if (revents & POLLIN) {
    char buf[65536];
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      c.drop();
      return;
    }
    if (n > 0) {
      c.in.append(buf, size_t(n));
      c.heard_from = now;
    }
  }
  const size_t max_line = maxRequestBytes();
  // Requests are answered while the client reads its replies; what it sends meanwhile waits in `in`.
  for (;;) {
    size_t begin = 0, nl;
    while (c.unread() <= limits_.max_unread_reply_bytes && total <= limits_.max_total_unread_reply_bytes &&
           (nl = c.in.find('\n', begin)) != std::string::npos) {
      const size_t before = c.unread();
      c.queue(handle(c.in.substr(begin, nl - begin)), now);
      total += c.unread() - before;
      begin = nl + 1;
    }
    c.in.erase(0, begin);
    // A line longer than any request can be is garbage (or an attack): not allowed to grow.
    if (c.in.find('\n') == std::string::npos && c.in.size() > max_line) {
      c.drop();
      return;
    }
    const size_t waiting = c.unread();
    if (!sendReplies(c, now)) {
      c.drop();
      return;
    }
    total -= waiting - c.unread();
    c.compact();
    // Again while it takes replies and asks more, unless the store's bound stopped it (handled none).
    if (begin == 0 || !c.replies.empty() || c.in.find('\n') == std::string::npos) break;
  }
  if (!c.replies.empty() && now - c.waiting_since > limits_.stall_timeout) c.drop();
  if (c.fd >= 0 && now - c.heard_from > limits_.idle_timeout) c.drop();
}

int connectTcp(const std::string& host, int port, std::chrono::milliseconds timeout,
               const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "not tried";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) {
      last_error = gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          freeaddrinfo(found);
          return fd;
        }
        last_error = std::strerror(errno);
        if (fd >= 0) ::close(fd);
      }
      freeaddrinfo(found);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  TILER_THROW(TimeoutError, what << " at " << host << ":" << port << " within " << timeout.count() / 1000.0
                                 << " s: " << last_error);
}

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : endpoint_(host + ":" + std::to_string(port)) {
  fd_ = connectTcp(host, port, timeout, "cannot reach the rendezvous store");
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<TcpStore> TcpStore::meet(const std::string& host, int port, StoreHosting hosting,
                                         StoreLimits limits, std::chrono::milliseconds timeout,
                                         const std::function<void()>& between) {
  const auto deadline = Clock::now() + timeout;
  std::unique_ptr<TcpStoreServer> server;
  for (;;) {
    if (between) between();
    const bool last = Clock::now() >= deadline;
    if (hosting != StoreHosting::kNever && !server) {
      try {
        server = std::make_unique<TcpStoreServer>(host, port, limits);
      } catch (const DistError&) {
        // kMay: another agent on this machine holds it (several agents on one machine, as in tests).
        if (hosting == StoreHosting::kMust) {
          if (last) throw;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          continue;
        }
      }
    }
    try {
      auto store = std::make_unique<TcpStore>(host, port, std::chrono::milliseconds(last ? 0 : 500));
      store->server_ = std::move(server);
      return store;
    } catch (const TimeoutError&) {
      TILER_CHECK(!last, TimeoutError,
                  "cannot reach the rendezvous store at " << host << ":" << port << " within "
                                                          << timeout.count() / 1000.0
                                                          << " s: no agent hosts it");
    }
  }
}

std::string TcpStore::request(const std::string& line, std::chrono::milliseconds timeout) {
  TILER_CHECK(fd_ >= 0, DistError, "the rendezvous store at " << endpoint_ << " is gone");
  if (!writeAllTo(fd_, line + "\n")) {
    ::close(fd_);
    fd_ = -1;
    TILER_THROW(DistError, "the rendezvous store at " << endpoint_ << " is gone (send failed)");
  }
  const auto deadline = Clock::now() + timeout;
  // The replies to earlier requests that timed out come first: read past them, so this one gets its own.
  ++unanswered_;
  for (; unanswered_ > 1; --unanswered_) readReply(deadline);
  std::string reply = readReply(deadline);
  --unanswered_;
  TILER_CHECK(reply.rfind("ERR", 0) != 0, DistError,
              "the rendezvous store at " << endpoint_ << " refused '" << line << "': " << reply);
  return reply;
}

std::string TcpStore::readReply(Clock::time_point deadline) {
  size_t nl;
  while ((nl = pending_.find('\n')) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    const int r = left > 0 ? poll(&p, 1, int(left)) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) TILER_THROW(TimeoutError, "the rendezvous store at " << endpoint_ << " did not answer");
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      ::close(fd_);
      fd_ = -1;
      TILER_THROW(DistError, "the rendezvous store at " << endpoint_ << " closed the connection");
    }
    pending_.append(buf, size_t(n));
  }
  std::string reply = pending_.substr(0, nl);
  pending_.erase(0, nl + 1);
  return reply;
}

void TcpStore::set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) {
  request("SET " + key + " " + value, timeout);
}

std::optional<std::string> TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string reply = request("GET " + key, timeout);
  if (reply == "NONE") return std::nullopt;
  return valueOf(reply, key);
}

int64_t TcpStore::add(const std::string& key, int64_t delta, std::chrono::milliseconds timeout) {
  return parseStoreInteger(valueOf(request("ADD " + key + " " + std::to_string(delta), timeout), key), key,
                           endpoint_);
}

std::string TcpStore::valueOf(const std::string& reply, const std::string& key) const {
  TILER_CHECK(reply.rfind("VAL ", 0) == 0, DistError,
              "malformed reply from the rendezvous store at " << endpoint_ << " for '" << key << "': '"
                                                              << reply.substr(0, 64) << "'");
  return reply.substr(4);
}

std::string TcpStore::localAddress() const {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (fd_ < 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &addr.sin_addr, text, sizeof text);
  return text;
}

std::pair<std::string, int> parseEndpoint(const std::string& endpoint, const std::string& flag) {
  const size_t colon = endpoint.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    try {
      size_t used = 0;
      port = std::stoi(endpoint.substr(colon + 1), &used);
      if (used != endpoint.size() - colon - 1) port = -1;
    } catch (const std::exception&) {
    }
  }
  TILER_CHECK(port > 0 && port < 65536, ConfigError,
              "" << flag << " must be HOST:PORT with a port in 1..65535; got '" << endpoint << "'");
  return {endpoint.substr(0, colon), port};
}

namespace {

struct InterfaceAddress {
  std::string text;
  bool reachable_from_outside;  // up and not loopback
};

std::vector<InterfaceAddress> ipv4InterfaceAddresses() {
  std::vector<InterfaceAddress> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    found.push_back({text, (a->ifa_flags & IFF_UP) && !(a->ifa_flags & IFF_LOOPBACK)});
  }
  freeifaddrs(list);
  return found;
}

std::string thisHostsName() {
  char name[256] = {0};
  return gethostname(name, sizeof name - 1) == 0 ? name : "";
}

}  // namespace

bool isLocalHost(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "0.0.0.0") return true;
  if (host == thisHostsName()) return true;
  for (const auto& a : ipv4InterfaceAddresses())
    if (host == a.text) return true;
  return false;
}

std::string addressOthersReach() {
  const std::string name = thisHostsName();
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (!name.empty() && getaddrinfo(name.c_str(), nullptr, &hints, &found) == 0) {
    freeaddrinfo(found);
    return name;
  }
  for (const auto& a : ipv4InterfaceAddresses())
    if (a.reachable_from_outside) return a.text;
  return "127.0.0.1";
}

int findFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TILER_CHECK(fd >= 0, ConfigError, "socket: " << std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
           getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  TILER_CHECK(ok, ConfigError, "cannot find a free port: " << std::strerror(errno));
  return ntohs(addr.sin_port);
}

bool portIsFree(int port) {
  // The c10d store sets SO_REUSEADDR as the rendezvous store does, so a port in TIME_WAIT is usable; only a
  // listener blocks it.
  try {
    TcpStoreServer probe("", port);
    return true;
  } catch (const DistError&) {
    return false;
  }
}

}  // namespace tiler
