#include "core/anchor_path.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>

#include "core/log.h"
#include "core/proxy.h"
#include "core/sys.h"

namespace slip {

namespace {

// Waits for `events` on `fd` until `deadline` (monotonic ms); false once it passed.
bool WaitUntil(int fd, short events, uint64_t deadline) noexcept {
  uint64_t now = sys::MonotonicMs();
  if (now >= deadline) return false;
  pollfd pfd{fd, events, 0};
  sys::poll(&pfd, 1, int(deadline - now));
  return true;
}

}  // namespace

AnchorPeek PeekAnchor(int fd) noexcept {
  AnchorPeek peek;
  uint8_t buf[wire::kMaxMessageSize];
  const ssize_t n = sys::recv(fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return peek;
  if (n <= 0) {
    peek.kind = AnchorPeek::Kind::kEnd;
    peek.error = n < 0 ? errno : 0;
    return peek;
  }
  peek.status = wire::ParseMessage(buf, size_t(n), &peek.msg, &peek.length);
  peek.kind = peek.status == wire::ParseStatus::kOk         ? AnchorPeek::Kind::kMessage
              : peek.status == wire::ParseStatus::kNeedMore ? AnchorPeek::Kind::kPartial
                                                            : AnchorPeek::Kind::kBytes;
  return peek;
}

void ConsumeAnchor(int fd, const AnchorPeek& peek) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  if (peek.kind == AnchorPeek::Kind::kMessage) sys::recv(fd, buf, peek.length, MSG_DONTWAIT);
}

bool SendFailover(int fd, const wire::Failover& failover, int timeout_ms) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kFailover;
  msg.failover = failover;
  return SendOnAnchor(fd, msg, timeout_ms);
}

bool SendConfirm(int fd, uint64_t nonce, uint32_t ring_size, int timeout_ms) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kConfirm;
  msg.confirm = wire::Confirm{nonce, ring_size};
  return SendOnAnchor(fd, msg, timeout_ms);
}

bool SendOnAnchor(int fd, const wire::Message& msg, int timeout_ms) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  const size_t len = wire::EncodeMessage(msg, buf, sizeof(buf));
  if (len == 0) return false;
  const uint64_t deadline = sys::MonotonicMs() + uint64_t(timeout_ms);
  size_t done = 0;
  while (done < len) {
    ssize_t n = sys::send(fd, buf + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return false;
    // A message half written is a stream the peer cannot parse: finish it if at all possible.
    if (!WaitUntil(fd, POLLOUT, done ? deadline + 1000 : deadline)) return false;
  }
  return true;
}

bool ReceiveFailover(int fd, int timeout_ms, wire::Failover* out) noexcept {
  const uint64_t deadline = sys::MonotonicMs() + uint64_t(timeout_ms);
  for (;;) {
    const AnchorPeek peek = PeekAnchor(fd);
    if (peek.Is(wire::Type::kFailover)) {
      ConsumeAnchor(fd, peek);
      *out = peek.msg.failover;
      return true;
    }
    if (peek.Is(wire::Type::kUrgent) || peek.Is(wire::Type::kWindow)) {
      // (A mark, an answer or a window sent before the peer's FAILOVER: the stream is
      // leaving the transport, and TCP carries what follows, with TCP's own buffers.)
      ConsumeAnchor(fd, peek);
      continue;
    }
    if (peek.kind != AnchorPeek::Kind::kPartial && peek.kind != AnchorPeek::Kind::kNone)
      return false;
    if (!WaitUntil(fd, POLLIN, deadline)) return false;
    // A partial message keeps POLLIN set: do not spin on it.
    if (peek.kind == AnchorPeek::Kind::kPartial) sys::poll(nullptr, 0, 1);
  }
}

void AnchorPath::Start(int fd, uint8_t* rx_ring, const uint8_t* tx_ring, uint32_t ring_size,
                       uint64_t rx_from, uint64_t tx_from) noexcept {
  fd_ = fd;
  rx_ring_ = rx_ring;
  tx_ring_ = tx_ring;
  mask_ = ring_size - 1;
  rx_.store(rx_from, std::memory_order_relaxed);
  tx_.store(tx_from, std::memory_order_relaxed);
  started_.store(true, std::memory_order_release);
}

AnchorPath::Moved AnchorPath::OnReady(uint32_t events, uint64_t consumed, uint64_t published,
                                      bool may_pull) noexcept {
  Moved moved;
  if (may_pull && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
    const uint64_t before = received();
    moved.received = Pull(consumed) != before;
  }
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) {
    const uint64_t before = sent();
    moved.sent = Push(published) != before;
  }
  return moved;
}

void AnchorPath::ShowEnd(int proxy_b) const noexcept {
  if (proxy_b < 0) return;
  if ((eof() || error()) && !rx_end_shown_.exchange(true)) sys::shutdown(proxy_b, SHUT_WR);
  if ((peer_closed() || error()) && !tx_end_shown_.exchange(true)) proxy::Unfill(proxy_b);
}

uint64_t AnchorPath::Pull(uint64_t consumed) noexcept {
  std::lock_guard<std::mutex> lock(rx_mu_);
  uint64_t rx = rx_.load(std::memory_order_relaxed);
  if (eof_.load(std::memory_order_relaxed) || error_.load(std::memory_order_relaxed)) return rx;
  const uint64_t size = uint64_t(mask_) + 1;
  for (;;) {
    // `consumed` may be stale (read by another caller before this one took the lock, and
    // overtaken since): it then only means less space, never a negative one.
    if (consumed + size <= rx) break;
    uint64_t space = consumed + size - rx;
    uint64_t offset = rx & mask_;
    size_t want = size_t(space < size - offset ? space : size - offset);
    ssize_t n = sys::recv(fd_, rx_ring_ + offset, want, MSG_DONTWAIT);
    if (n > 0) {
      rx += uint64_t(n);
      rx_.store(rx, std::memory_order_release);
      if (size_t(n) < want) break;  // drained (the next call sees EAGAIN anyway)
      continue;
    }
    if (n == 0) {
      eof_.store(true, std::memory_order_release);
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) error_.store(errno, std::memory_order_release);
    break;
  }
  return rx;
}

uint64_t AnchorPath::PushLocked(uint64_t published) noexcept {
  uint64_t tx = tx_.load(std::memory_order_relaxed);
  const uint64_t size = uint64_t(mask_) + 1;
  while (tx < published && !peer_closed_.load(std::memory_order_relaxed) &&
         error_.load(std::memory_order_relaxed) == 0) {
    uint64_t offset = tx & mask_;
    // The bytes before an urgent one first; it then goes alone, so that it is the one TCP
    // marks however much of a longer send the kernel would take.
    const bool urgent_due = urgent_end_ > tx && urgent_end_ <= published;
    const uint64_t stop = urgent_due && urgent_end_ - 1 > tx ? urgent_end_ - 1 : published;
    const bool urgent_now = urgent_due && urgent_end_ - 1 == tx;
    uint64_t left = urgent_now ? 1 : stop - tx;
    size_t len = size_t(left < size - offset ? left : size - offset);
    ssize_t n = sys::send(fd_, tx_ring_ + offset, len,
                          MSG_DONTWAIT | MSG_NOSIGNAL | (urgent_now ? MSG_OOB : 0));
    if (n > 0) {
      tx += uint64_t(n);
      tx_.store(tx, std::memory_order_release);
      if (urgent_now) urgent_end_ = 0;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // The peer's reader is gone (EPIPE): our sends fail, its bytes to us may still come.
    if (n < 0 && errno == EPIPE)
      peer_closed_.store(true, std::memory_order_release);
    else
      error_.store(n < 0 ? errno : EIO, std::memory_order_release);
    break;
  }
  if (finish_ && !shut_ && tx == final_) {
    sys::shutdown(fd_, SHUT_WR);
    shut_ = true;
  }
  return tx;
}

uint64_t AnchorPath::Push(uint64_t published) noexcept {
  std::lock_guard<std::mutex> lock(tx_mu_);
  return PushLocked(published);
}

void AnchorPath::MarkUrgent(uint64_t offset) noexcept {
  std::lock_guard<std::mutex> lock(tx_mu_);
  urgent_end_ = offset + 1;
}

void AnchorPath::Finish(uint64_t published) noexcept {
  std::lock_guard<std::mutex> lock(tx_mu_);
  finish_ = true;
  final_ = published;
  PushLocked(published);
}

bool AnchorPath::PushAll(uint64_t published, int timeout_ms) noexcept {
  const uint64_t deadline = sys::MonotonicMs() + uint64_t(timeout_ms);
  for (;;) {
    if (Push(published) == published) return true;
    if (peer_closed() || error() != 0) return false;
    if (!WaitUntil(fd_, POLLOUT, deadline)) return false;
  }
}

}  // namespace slip
