// A byte stream between the two ends of a test: a TCP socket driven through the ordinary
// socket API (net.h), or a transport driven natively (shm_native.h). Every test is written
// once against this interface, so "socket over a transport" and "the transport itself" run
// exactly the same code above the link.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace slipperf {

class Link {
 public:
  Link() = default;
  virtual ~Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Sends at least one byte; returns how many. Throws on error.
  virtual size_t SendSome(const void* data, size_t len) = 0;
  // Returns the number of bytes read, 0 at end of stream. Throws on error.
  virtual size_t RecvSome(void* data, size_t len) = 0;
  virtual void ShutdownWrite() = 0;
  // Request/response tests want each message on its way at once (TCP_NODELAY on sockets).
  virtual void SetNoDelay() {}
  // From another thread: makes calls blocked on this link return (with an error or end of
  // stream), so that a test whose peer or sibling thread failed can end.
  virtual void Abort() noexcept = 0;
};

void SendAll(Link& link, const void* data, size_t len);
// Reads exactly `len` bytes. Returns false on end of stream before the first byte, and
// throws on end of stream in the middle.
bool RecvAll(Link& link, void* data, size_t len);
// Reads until end of stream; throws if data arrives.
void ExpectEof(Link& link);

// One fixed-size protocol message each way (protocol.h).
template <size_t N>
void SendMessage(Link& link, const std::array<uint8_t, N>& bytes) {
  SendAll(link, bytes.data(), N);
}
// Throws when the peer closed before the message, naming `what` it should have sent.
template <size_t N>
std::array<uint8_t, N> RecvMessage(Link& link, const char* what) {
  std::array<uint8_t, N> bytes;
  if (!RecvAll(link, bytes.data(), N)) {
    throw std::runtime_error(std::string("peer closed the connection instead of sending ") + what);
  }
  return bytes;
}

}  // namespace slipperf
