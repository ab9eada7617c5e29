// Stream: urgent data (MSG_OOB), as TCP keeps it (docs/DESIGN.md, "Urgent data").
//
// TCP has one urgent mark per direction, the latest: the last byte of a send(MSG_OOB). A
// receive stops at the mark; at it, the urgent byte is skipped unless SO_OOBINLINE keeps it
// in line; recv(MSG_OOB) returns it once; SIOCATMARK says whether the next byte is it;
// poll says POLLPRI and the socket's owner gets SIGURG when a mark arrives. The mark
// travels apart from the bytes here (an URGENT message on the anchor), so the sender
// publishes its urgent byte only once the peer answered that it knows the mark: no reader
// can take it for an ordinary byte first. The proxy carries the readiness and the signal:
// the receiver writes an urgent byte of its own on B, and the kernel gives A's pollers
// POLLPRI and A's owner SIGURG, with their kernel semantics.
#include <sys/socket.h>

#include <cerrno>

#include "core/failover.h"
#include "core/log.h"
#include "core/stream.h"
#include "core/sys.h"

namespace slip {

namespace {

// How long a send(MSG_OOB) waits for the peer to answer its mark: a round trip on the
// anchor, bounded so that a peer that never answers delays the byte, never loses it.
constexpr int kUrgentAnswerMs = 2000;

uint8_t LastByte(const iovec* iov, int iovcnt) noexcept {
  for (int i = iovcnt - 1; i >= 0; --i) {
    if (iov[i].iov_len > 0) return static_cast<const uint8_t*>(iov[i].iov_base)[iov[i].iov_len - 1];
  }
  return 0;
}

}  // namespace

ssize_t Stream::SendUrgent(const iovec* iov, int iovcnt, size_t total, int flags,
                           bool nonblocking) noexcept {
  AnchorFailover* failover = control()->failover();
  if (!failover) return -EOPNOTSUPP;
  size_t sent = 0;
  if (total > 1) {
    // The bytes before the urgent one, as any send; a short one (non-blocking) marks
    // nothing yet: the caller sends the rest, its last byte urgent, again.
    const ssize_t rc = SendUpTo(iov, iovcnt, total - 1, flags, nonblocking);
    if (rc < ssize_t(total - 1)) return rc;
    sent = total - 1;
    flags |= MSG_NOSIGNAL;  // (a failure now is reported as the short count)
  }
  uint8_t byte = LastByte(iov, iovcnt);
  iovec one{&byte, 1};
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(tx_mu_);
      SideLock side(sides_.load(std::memory_order_acquire), SharedSides::Side::kTx);
      if (!side.ok()) return sent ? ssize_t(sent) : -EIO;
      if (handed_back_.load(std::memory_order_relaxed)) return sent ? ssize_t(sent) : kHandedBack;
      if (int err = SendError(flags)) {
        if (err == kDiscard) return ssize_t(total);
        return sent ? ssize_t(sent) : err;
      }
      if (TxUsed(/*strict=*/true) < TxLimit()) {
        // The byte's offset cannot move while we hold the side's lock: announced, then
        // published at exactly that place.
        if (failover->AnnounceUrgent(LoadProduced(std::memory_order_relaxed), byte,
                                     kUrgentAnswerMs) == AnchorFailover::UrgentRoute::kNone)
          return sent ? ssize_t(sent) : -EOPNOTSUPP;
        size_t done = 0;
        const ssize_t rc = SendOnce(&one, 1, 1, flags, nonblocking, &done);
        if (rc == 1) return ssize_t(sent + 1);
        return sent ? ssize_t(sent) : rc;
      }
      if (nonblocking) {
        if (sent > 0) return ssize_t(sent);
        if (ArmWritable()) continue;
        return -EAGAIN;
      }
    }
    // (No spin first, as Send's: urgent data is rare, and its wait is the peer's anyway.)
    if (int rc = WaitWritable(); rc < 0) return sent ? ssize_t(sent) : rc;
  }
}

bool Stream::OnPeerUrgent(uint64_t offset, uint8_t byte) noexcept {
  // The peer announces the byte it is about to publish: never one this end already read,
  // nor one beyond what its ring lets it have ahead of our reader.
  const uint64_t consumed = LoadConsumed(std::memory_order_acquire);
  if (offset < consumed || offset - consumed > channel_->ring_size()) {
    SLIP_LOG(kWarn, "the peer marked byte %llu urgent, this end is at %llu: ignored",
             (unsigned long long)offset, (unsigned long long)consumed);
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(urgent_mu_);
    // As TCP: a mark not after the one held changes nothing.
    if (urgent_active_.load(std::memory_order_relaxed) && offset <= urgent_offset_) return true;
    urgent_offset_ = offset;
    urgent_byte_ = byte;
    urgent_read_ = false;
    urgent_active_.store(true, std::memory_order_release);
  }
  // POLLPRI for A's pollers and SIGURG for A's owner (F_SETOWN), from the kernel. (A mark
  // still held there is replaced, its byte left as an uncounted one: drained as such.)
  const char mark = '!';
  sys::send(proxy_b_, &mark, 1, MSG_OOB | MSG_DONTWAIT | MSG_NOSIGNAL);
  return true;
}

ssize_t Stream::RecvUrgent(const iovec* iov, int iovcnt, int flags) noexcept {
  if (handed_back_.load(std::memory_order_acquire)) return kHandedBack;
  if (urgent_inline_.load(std::memory_order_relaxed)) return -EINVAL;
  uint8_t byte = 0;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(urgent_mu_);
    if (urgent_active_.load(std::memory_order_relaxed) && !urgent_read_) {
      byte = urgent_byte_;
      found = true;
      if (!(flags & MSG_PEEK)) urgent_read_ = true;
    }
  }
  if (found && !(flags & MSG_PEEK)) TakeProxyUrgent();
  if (!found) {
    // On TCP the anchor itself may hold urgent data (a peer that sent it there).
    AnchorFailover* failover = control()->failover();
    if (!failover || !failover->on_tcp()) return -EINVAL;
    const ssize_t n = failover->RecvUrgentOnAnchor(&byte, flags);
    if (n <= 0) return n;
  }
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len == 0) continue;
    if (iov[i].iov_base) *static_cast<uint8_t*>(iov[i].iov_base) = byte;
    return 1;
  }
  return 0;  // (TCP too: no room, the byte taken, MSG_TRUNC)
}

int Stream::AtMark() noexcept {
  std::lock_guard<std::mutex> lock(urgent_mu_);
  return urgent_active_.load(std::memory_order_relaxed) &&
                 urgent_offset_ == LoadConsumed(std::memory_order_acquire)
             ? 1
             : 0;
}

Stream::UrgentCut Stream::CutAtMark(uint64_t from, uint64_t avail, bool copied) noexcept {
  UrgentCut cut;
  cut.take = avail;
  std::lock_guard<std::mutex> lock(urgent_mu_);
  if (!urgent_active_.load(std::memory_order_relaxed) || urgent_offset_ < from) return cut;
  if (urgent_offset_ > from) {
    cut.take = std::min<uint64_t>(avail, urgent_offset_ - from);
    return cut;
  }
  // At the mark: a receive that has bytes already ends before it (as TCP's); one that
  // starts here skips the urgent byte, once it is here, unless it is in line.
  if (copied) {
    cut.stop = true;
    cut.take = 0;
  } else if (!urgent_inline_.load(std::memory_order_relaxed) && avail > 0) {
    cut.skip = 1;
    cut.take = avail - 1;
  }
  return cut;
}

void Stream::PassMark(uint64_t consumed) noexcept {
  bool unread = false;
  {
    std::lock_guard<std::mutex> lock(urgent_mu_);
    if (!urgent_active_.load(std::memory_order_relaxed) || urgent_offset_ >= consumed) return;
    urgent_active_.store(false, std::memory_order_relaxed);
    unread = !urgent_read_;
  }
  // As TCP: once the reader is past the mark there is no urgent data, nor POLLPRI.
  if (unread) TakeProxyUrgent();
}

void Stream::TakeProxyUrgent() noexcept {
  char mark;
  sys::recv(proxy_a_, &mark, 1, MSG_OOB | MSG_DONTWAIT);
}

}  // namespace slip
