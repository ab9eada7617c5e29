// Sockets through the plain libc API (socket, bind, listen, accept, connect, send, recv,
// shutdown, poll, fcntl), exactly as an unmodified program uses it, so that slip-perf measures
// the same under LD_PRELOAD as without it. Errors throw std::system_error.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/slip-perf/endpoints.h"
#include "tools/slip-perf/link.h"

namespace slipperf {

// Thrown by the calls below once a stop was requested.
struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// Async-signal-safe. After it, the next blocking call here throws Interrupted, and so does
// one that was blocked and returned EINTR (install the handler without SA_RESTART).
// Without it, EINTR is retried.
void RequestStop();
// Throws Interrupted once a stop was requested. Blocking calls check it before they block
// and when they return EINTR.
void CheckStop();

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();

  int get() const { return fd_; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// A connected socket as a Link.
class SocketLink final : public Link {
 public:
  explicit SocketLink(Fd fd) : fd_(std::move(fd)) {}
  int fd() const { return fd_.get(); }

  size_t SendSome(const void* data, size_t len) override;
  size_t RecvSome(void* data, size_t len) override;
  void ShutdownWrite() override;
  void SetNoDelay() override;
  void Abort() noexcept override;

 private:
  Fd fd_;
};

// Listens on `bind_addr` (numeric or a name; "" for any address) and `port` (0: one the
// kernel picks). The listener is non-blocking: accepts wait in poll, so they can give up.
Fd Listen(const std::string& bind_addr, uint16_t port, bool reuseport = false);

// Accepts data links (and control connections) from a listener.
class SocketAcceptor final : public Acceptor {
 public:
  explicit SocketAcceptor(int listen_fd) : listen_fd_(listen_fd) {}
  // An empty `give_up` waits for as long as it takes.
  std::unique_ptr<Link> Accept(const std::function<bool()>& give_up) override;

 private:
  int listen_fd_;
};

// Connects to `host`: the first of its addresses that accepts; later links go to the same
// address without resolving it again.
class SocketConnector final : public Connector {
 public:
  SocketConnector(const std::string& host, uint16_t port);
  std::unique_ptr<Link> Open() override;

 private:
  std::vector<sockaddr_storage> addresses_;
  std::string name_;  // "host:port", for messages
};

// "127.0.0.1:5301" or "[::1]:5301".
std::string LocalName(int fd);
std::string PeerName(int fd);

}  // namespace slipperf
