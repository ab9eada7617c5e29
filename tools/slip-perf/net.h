// Blocking socket helpers over the plain libc API (socket, bind, listen, accept, connect,
// send, recv, shutdown), exactly as an unmodified program uses it, so that slip-perf
// measures the same under LD_PRELOAD as without it. Errors throw std::system_error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace slipperf {

// Thrown by the helpers below once a stop was requested.
struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// Async-signal-safe. After it, the next helper call throws Interrupted, and so does one
// that was blocked and returned EINTR (install the handler without SA_RESTART). Without
// it, EINTR is retried.
void RequestStop();
bool StopRequested();

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

// Listens on `bind_addr` (numeric or a name; "" for any address) and `port`.
Fd Listen(const std::string& bind_addr, uint16_t port);
Fd Accept(int listen_fd);
// Connects to the first address of `host` that accepts.
Fd Connect(const std::string& host, uint16_t port);

void SetNoDelay(int fd);
void ShutdownWrite(int fd);

void SendAll(int fd, const void* data, size_t len);
// Returns the number of bytes read, 0 at end of stream.
size_t RecvSome(int fd, void* data, size_t len);
// Reads exactly `len` bytes. Returns false on end of stream before the first byte, and
// throws on end of stream in the middle.
bool RecvAll(int fd, void* data, size_t len);
// Reads until end of stream, discarding; throws if data arrives.
void ExpectEof(int fd);

// "127.0.0.1:5301" or "[::1]:5301".
std::string LocalName(int fd);
std::string PeerName(int fd);

}  // namespace slipperf
