// Settling a group's client: the client of a listener that shares its port (SO_REUSEPORT,
// kFlagGroup in the REP) is held, since another process may accept its connection, a
// plain one among them, which would read a CONFIRM as data: it sends the CONFIRM only once
// the accepting process said TAKEN on the queue pair (docs/DESIGN.md "Servers that share a
// port", over verbs). A server's connection settles as RemoteRing says, on the HELLO
// (QpChannel::ConfirmedPeer).
//
//   TAKEN                                     -> CONFIRM, then the rings carry the stream
//   the server's bytes or EOF, the queue pair
//   fails, nothing by the deadline            -> TCP from byte 0 (nothing of ours in band)
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "core/anchor_path.h"
#include "core/log.h"
#include "core/sys.h"
#include "verbs/conn.h"

namespace slip::verbs {

void Conn::ExpectTaken(uint64_t nonce) noexcept {
  taken_nonce_ = nonce;
  no_reuse_ = true;
  expect_taken_.store(true, std::memory_order_release);
}

void Conn::HoldForTaken(uint64_t deadline_ms) noexcept {
  Hold(taken_nonce_, deadline_ms);
  // (Settle looks at the queue pair for the TAKEN long before the deadline.)
  held_since_ms_ = sys::MonotonicMs();
  taken_poll_ms_ = 1;
  settle_at_.store(held_since_ms_ + taken_poll_ms_, std::memory_order_release);
}

ChannelControl::Settlement Conn::SettleClient(uint64_t now_ms, Reason* why) noexcept {
  {
    std::lock_guard<std::mutex> lock(failover_.lock());
    if (!held()) return Settlement::kSettled;
    const int anchor = failover_.anchor();
    if (anchor < 0) return Settlement::kPending;  // (not installed yet)
    // A process that took our request keeps the connection silent until our CONFIRM: bytes
    // or an end from the server mean one that did not (a plain member of the group, or
    // one whose request this is not) accepted it. Nothing of ours went in band, nothing
    // was written (held: no space): TCP from byte 0.
    const AnchorPeek peek = PeekAnchor(anchor);
    Poll();  // the TAKEN, if it came (held, a failure only marks the request broken)
    if (peek.kind != AnchorPeek::Kind::kNone || held_broken_.load(std::memory_order_seq_cst)) {
      SettlePlainLocked(/*gated=*/false);
      *why =
          peek.kind != AnchorPeek::Kind::kNone ? Reason::kAcceptedElsewhere : Reason::kConnectSlow;
      return Settlement::kPlain;
    }
    if (!taken_.load(std::memory_order_acquire)) {
      if (now_ms >= deadline_ms_) {
        SLIP_LOG(kInfo,
                 "verbs: the server's process did not say it took the connection in time; "
                 "it continues on TCP");
        SettlePlainLocked(/*gated=*/false);
        *why = Reason::kAcceptedElsewhere;
        return Settlement::kPlain;
      }
      // Nothing wakes the control thread for a completion: look again every millisecond
      // for the first 8 (a TAKEN follows the SYN by the server's accept), then less often
      // (the accept may sit in a backlog).
      if (now_ms - held_since_ms_ >= 8) taken_poll_ms_ = std::min<uint32_t>(taken_poll_ms_ * 2, 16);
      settle_at_.store(std::min(deadline_ms_, now_ms + taken_poll_ms_), std::memory_order_release);
      return Settlement::kPending;
    }
    if (!SendConfirm(anchor, held_nonce_, ring_size(), 1000)) {
      // Part of it may be in the stream: neither path is safe.
      SLIP_LOG(kWarn, "verbs: cannot send the CONFIRM of a taken connection; resetting it");
      SettlePlainLocked(/*gated=*/false);
      Fail(ECONNRESET);
      return Settlement::kReset;
    }
    failover_.Release();
    settle_at_.store(0, std::memory_order_release);
    OnSettledLocked();
  }
  AfterSettled();
  return Settlement::kSettled;
}

ChannelControl::Settlement Conn::Settle(uint64_t now_ms, Reason* why) noexcept {
  return awaits_taken() ? SettleClient(now_ms, why) : RemoteRing::Settle(now_ms, why);
}

bool Conn::SendTaken(uint64_t nonce) noexcept {
  LinkMsg taken;
  taken.kind = LinkKind::kTaken;
  taken.nonce = nonce;
  return SendLink(taken);
}

}  // namespace slip::verbs
