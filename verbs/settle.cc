// Settling a verbs connection (docs/DESIGN.md, "Settling a connection"): a server's, and
// the client's of a listener that shares its port (at the end of this comment).
//
// A listener's rdma_cm request names the TCP 4-tuple it is for, but anybody who can speak
// rdma_cm can name any tuple: until the TCP connection's client proves, in band, that it
// made the request (its CONFIRM carries the request's nonce), the request's queue pair is
// not this connection's. So accept() installs the connection *held*: the application has
// it at once, and sees no bytes and no space; nothing the queue pair does reaches it. Then
// the client's first bytes on TCP decide:
//
//   CONFIRM(nonce) with the request's HELLO  -> the rings carry the stream
//   other bytes, EOF, an error               -> TCP from byte 0 (a plain client)
//   the queue pair fails or disconnects      -> TCP from byte 0, gated
//   nothing by the deadline                  -> TCP from byte 0, gated
//   a CONFIRM of another nonce               -> reset (neither path is safe)
//
// Settle runs under failover_.lock(), and polls the queue pair for the HELLO: nothing may ask
// for a failover while held (Fail and RequestFailover only mark the request broken), so the
// poll never takes that lock again.
//
// "Gated": no byte of the client has been seen, and a real client may yet be late with its
// CONFIRM, which must never be delivered as data. The first bytes that arrive are looked
// at before any is delivered: a CONFIRM there resets the connection (the late client gets
// a reset too: its queue pair is in the error state, and its failover finds the anchor
// carrying our application's bytes). A plain client's bytes pass. So a forged request
// costs a plain client at most a wait for its first bytes from the server (a server that
// speaks first), never its connection, and costs accept() nothing.
//
// A client whose listener shares its port (SO_REUSEPORT, kFlagGroup in the REP) is held
// too, since another process may accept its connection, a plain one among them, which
// would read a CONFIRM as data: it sends the CONFIRM only once the accepting process said
// TAKEN on the queue pair (docs/DESIGN.md "Servers that share a port", over verbs).
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

void Conn::Hold(uint64_t nonce, uint64_t deadline_ms) noexcept {
  held_nonce_ = nonce;
  deadline_ms_ = deadline_ms;
  // A request whose queue pair failed before the accept is broken from the start; the
  // failure is the request's, not the connection's (which may yet be plain).
  held_broken_.store(error_.exchange(0) != 0, std::memory_order_relaxed);
  gate_.Lower();
  failover_.Hold();
  settle_at_.store(deadline_ms, std::memory_order_release);
}

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
    stream_live_.store(true, std::memory_order_release);
  }
  AfterSettledOnRdma();
  return Settlement::kSettled;
}

ChannelControl::Settlement Conn::Settle(uint64_t now_ms, Reason* why) noexcept {
  if (awaits_taken()) return SettleClient(now_ms, why);
  {
    std::lock_guard<std::mutex> lock(failover_.lock());
    if (!held()) return Settlement::kSettled;
    const int anchor = failover_.anchor();
    if (anchor < 0) return Settlement::kPending;  // (not installed yet)
    const AnchorPeek peek = PeekAnchor(anchor);
    const wire::Confirm& confirm = peek.msg.confirm;
    if (peek.Is(wire::Type::kConfirm)) {
      Hello hello;
      const bool ours = confirm.nonce == held_nonce_ && confirm.ring_size == ring_size();
      bool hello_ok = HelloReceived(&hello);
      if (ours && !hello_ok && !held_broken_.load() && now_ms < deadline_ms_) {
        // Its HELLO left before its SYN, on the queue pair: it is in flight, or in the
        // completion queue. Look again in a moment.
        settle_at_.store(now_ms + 1, std::memory_order_release);
        return Settlement::kPending;
      }
      hello_ok = hello_ok && hello.nonce == held_nonce_ && (1u << hello.ring_log2) == ring_size();
      if (!ours || !hello_ok) {
        // A client that confirmed another request than the one held here (the real one
        // lost to a forgery), or whose queue pair never said its ring: it writes where
        // nobody reads, so the connection can be neither accelerated nor plain. (The gate
        // keeps its CONFIRM from the application; the caller resets the anchor.)
        SLIP_LOG(kWarn,
                 "verbs: the client's CONFIRM does not match this connection's request (%s); "
                 "resetting it",
                 ours ? "no HELLO on its queue pair" : "another request's nonce");
        gate_.Trip();
        SettlePlainLocked(/*gated=*/true);
        Fail(ECONNRESET);
        return Settlement::kReset;
      }
      ConsumeAnchor(anchor, peek);
      SetPeer(hello.ring_addr, hello.rkey, false);
      failover_.Release();
      settle_at_.store(0, std::memory_order_release);
      stream_live_.store(true, std::memory_order_release);
    } else if (peek.kind == AnchorPeek::Kind::kMessage || peek.kind == AnchorPeek::Kind::kBytes ||
               peek.kind == AnchorPeek::Kind::kEnd) {
      // Bytes that are not a CONFIRM come from a plain client (whoever made the request
      // was not its client): they are the application's. EOF or an error: the application
      // sees it on TCP.
      SettlePlainLocked(/*gated=*/false);
      *why = Reason::kPeerNotSlipstream;
      return Settlement::kPlain;
    } else if (held_broken_.load(std::memory_order_seq_cst)) {
      // The request's queue pair went away (a client that gave up disconnects) or broke
      // the protocol: no RDMA for this connection. (A CONFIRM may be partly here: gated.)
      SettlePlainLocked(/*gated=*/true);
      *why = Reason::kConnectSlow;
      return Settlement::kPlain;
    } else if (now_ms < deadline_ms_) {
      settle_at_.store(deadline_ms_, std::memory_order_release);
      return Settlement::kPending;  // the anchor's next bytes, or the deadline
    } else {
      SLIP_LOG(kInfo,
               "verbs: no CONFIRM from the client of a requested connection in time; it "
               "continues on TCP");
      SettlePlainLocked(/*gated=*/true);
      *why = Reason::kHandshakeTimeout;
      return Settlement::kPlain;
    }
  }
  AfterSettledOnRdma();
  return Settlement::kSettled;
}

void Conn::AfterSettledOnRdma() noexcept {
  // On the rings now. The rest posts and polls, which may ask for a failover (and so take
  // failover_.lock()): after the lock.
  // What the application did while held (the same race as CloseTx's, on the carriage).
  if (failover_.finished()) CloseTx();
  if (rx_close_wanted_.load(std::memory_order_seq_cst)) CloseRx();
  // A reader that went to sleep on the own channel while held polled nothing (held, there
  // is nothing to read), so the queue was never armed for it: a note that lands after this
  // would wake nobody. Poll arms it for an announced sleeper, and takes what is here.
  Poll();
  if (const int b = proxy_b_.load(); b >= 0 && (rx_eof_.load() || error_.load()))
    sys::shutdown(b, SHUT_WR);
  // Whoever waited for space or bytes while held is owed a wake-up now, if there is
  // anything for them (a token for nothing would make an idle connection readable).
  WakeWriterNow();
  if (rx_produced_.load(std::memory_order_acquire) != failover_.consumed()) WakeReaderNow();
  // Confirmed, but its queue pair failed meanwhile: the client is real, so the stream
  // fails over from where both ends stand (nothing was carried yet).
  if (held_broken_.load(std::memory_order_seq_cst))
    TransportFailed(wire::FailoverCause::kTransportError);
}

void Conn::SettlePlainLocked(bool gated) noexcept {
  // Nothing lands in our ring from here on (the queue pair is in the error state): the
  // ring is ours alone, and carries the TCP path from byte 0 both ways.
  HaltRdmaLocked();
  // The request's peer learns it at once (a client that gave up, or a forger).
  if (id_ && !rdma_released_.load(std::memory_order_acquire)) rdma_disconnect(id_);
  if (gated) gate_.Raise();
  // A failure that raced with Hold was the request's, never this connection's.
  error_.store(0, std::memory_order_release);
  settle_at_.store(0, std::memory_order_release);
  failover_.EnterTcp(0, 0);
}

bool Conn::PassGate() const noexcept {
  bool reset = false;
  const bool pass = gate_.Pass(failover_.anchor(), "verbs", &reset);
  if (reset) const_cast<Conn*>(this)->Fail(ECONNRESET);
  return pass;
}

}  // namespace slip::verbs
