// StreamConn's control side: settling a server's connection (the rules are core's,
// core/remote_ring.h: here only what fabric adds), failover to the TCP anchor, and the
// hand-back at exec (the exchange on the anchor is core's AnchorFailover).
//
// A client's REQ carried its ring, so a CONFIRM of the request settles the connection as
// soon as our endpoint for it is up (connected endpoints: it may come a moment after the
// client's).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/anchor_path.h"
#include "core/log.h"
#include "core/sanitizer.h"
#include "core/sys.h"
#include "fabric/stream_conn.h"
#include "fabric/stream_fabric.h"

namespace slip::fabric {

namespace {

// How long a failover waits for our writes' completions before it knows their order.
constexpr int kOrderWaitMs = 1000;

const char* CauseText(wire::FailoverCause cause) noexcept {
  switch (cause) {
    case wire::FailoverCause::kPeerRequest:
      return "the peer's fabric path failed";
    case wire::FailoverCause::kHandBack:
      return "the peer handed the connection back";
    default:
      return "a write on the fabric failed";
  }
}

// The anchor was reset or closed for good: the peer is gone, not the fabric.
bool AnchorGone(int fd) noexcept {
  tcp_info info{};
  socklen_t len = sizeof(info);
  // TCP_INFO, not a peek or SO_ERROR: those would take the pending ECONNRESET from the
  // control thread, which reports it to the application.
  return fd >= 0 && sys::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
         info.tcpi_state == TCP_CLOSE;
}

}  // namespace

void StreamConn::HoldForDroppedRequest(uint64_t nonce, uint64_t deadline_ms) noexcept {
  link_state_.store(LinkState::kDown, std::memory_order_release);  // (nothing to wait for)
  plain_reason_ = Reason::kRendezvousBusy;
  Hold(nonce, deadline_ms);
}

void StreamConn::Hold(uint64_t nonce, uint64_t deadline_ms) noexcept {
  unproven_ = false;  // (its TCP connection is accepted)
  RemoteRing::Hold(nonce, deadline_ms);
}

RemoteRing::PeerCheck StreamConn::ConfirmedPeer(uint64_t now_ms, const char**) noexcept {
  if (ep_.load(std::memory_order_acquire) == nullptr) {
    // Its client's endpoint was connected before its SYN left, but ours may hear of it a
    // moment later (the provider's last handshake message, the progress thread). No
    // endpoint at all (a dropped request's: HoldForDroppedRequest): nothing to wait for.
    if (fabric_->connected() && link_state_.load(std::memory_order_acquire) != LinkState::kDown &&
        now_ms < deadline_ms_)
      return PeerCheck::kWait;
    held_broken_.store(true, std::memory_order_seq_cst);  // fails over once settled
  }
  return PeerCheck::kReady;
}

void StreamConn::HaltLocked() noexcept {
  failover_.Begin();
  halted_.store(true, std::memory_order_seq_cst);
  // (Sends: a message being copied into the ring lands before the copy below, or not at
  // all; TakeSent.)
  while (rx_copying_.load(std::memory_order_seq_cst) != 0) sched_yield();
  if (rx_copy_) return;
  // The peer's writes in flight may still land in the registered ring, which stays as it
  // is (taking its registration away would break the provider's connection to that peer
  // for its other streams): the stream goes on in a copy.
  std::unique_ptr<uint8_t[]> copy(new (std::nothrow) uint8_t[ring_size()]);
  if (!copy) {
    rx_mr_.reset();  // (no memory: the peer's late writes fail instead)
    return;
  }
  {
    // (Where the peer's late writes land meanwhile is space no cursor published: the
    // stream never reads it from the copy.)
    san::PeerMemoryReads peer_writes;
    std::memcpy(copy.get(), rx_ring_.load(std::memory_order_relaxed), ring_size());
  }
  rx_ring_.store(copy.get(), std::memory_order_release);
  failover_.SetRings(copy.get(), tx_ring_);
  rx_copy_ = std::move(copy);
}

void StreamConn::TransportFailed(wire::FailoverCause cause) noexcept {
  if (failover_.carriage() != Carriage::kTransport) {
    if (held()) held_broken_.store(true, std::memory_order_seq_cst);
    return;
  }
  std::lock_guard<std::mutex> lock(failover_.lock());
  if (failover_.carriage() != Carriage::kTransport || error_.load(std::memory_order_acquire) != 0 ||
      orphaned_.load())
    return;
  const int anchor = failover_.anchor();
  if (anchor < 0 || aborting_ || AnchorGone(anchor)) {
    // The peer reset the connection (or died): its reset, not a failing fabric.
    Fail(ECONNRESET);
    return;
  }
  HaltLocked();
  if (!failover_.SendOurs(rx_produced_.load(std::memory_order_acquire), cause)) {
    SLIP_LOG(kWarn, "fabric: %s, and the TCP connection cannot take FAILOVER; resetting",
             CauseText(cause));
    Fail(ECONNRESET);
    return;
  }
  SLIP_LOG(kWarn, "fabric: %s: the connection continues on TCP (%llu bytes received over %s)",
           CauseText(cause), (unsigned long long)rx_produced_.load(), "the fabric");
  // The peer answers with its own FAILOVER, which the control thread hands to
  // OnPeerFailover.
}

bool StreamConn::OnPeerFailover(const wire::Failover& peer) noexcept {
  if (failover_.anchor() < 0 || orphaned_.load()) return false;
  // We resend from what the peer says it received, which is only so if no write of ours
  // landed after an earlier one failed (a note of the later one would claim the earlier
  // one's bytes): failing over then would deliver bytes that never came. Reset instead.
  // (Where that can happen: StreamFabric::checks_write_order.)
  if (peer.cause != wire::FailoverCause::kHandBack && fabric_->checks_write_order() &&
      !WritesLandedInOrder(kOrderWaitMs)) {
    SLIP_LOG(kWarn,
             "fabric: a write failed and a later one may have landed (the provider connected "
             "again): the peer's count of our bytes cannot be trusted; resetting");
    Fail(ECONNRESET);
    return false;
  }
  std::lock_guard<std::mutex> lock(failover_.lock());
  const Carriage carriage = failover_.carriage();
  if (error_.load(std::memory_order_acquire) != 0 ||
      (carriage != Carriage::kTransport && carriage != Carriage::kFailing))
    return false;
  if (carriage == Carriage::kTransport) {
    HaltLocked();
    if (peer.cause != wire::FailoverCause::kHandBack)
      SLIP_LOG(kWarn, "fabric: %s: the connection continues on TCP",
               CauseText(wire::FailoverCause::kPeerRequest));
  }
  switch (failover_.OnPeerFailover(peer, rx_produced_.load(std::memory_order_acquire),
                                   tx_credit_.load(std::memory_order_acquire))) {
    case AnchorFailover::Outcome::kContinued:
      return true;
    case AnchorFailover::Outcome::kMisfit:
      Fail(EPROTO);
      return false;
    case AnchorFailover::Outcome::kUnanswered:
      break;
  }
  Fail(ECONNRESET);
  return false;
}

bool StreamConn::HandBack(uint64_t consumed, int timeout_ms) noexcept {
  if (failover_.anchor() < 0 || orphaned_.load()) return false;
  std::lock_guard<std::mutex> lock(failover_.lock());
  if (failover_.carriage() != Carriage::kTransport || error_.load(std::memory_order_acquire) != 0)
    return false;
  // This end never speaks on the fabric again (the new program owns its bytes).
  aborting_ = true;
  HaltLocked();
  return failover_.HandBack(consumed, tx_credit_.load(std::memory_order_acquire), timeout_ms);
}

}  // namespace slip::fabric
