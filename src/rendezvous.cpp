#include "tiler/rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "tiler/error.hpp"

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

}  // namespace

StoreServer::StoreServer(int port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TILER_CHECK(listen_fd_ >= 0, DistError, "ctrun: rendezvous store: socket: " << std::strerror(errno));
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(uint16_t(port));
  socklen_t len = sizeof addr;
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listen_fd_, 64) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    TILER_THROW(DistError,
                "ctrun: cannot host the rendezvous store on port " << port << ": " << std::strerror(err));
  }
  port_ = ntohs(addr.sin_port);
  TILER_CHECK(pipe2(wake_, O_CLOEXEC) == 0, DistError, "ctrun: pipe: " << std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

StoreServer::~StoreServer() {
  const char b = 0;
  (void)!write(wake_[1], &b, 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

std::string StoreServer::handle(const std::string& request) {
  size_t rest = 0;
  const std::string op = firstWord(request, rest);
  size_t value_at = 0;
  const std::string key = firstWord(request.substr(rest), value_at);
  const std::string value = request.substr(std::min(request.size(), rest + value_at));
  if (op == "SET") {
    data_[key] = value;
    return "OK";
  }
  if (op == "GET") {
    auto it = data_.find(key);
    return it == data_.end() ? "NONE" : "VAL " + it->second;
  }
  if (op == "ADD") {
    int64_t sum = 0;
    try {
      auto it = data_.find(key);
      sum = (it == data_.end() ? 0 : std::stoll(it->second)) + std::stoll(value);
    } catch (const std::exception&) {
      return "ERR not an integer";
    }
    data_[key] = std::to_string(sum);
    return "VAL " + data_[key];
  }
  return "ERR unknown request";
}

void StoreServer::loop() {
  struct Client {
    int fd;
    std::string in;
  };
  std::vector<Client> clients;
  for (;;) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& c : clients) fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) break;
    if (fds[1].revents & POLLIN) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) clients.push_back({fd, ""});
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Client& c = clients[i - 2];
      char buf[4096];
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      bool ok = n > 0;
      if (ok) c.in.append(buf, size_t(n));
      size_t nl;
      while (ok && (nl = c.in.find('\n')) != std::string::npos) {
        ok = writeAllTo(c.fd, handle(c.in.substr(0, nl)) + "\n");
        c.in.erase(0, nl + 1);
      }
      // Garbage without a newline is not allowed to grow without bound.
      if (!ok || c.in.size() > (1 << 20)) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    clients.erase(std::remove_if(clients.begin(), clients.end(), [](const Client& c) { return c.fd < 0; }),
                  clients.end());
  }
  for (auto& c : clients) ::close(c.fd);
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

StoreClient::StoreClient(const std::string& host, int port, std::chrono::milliseconds timeout)
    : endpoint_(host + ":" + std::to_string(port)), timeout_(timeout) {
  fd_ = connectTcp(host, port, timeout, "ctrun: cannot reach the rendezvous store");
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string StoreClient::request(const std::string& line) {
  TILER_CHECK(fd_ >= 0, DistError, "ctrun: the rendezvous store at " << endpoint_ << " is gone");
  if (!writeAllTo(fd_, line + "\n")) {
    ::close(fd_);
    fd_ = -1;
    TILER_THROW(DistError, "ctrun: the rendezvous store at " << endpoint_ << " is gone (send failed)");
  }
  const auto deadline = Clock::now() + timeout_;
  size_t nl;
  while ((nl = pending_.find('\n')) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    const int r = left > 0 ? poll(&p, 1, int(left)) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r == 0)
      TILER_THROW(TimeoutError, "ctrun: the rendezvous store at " << endpoint_ << " did not answer");
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      ::close(fd_);
      fd_ = -1;
      TILER_THROW(DistError, "ctrun: the rendezvous store at " << endpoint_ << " closed the connection");
    }
    pending_.append(buf, size_t(n));
  }
  std::string reply = pending_.substr(0, nl);
  pending_.erase(0, nl + 1);
  TILER_CHECK(reply.rfind("ERR", 0) != 0, DistError,
              "ctrun: the rendezvous store at " << endpoint_ << " refused '" << line << "': " << reply);
  return reply;
}

void StoreClient::set(const std::string& key, const std::string& value) {
  request("SET " + key + " " + value);
}

std::optional<std::string> StoreClient::get(const std::string& key) {
  const std::string reply = request("GET " + key);
  if (reply == "NONE") return std::nullopt;
  return reply.substr(4);
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  return std::stoll(request("ADD " + key + " " + std::to_string(delta)).substr(4));
}

std::string StoreClient::wait(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto v = get(key)) return *v;
    TILER_CHECK(Clock::now() < deadline, TimeoutError,
                "ctrun: waited " << timeout.count() / 1000.0 << " s for '" << key
                                 << "' at the rendezvous store " << endpoint_);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string StoreClient::localAddress() const {
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
              "ctrun: " << flag << " must be HOST:PORT with a port in 1..65535; got '" << endpoint << "'");
  return {endpoint.substr(0, colon), port};
}

std::pair<int, int> parseNodeRange(const std::string& spec) {
  const size_t colon = spec.find(':');
  try {
    size_t used_min = 0, used_max = 0;
    const int lo = std::stoi(spec.substr(0, colon), &used_min);
    const int hi = colon == std::string::npos ? lo : std::stoi(spec.substr(colon + 1), &used_max);
    const bool whole = used_min == (colon == std::string::npos ? spec.size() : colon) &&
                       (colon == std::string::npos || used_max == spec.size() - colon - 1);
    if (whole && lo >= 1 && hi >= lo) return {lo, hi};
  } catch (const std::exception&) {
  }
  TILER_THROW(ConfigError, "ctrun: --nnodes must be N or MIN:MAX with 1 <= MIN <= MAX; got '" << spec << "'");
}

bool isLocalHost(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "0.0.0.0") return true;
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool local = false;
  for (ifaddrs* a = list; a != nullptr && !local; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    local = host == text;
  }
  freeifaddrs(list);
  return local;
}

}  // namespace tiler
