#include "tools/slip-perf/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace slipperf {
namespace {

volatile sig_atomic_t g_stop = 0;

// How often an accept that may give up asks whether it should.
constexpr int kAcceptPollMs = 20;

[[noreturn]] void ThrowErrno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// Whether a call that failed with errno should be retried.
bool Retry() {
  if (errno != EINTR) return false;
  CheckStop();
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

// Sets O_NONBLOCK. False, with errno, when fcntl failed.
bool SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// Waits until `fd` is readable or `timeout_ms` passed (-1: no limit).
void WaitReadable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) < 0 && !Retry()) ThrowErrno("poll");
}

}  // namespace

void RequestStop() {
  g_stop = 1;
}

void CheckStop() {
  if (g_stop) throw Interrupted();
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

size_t SocketLink::SendSome(const void* data, size_t len) {
  for (;;) {
    CheckStop();
    const ssize_t n = send(fd_.get(), data, len, MSG_NOSIGNAL);
    if (n > 0) return static_cast<size_t>(n);
    if (n < 0 && !Retry()) ThrowErrno("send");
  }
}

size_t SocketLink::RecvSome(void* data, size_t len) {
  for (;;) {
    CheckStop();
    const ssize_t n = recv(fd_.get(), data, len, 0);
    if (n >= 0) return static_cast<size_t>(n);
    if (!Retry()) ThrowErrno("recv");
  }
}

void SocketLink::ShutdownWrite() {
  if (shutdown(fd_.get(), SHUT_WR) != 0) ThrowErrno("shutdown");
}

void SocketLink::SetNoDelay() {
  const int one = 1;
  if (setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    ThrowErrno("setsockopt(TCP_NODELAY)");
  }
}

void SocketLink::Abort() noexcept {
  shutdown(fd_.get(), SHUT_RDWR);
}

Fd Listen(const std::string& bind_addr, uint16_t port, bool reuseport) {
  AddrInfoList list;
  Resolve(bind_addr, port, /*passive=*/true, &list);
  int last_errno = EADDRNOTAVAIL;
  for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
    // A plain type, then O_NONBLOCK with fcntl: rsocket's preload (librspreload.so) leaves
    // a socket created with SOCK_NONBLOCK on kernel TCP, so its connections would never
    // move to RDMA.
    Fd fd(socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
    if (fd.get() < 0) {
      last_errno = errno;
      continue;
    }
    if (!SetNonBlocking(fd.get())) {
      last_errno = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuseport) setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    // A full backlog would make connections wait (and the shim give up accelerating
    // them), so tcp_crr with many connecting threads gets the largest one.
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd.get(), SOMAXCONN) == 0) {
      return fd;
    }
    last_errno = errno;
  }
  errno = last_errno;
  ThrowErrno("cannot listen on " + (bind_addr.empty() ? std::string("*") : bind_addr) + ":" +
             std::to_string(port));
}

std::unique_ptr<Link> SocketAcceptor::Accept(const std::function<bool()>& give_up) {
  for (;;) {
    CheckStop();
    // Accepted sockets do not inherit the listener's O_NONBLOCK (nor do rsocket's): data
    // links block.
    const int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd >= 0) return std::make_unique<SocketLink>(Fd(fd));
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (give_up && give_up()) return nullptr;
      WaitReadable(listen_fd_, give_up ? kAcceptPollMs : -1);
    } else if (!Retry() && errno != ECONNABORTED) {
      ThrowErrno("accept");
    }
  }
}

SocketConnector::SocketConnector(const std::string& host, uint16_t port)
    : name_(host + ":" + std::to_string(port)) {
  AddrInfoList list;
  Resolve(host, port, /*passive=*/false, &list);
  for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    addresses_.push_back(ss);
  }
}

std::unique_ptr<Link> SocketConnector::Open() {
  int last_errno = EHOSTUNREACH;
  for (size_t i = 0; i < addresses_.size(); ++i) {
    const sockaddr_storage& ss = addresses_[i];
    const socklen_t len = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    Fd fd(socket(ss.ss_family, SOCK_STREAM, 0));
    if (fd.get() < 0) {
      last_errno = errno;
      continue;
    }
    // This tool installs no signal handler on the connecting side, so EINTR here is simply
    // a failure (a blocking connect interrupted by a signal completes in the background).
    if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&ss), len) == 0) {
      // Once an address answered, the others are not tried again. The first Open (the
      // control connection) runs before any thread that opens links at the same time.
      if (i != 0) addresses_ = {ss};
      return std::make_unique<SocketLink>(std::move(fd));
    }
    last_errno = errno;
  }
  errno = last_errno;
  ThrowErrno("cannot connect to " + name_);
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
