#include "tools/slip-perf/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace slipperf {
namespace {

volatile sig_atomic_t g_stop = 0;

[[noreturn]] void ThrowErrno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// Called before each blocking call: a stop requested while the process was not blocked
// (so no call returned EINTR) takes effect at the next call.
void CheckStop() {
  if (g_stop) throw Interrupted();
}

// Whether a call that failed with errno should be retried.
bool Retry() {
  if (errno != EINTR) return false;
  if (g_stop) throw Interrupted();
  return true;
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

void Resolve(const std::string& host, uint16_t port, bool passive, AddrInfoList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : AI_ADDRCONFIG;
  const std::string service = std::to_string(port);
  const int rc =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->head);
  if (rc != 0) {
    throw std::runtime_error("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
}

std::string AddrToString(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto& sin = reinterpret_cast<const sockaddr_in&>(ss);
    inet_ntop(AF_INET, &sin.sin_addr, host, sizeof(host));
    port = ntohs(sin.sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto& sin6 = reinterpret_cast<const sockaddr_in6&>(ss);
    inet_ntop(AF_INET6, &sin6.sin6_addr, host, sizeof(host));
    port = ntohs(sin6.sin6_port);
  }
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

}  // namespace

void RequestStop() {
  g_stop = 1;
}
bool StopRequested() {
  return g_stop != 0;
}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) close(fd_);
}

Fd Listen(const std::string& bind_addr, uint16_t port) {
  AddrInfoList list;
  Resolve(bind_addr, port, /*passive=*/true, &list);
  int last_errno = EADDRNOTAVAIL;
  for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
    if (fd.get() < 0) {
      last_errno = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd.get(), 16) == 0) return fd;
    last_errno = errno;
  }
  errno = last_errno;
  ThrowErrno("cannot listen on " + (bind_addr.empty() ? std::string("*") : bind_addr) + ":" +
             std::to_string(port));
}

Fd Accept(int listen_fd) {
  for (;;) {
    CheckStop();
    const int fd = accept(listen_fd, nullptr, nullptr);
    if (fd >= 0) return Fd(fd);
    if (!Retry() && errno != ECONNABORTED) ThrowErrno("accept");
  }
}

Fd Connect(const std::string& host, uint16_t port) {
  AddrInfoList list;
  Resolve(host, port, /*passive=*/false, &list);
  int last_errno = EHOSTUNREACH;
  for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
    if (fd.get() < 0) {
      last_errno = errno;
      continue;
    }
    // A blocking connect interrupted by a signal completes in the background; this tool
    // installs no handler on the client side, so EINTR here is simply a failure.
    if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) return fd;
    last_errno = errno;
  }
  errno = last_errno;
  ThrowErrno("cannot connect to " + host + ":" + std::to_string(port));
}

void SetNoDelay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    ThrowErrno("setsockopt(TCP_NODELAY)");
  }
}

void ShutdownWrite(int fd) {
  if (shutdown(fd, SHUT_WR) != 0) ThrowErrno("shutdown");
}

void SendAll(int fd, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    CheckStop();
    const ssize_t n = send(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && !Retry()) {
      ThrowErrno("send");
    }
  }
}

size_t RecvSome(int fd, void* data, size_t len) {
  for (;;) {
    CheckStop();
    const ssize_t n = recv(fd, data, len, 0);
    if (n >= 0) return static_cast<size_t>(n);
    if (!Retry()) ThrowErrno("recv");
  }
}

bool RecvAll(int fd, void* data, size_t len) {
  auto* p = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < len) {
    const size_t n = RecvSome(fd, p + got, len - got);
    if (n == 0) {
      if (got == 0) return false;
      throw std::runtime_error("peer closed the connection in the middle of a message");
    }
    got += n;
  }
  return true;
}

void ExpectEof(int fd) {
  uint8_t byte;
  if (RecvSome(fd, &byte, 1) != 0) throw std::runtime_error("unexpected data before close");
}

std::string LocalName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return AddrToString(ss);
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return AddrToString(ss);
}

}  // namespace slipperf
