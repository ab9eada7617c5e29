// StreamConn's control side: settling a server's connection, failover to the TCP anchor,
// and the hand-back at exec. The rules are verbs' (verbs/settle.cc tells them at length);
// the exchange on the anchor is core's (AnchorFailover), and so is the gate (SettleGate).
//
//   CONFIRM(nonce) of the request                -> the rings carry the stream
//   other bytes, EOF, an error                   -> TCP from byte 0 (a plain client)
//   the request's writes fail, or nothing by the
//   deadline                                     -> TCP from byte 0, gated
//   a CONFIRM of another nonce                   -> reset (neither path is safe)
//
// A client's REQ carried its ring, so unlike verbs nothing else must arrive first.
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
  held_nonce_ = nonce;
  deadline_ms_ = deadline_ms;
  held_broken_.store(error_.exchange(0) != 0, std::memory_order_relaxed);
  gate_.Lower();
  failover_.Hold();
  settle_at_.store(deadline_ms, std::memory_order_release);
}

ChannelControl::Settlement StreamConn::Settle(uint64_t now_ms, Reason* why) noexcept {
  {
    std::lock_guard<std::mutex> lock(failover_.lock());
    if (!held()) return Settlement::kSettled;
    const int anchor = failover_.anchor();
    if (anchor < 0) return Settlement::kPending;  // (not installed yet)
    const AnchorPeek peek = PeekAnchor(anchor);
    if (peek.Is(wire::Type::kConfirm)) {
      const wire::Confirm& confirm = peek.msg.confirm;
      if (confirm.nonce != held_nonce_ || confirm.ring_size != ring_size()) {
        // A client that confirmed another request than the one held here (the real one
        // lost to a forgery): it writes where nobody reads, so the connection can be
        // neither carried nor plain. (The gate keeps its CONFIRM from the application.)
        SLIP_LOG(kWarn,
                 "fabric: the client's CONFIRM does not match this connection's request; "
                 "resetting it");
        gate_.Trip();
        SettlePlainLocked(/*gated=*/true);
        Fail(ECONNRESET);
        return Settlement::kReset;
      }
      if (ep_.load(std::memory_order_acquire) == nullptr) {
        // Its client's endpoint was connected before its SYN left, but ours may hear of it
        // a moment later (the provider's last handshake message, the progress thread). No
        // endpoint at all (a dropped request's: HoldForDroppedRequest): nothing to wait for.
        if (fabric_->connected() &&
            link_state_.load(std::memory_order_acquire) != LinkState::kDown &&
            now_ms < deadline_ms_) {
          settle_at_.store(now_ms + 1, std::memory_order_release);
          return Settlement::kPending;
        }
        held_broken_.store(true, std::memory_order_seq_cst);  // fails over once settled
      }
      ConsumeAnchor(anchor, peek);
      failover_.Release();
      settle_at_.store(0, std::memory_order_release);
    } else if (peek.kind == AnchorPeek::Kind::kMessage || peek.kind == AnchorPeek::Kind::kBytes ||
               peek.kind == AnchorPeek::Kind::kEnd) {
      // Bytes that are not a CONFIRM come from a plain client (whoever sent the REQ was
      // not its client): they are the application's.
      SettlePlainLocked(/*gated=*/false);
      *why = plain_reason_;
      return Settlement::kPlain;
    } else if (held_broken_.load(std::memory_order_seq_cst)) {
      SettlePlainLocked(/*gated=*/true);
      *why = Reason::kConnectSlow;
      return Settlement::kPlain;
    } else if (now_ms < deadline_ms_) {
      settle_at_.store(deadline_ms_, std::memory_order_release);
      return Settlement::kPending;  // the anchor's next bytes, or the deadline
    } else {
      SLIP_LOG(kInfo,
               "fabric: no CONFIRM from the client of a requested connection in time; it "
               "continues on TCP");
      SettlePlainLocked(/*gated=*/true);
      *why = Reason::kHandshakeTimeout;
      return Settlement::kPlain;
    }
  }
  AfterSettled();
  return Settlement::kSettled;
}

void StreamConn::AfterSettled() noexcept {
  // What the application did while held, and the wake-ups it is owed.
  if (failover_.finished()) CloseTx();
  if (rx_close_wanted_.load(std::memory_order_seq_cst)) CloseRx();
  Poll();  // (what came while held; and the progress thread's watch, if somebody waits)
  if (const int b = proxy_b_.load(); b >= 0 && (rx_eof_.load() || error_.load()))
    sys::shutdown(b, SHUT_WR);
  WakeWriterNow();
  std::atomic_thread_fence(std::memory_order_seq_cst);  // (WakeReaderIfSettled's pair)
  if (rx_produced_.load(std::memory_order_acquire) != failover_.consumed()) WakeReaderNow();
  // Confirmed, but its path broke meanwhile: the client is real, so the stream fails over
  // from where both ends stand (nothing was carried yet). Unless the break was the
  // client's orderly close: its EOF and CLOSED came, and it shut its endpoint after them
  // (a client that connected, confirmed and closed at once; taken for a failing fabric,
  // with a warning, in ~1 semantics run in 40 under load).
  if (held_broken_.load(std::memory_order_seq_cst) &&
      !(rx_eof_.load(std::memory_order_acquire) && peer_closed_.load(std::memory_order_acquire)))
    TransportFailed(wire::FailoverCause::kTransportError);
}

void StreamConn::SettlePlainLocked(bool gated) noexcept {
  // Nothing lands in our ring from here on: it carries the TCP path from byte 0 both ways.
  HaltLocked();
  if (gated) gate_.Raise();
  error_.store(0, std::memory_order_release);  // (the request's failures, never the stream's)
  settle_at_.store(0, std::memory_order_release);
  failover_.EnterTcp(0, 0);
}

bool StreamConn::MayDeliver() const noexcept {
  bool reset = false;
  const bool pass = gate_.Pass(failover_.anchor(), "fabric", &reset);
  if (reset) const_cast<StreamConn*>(this)->Fail(ECONNRESET);
  return pass;
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
