// Settling a server's verbs connection (docs/DESIGN.md, "Settling a connection").
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
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

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
  gate_up_.store(false, std::memory_order_relaxed);
  gate_tripped_.store(false, std::memory_order_relaxed);
  failover_.Hold();
  settle_at_.store(deadline_ms, std::memory_order_release);
}

ChannelControl::Settlement Conn::Settle(uint64_t now_ms, Reason* why) noexcept {
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
        gate_tripped_.store(true, std::memory_order_relaxed);
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
  // On the rings now. The rest posts and polls, which may ask for a failover (and so take
  // failover_.lock()): after the lock.
  // What the application did while held (the same race as CloseTx's, on the carriage).
  if (failover_.finished()) CloseTx();
  if (rx_close_wanted_.load(std::memory_order_seq_cst)) CloseRx();
  if (proxy_b_ >= 0 && (rx_eof_.load() || error_.load())) sys::shutdown(proxy_b_, SHUT_WR);
  // Whoever waited for space or bytes while held is owed a wake-up now, if there is
  // anything for them (a token for nothing would make an idle connection readable).
  WakeWriterNow();
  if (rx_produced_.load(std::memory_order_acquire) != failover_.consumed()) WakeReaderNow();
  // Confirmed, but its queue pair failed meanwhile: the client is real, so the stream
  // fails over from where both ends stand (nothing was carried yet).
  if (held_broken_.load(std::memory_order_seq_cst))
    TransportFailed(wire::FailoverCause::kTransportError);
  return Settlement::kSettled;
}

void Conn::SettlePlainLocked(bool gated) noexcept {
  // Nothing lands in our ring from here on (the queue pair is in the error state): the
  // ring is ours alone, and carries the TCP path from byte 0 both ways.
  HaltRdmaLocked();
  // The request's peer learns it at once (a client that gave up, or a forger).
  if (id_ && !rdma_released_.load(std::memory_order_acquire)) rdma_disconnect(id_);
  if (gated) gate_up_.store(true, std::memory_order_release);
  // A failure that raced with Hold was the request's, never this connection's.
  error_.store(0, std::memory_order_release);
  settle_at_.store(0, std::memory_order_release);
  failover_.EnterTcp(0, 0);
}

bool Conn::PassGate() const noexcept {
  if (!gate_up_.load(std::memory_order_acquire)) return true;
  if (gate_tripped_.load(std::memory_order_acquire)) return false;  // (being reset)
  const int anchor = failover_.anchor();
  const AnchorPeek peek = PeekAnchor(anchor);
  // Nothing yet, or our magic so far: nothing to deliver until the rest says what it is.
  if (peek.kind == AnchorPeek::Kind::kNone || peek.kind == AnchorPeek::Kind::kPartial) return false;
  if (peek.Is(wire::Type::kConfirm)) {
    if (!gate_tripped_.exchange(true)) {
      SLIP_LOG(kWarn,
               "verbs: a CONFIRM arrived after the connection went on as plain TCP (its "
               "client was too late); resetting the connection rather than passing it on as "
               "data");
      // The application gets ECONNRESET now, and its close resets the TCP connection (no
      // FIN first: the client must not take it for an orderly end).
      linger lg{1, 0};
      sys::setsockopt(anchor, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
      auto* self = const_cast<Conn*>(this);
      self->Fail(ECONNRESET);
    }
    return false;
  }
  gate_up_.store(false, std::memory_order_release);  // the application's bytes (or EOF)
  return true;
}

}  // namespace slip::verbs
