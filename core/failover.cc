#include "core/failover.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/sys.h"

namespace slip {

void AnchorFailover::Reset() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  anchor_.store(-1, std::memory_order_relaxed);
  carriage_.store(Carriage::kTransport, std::memory_order_relaxed);
  published_.store(0, std::memory_order_relaxed);
  consumed_.store(0, std::memory_order_relaxed);
  finished_.store(false, std::memory_order_relaxed);
  ours_sent_ = false;
  received_ = 0;
  urgent_acked_ = 0;
  said_in_band_.store(false, std::memory_order_relaxed);
  window_ = 0;
  window_pending_ = false;
}

Carriage AnchorFailover::Publish(uint64_t produced) noexcept {
  // Published before the carriage is read, as EnterTcp sets the carriage before it reads
  // what is published: a publish racing with the switch is pushed by one of the two. (The
  // fence also orders the caller's own stores before its next loads: shm's wake-up
  // protocol relies on it.)
  published_.store(produced, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // (Acquire: EnterTcp's store publishes the path's set-up.)
  const Carriage carriage = carriage_.load(std::memory_order_acquire);
  if (carriage == Carriage::kTcp) path_.Push(produced);
  return carriage;
}

Carriage AnchorFailover::FinishTx() noexcept {
  finished_.store(true, std::memory_order_relaxed);  // (the same race as Publish's)
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const Carriage carriage = carriage_.load(std::memory_order_acquire);
  if (carriage == Carriage::kTcp) path_.Finish(published());
  return carriage;
}

uint64_t AnchorFailover::Pull() const noexcept {
  if (!ends_->MayDeliver()) return path_.received();  // (nothing delivered before that)
  const uint64_t received = path_.Pull(consumed());
  path_.ShowEnd(own_b_);
  return received;
}

void AnchorFailover::OnAnchorReady(uint32_t events) const noexcept {
  if (!on_tcp()) return;
  const bool readable = events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR);
  const AnchorPath::Moved moved =
      path_.OnReady(events, consumed(), published(), !readable || ends_->MayDeliver());
  if (moved.received) ends_->WakeReaderNow();
  // A writer may also sleep on nothing sent: one that found the ring full while its
  // connection was held (nothing is published then) must wake once it is carried here.
  if (moved.sent || (events & EPOLLOUT)) ends_->WakeWriterNow();
  // As the transport's end-of-stream and reset would: readers see EOF (or the error),
  // writers wake to it.
  path_.ShowEnd(own_b_);
}

bool AnchorFailover::FinishOnClose(int timeout_ms) noexcept {
  const uint64_t last = published();
  path_.Finish(last);
  if (path_.PushAll(last, timeout_ms)) return true;
  SLIP_LOG(kWarn, "%s: closing with %llu bytes not taken by the TCP connection", transport_,
           (unsigned long long)(last - path_.sent()));
  return false;
}

void AnchorFailover::Begin() noexcept {
  Carriage expected = Carriage::kTransport;
  carriage_.compare_exchange_strong(expected, Carriage::kFailing, std::memory_order_seq_cst);
}

bool AnchorFailover::SendOurs(uint64_t received, wire::FailoverCause cause) noexcept {
  const wire::Failover mine{.received = received, .sent = published(), .cause = cause};
  if (!SendFailover(anchor(), mine, 0)) return false;
  ours_sent_ = true;
  received_ = received;
  return true;
}

bool AnchorFailover::Fits(const wire::Failover& peer, uint64_t credited,
                          uint64_t received) const noexcept {
  const uint64_t sent = published();
  if (peer.received >= credited && peer.received <= sent && peer.sent >= received) return true;
  SLIP_LOG(kWarn,
           "%s: the peer's FAILOVER (received %llu, sent %llu) does not fit this end "
           "(credited %llu, published %llu, received %llu)",
           transport_, (unsigned long long)peer.received, (unsigned long long)peer.sent,
           (unsigned long long)credited, (unsigned long long)sent, (unsigned long long)received);
  return false;
}

AnchorFailover::Outcome AnchorFailover::OnPeerFailover(const wire::Failover& peer,
                                                       uint64_t received,
                                                       uint64_t credited) noexcept {
  if (peer.cause == wire::FailoverCause::kHandBack)
    SLIP_LOG(kInfo, "%s: the peer handed the connection back to TCP (exec)", transport_);
  if (ours_sent_) received = received_;
  // Only what the peer did not receive is still in our ring.
  if (!Fits(peer, credited, received)) return Outcome::kMisfit;
  if (!ours_sent_) {
    // Our answer: whatever we published is in our ring, from what the peer received on.
    const wire::Failover answer{
        .received = received, .sent = published(), .cause = wire::FailoverCause::kPeerRequest};
    if (!SendFailover(anchor(), answer, 1000)) {
      SLIP_LOG(kWarn, "%s: cannot answer the peer's FAILOVER on TCP (%s)", transport_,
               strerror(errno));
      return Outcome::kUnanswered;
    }
    ours_sent_ = true;
    received_ = received;
  }
  SLIP_LOG(kInfo, "%s: on TCP from here: resending %llu bytes from byte %llu", transport_,
           (unsigned long long)(published() - peer.received), (unsigned long long)peer.received);
  EnterTcp(received, peer.received);
  return Outcome::kContinued;
}

void AnchorFailover::EnterTcp(uint64_t rx_from, uint64_t tx_from) noexcept {
  path_.Start(anchor(), rx_ring_, tx_ring_, ring_size_, rx_from, tx_from);
  // Releases the path's set-up to whoever reads the carriage; the fence orders the store
  // against Publish's and FinishTx's (each writes its own variable, fences, reads the
  // other's).
  carriage_.store(Carriage::kTcp, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  urgent_cv_.notify_all();  // (a sender waiting for its URGENT's answer: it came before)
  if (finished()) path_.Finish(published());
  OnAnchorReady(EPOLLIN | EPOLLOUT);
  // Send credit may have jumped to what the peer received: writers look again. Readers
  // are woken by what the path moves into their ring (above, and as the anchor's bytes
  // come), as by the transport: a token for nothing would show the application a
  // readable socket with nothing to read (wrk counts that read as an error).
  ends_->WakeWriterNow();
}

bool AnchorFailover::HandBack(uint64_t consumed, uint64_t credited, int timeout_ms) noexcept {
  const int fd = anchor();
  const uint64_t deadline = sys::MonotonicMs() + uint64_t(timeout_ms);
  auto left = [deadline]() noexcept {
    const uint64_t now = sys::MonotonicMs();
    return now >= deadline ? 0 : int(deadline - now);
  };
  const uint64_t last = published();
  const wire::Failover mine{
      .received = consumed, .sent = last, .cause = wire::FailoverCause::kHandBack};
  wire::Failover peer;
  if (!SendFailover(fd, mine, left()) || !ReceiveFailover(fd, left(), &peer)) {
    SLIP_LOG(kWarn, "%s: hand-back: no FAILOVER answer from the peer within %d ms", transport_,
             timeout_ms);
    return false;
  }
  ours_sent_ = true;
  received_ = consumed;
  if (!Fits(peer, credited, consumed)) return false;
  if (peer.received < last) {
    // (A path of its own: this end's never starts, the stream is the new program's.)
    AnchorPath resend;
    resend.Start(fd, nullptr, tx_ring_, ring_size_, consumed, peer.received);
    if (!resend.PushAll(last, left())) {
      SLIP_LOG(kWarn, "%s: hand-back: TCP did not take the %llu bytes to resend", transport_,
               (unsigned long long)(last - resend.sent()));
      return false;
    }
  }
  if (finished()) sys::shutdown(fd, SHUT_WR);
  SLIP_LOG(kDebug, "%s: hand-back: on TCP from byte %llu in, %llu out (%llu resent)", transport_,
           (unsigned long long)consumed, (unsigned long long)last,
           (unsigned long long)(last - peer.received));
  return true;
}

}  // namespace slip

namespace slip {

AnchorFailover::UrgentRoute AnchorFailover::AnnounceUrgent(uint64_t offset, uint8_t byte,
                                                           int timeout_ms) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (anchor() < 0) return UrgentRoute::kNone;
  if (carriage() != Carriage::kTransport || ours_sent_) {
    // Our FAILOVER is out (or the stream is on TCP): TCP's own urgent data carries it.
    path_.MarkUrgent(offset);
    return UrgentRoute::kOnAnchor;
  }
  wire::Message msg;
  msg.type = wire::Type::kUrgent;
  msg.urgent = wire::Urgent{.offset = offset, .byte = byte, .ack = false};
  if (!SendOnAnchor(anchor(), msg, timeout_ms)) {
    SLIP_LOG(kWarn, "%s: cannot tell the peer of urgent data (%s): it goes as ordinary data",
             transport_, strerror(errno));
    return UrgentRoute::kUnmarked;
  }
  said_in_band_.store(true, std::memory_order_relaxed);
  const bool answered = urgent_cv_.wait_for(
      lock, std::chrono::milliseconds(timeout_ms),
      [&]() noexcept { return urgent_acked_ > offset || carriage() != Carriage::kTransport; });
  if (answered) return UrgentRoute::kMarked;
  SLIP_LOG(kWarn, "%s: the peer did not answer an urgent mark within %d ms", transport_,
           timeout_ms);
  return UrgentRoute::kUnmarked;
}

void AnchorFailover::AnswerUrgent(uint64_t offset) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (ours_sent_ || carriage() == Carriage::kTcp) return;
  wire::Message msg;
  msg.type = wire::Type::kUrgent;
  msg.urgent = wire::Urgent{.offset = offset, .byte = 0, .ack = true};
  if (!SendOnAnchor(anchor(), msg, 1000))
    SLIP_LOG(kWarn, "%s: cannot answer the peer's urgent mark (%s)", transport_, strerror(errno));
}

void AnchorFailover::OnUrgentAck(uint64_t offset) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (offset + 1 > urgent_acked_) urgent_acked_ = offset + 1;
  }
  urgent_cv_.notify_all();
}

ssize_t AnchorFailover::RecvUrgentOnAnchor(uint8_t* byte, int flags) const noexcept {
  if (!on_tcp()) return -EINVAL;
  const ssize_t n = sys::recv(anchor(), byte, 1, MSG_OOB | MSG_DONTWAIT | (flags & MSG_PEEK));
  return n < 0 ? -errno : n;
}

}  // namespace slip

namespace slip {

namespace {

bool SendWindow(int fd, uint32_t bytes) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kWindow;
  msg.window = wire::Window{.bytes = bytes};
  return SendOnAnchor(fd, msg, 1000);
}

}  // namespace

void AnchorFailover::Release() noexcept {
  carriage_.store(Carriage::kTransport, std::memory_order_seq_cst);
  if (!window_pending_) return;
  window_pending_ = false;
  if (SendWindow(anchor(), window_)) said_in_band_.store(true, std::memory_order_relaxed);
}

void AnchorFailover::AnnounceWindow(uint32_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  window_ = bytes;
  if (anchor() < 0) return;
  if (carriage() == Carriage::kHeld) {
    window_pending_ = true;
    return;
  }
  if (carriage() != Carriage::kTransport || ours_sent_) return;
  if (!SendWindow(anchor(), bytes)) {
    SLIP_LOG(kWarn, "%s: cannot tell the peer of this end's receive buffer (%s)", transport_,
             strerror(errno));
    return;
  }
  said_in_band_.store(true, std::memory_order_relaxed);
}

}  // namespace slip
