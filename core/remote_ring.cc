#include "core/remote_ring.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/anchor_path.h"
#include "core/log.h"
#include "core/proxy.h"
#include "core/sys.h"

namespace slip {

RemoteRing::RemoteRing(const Names& names, uint32_t ring_size) noexcept
    : Channel(ring_size), names_(names), failover_(names.transport, this, ring_size) {}

void RemoteRing::Orphan() noexcept {
  orphaned_.store(true, std::memory_order_release);
  error_.store(ECONNRESET, std::memory_order_release);
}

void RemoteRing::SetProxy(int proxy_b) noexcept {
  proxy_b_.store(proxy_b, std::memory_order_seq_cst);
  failover_.SetOwnProxy(proxy_b);
  // Held: nothing of the request's reaches the stream before it settles (AfterSettled).
  if (held()) {
    OnProxySet(false);
    return;
  }
  // An end or a failure that came before the stream existed (a peer that wrote and shut
  // down at once) found no proxy to tell: its first sleeper must still see it. (The fence
  // pairs with the note's: one of the two shuts the proxy's end down.)
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (rx_eof_.load() || error_.load()) sys::shutdown(proxy_b, SHUT_WR);
  OnProxySet(true);
}

void RemoteRing::TxPublish(uint64_t produced) noexcept {
  // (A publish racing with failover is sent by one of the two: AnchorFailover::Publish.)
  if (failover_.Publish(produced) != Carriage::kTransport || produced == tx_posted_) return;
  if (PostData(tx_posted_, produced)) tx_posted_ = produced;
}

void RemoteRing::CloseTx() noexcept {
  // (The same race as TxPublish's.) On TCP the FIN follows the last byte; failing, it does
  // once on TCP; held, settling sends it, on the transport or on TCP.
  if (failover_.FinishTx() == Carriage::kTransport && !eof_posted_.exchange(true)) PostEnd();
}

bool RemoteRing::RxEof() const noexcept {
  if (held()) return false;
  if (rx_eof_.load(std::memory_order_acquire)) return true;
  if (failover_.on_tcp()) return failover_.eof();
  // (Completions that nobody else takes may hold it.)
  if (ShowsArrivalsWithoutAsk() || !on_transport()) return false;
  TakeArrivals();
  return rx_eof_.load(std::memory_order_acquire);
}

bool RemoteRing::TxPeerClosed() const noexcept {
  if (held()) return false;
  if (peer_closed_.load(std::memory_order_acquire)) return true;
  return failover_.on_tcp() && failover_.peer_closed();
}

RemoteRing::Took RemoteRing::TakeProduced(uint64_t produced) noexcept {
  uint64_t known = rx_produced_.load(std::memory_order_acquire);
  if (produced <= known) return Took::kNothing;  // (a later note said more)
  // A peer that claims more than the ring holds would make us read garbage. (A note that
  // the reader already read past is stale, not an overrun: another poller took a later
  // one after our load of `known`, and the reader consumed what it said.)
  const uint64_t consumed = failover_.consumed();
  if (produced <= consumed) return Took::kNothing;
  if (produced - consumed > ring_size()) {
    SLIP_LOG(kWarn, "%s: the peer overran the ring (produced %llu, consumed %llu); resetting",
             names_.transport, (unsigned long long)produced, (unsigned long long)consumed);
    Fail(EPROTO);
    return Took::kViolation;
  }
  while (produced > known &&
         !rx_produced_.compare_exchange_weak(known, produced, std::memory_order_acq_rel)) {
  }
  // (Another poller may have moved it as far meanwhile: its wake-up then came first.)
  return produced > known ? Took::kMoved : Took::kNothing;
}

RemoteRing::Took RemoteRing::TakeCredit(uint64_t credit) noexcept {
  uint64_t known = tx_credit_.load(std::memory_order_acquire);
  if (credit <= known) return Took::kNothing;
  if (credit > failover_.published()) {
    SLIP_LOG(kWarn, "%s: the peer credited bytes never sent; resetting", names_.transport);
    Fail(EPROTO);
    return Took::kViolation;
  }
  while (credit > known &&
         !tx_credit_.compare_exchange_weak(known, credit, std::memory_order_acq_rel)) {
  }
  return credit > known ? Took::kMoved : Took::kNothing;
}

void RemoteRing::Hold(uint64_t nonce, uint64_t deadline_ms) noexcept {
  held_nonce_ = nonce;
  deadline_ms_ = deadline_ms;
  held_broken_.store(error_.exchange(0) != 0, std::memory_order_relaxed);
  gate_.Lower();
  failover_.Hold();
  settle_at_.store(deadline_ms, std::memory_order_release);
}

ChannelControl::Settlement RemoteRing::Settle(uint64_t now_ms, Reason* why) noexcept {
  {
    std::lock_guard<std::mutex> lock(failover_.lock());
    if (!held()) return Settlement::kSettled;
    const int anchor = failover_.anchor();
    if (anchor < 0) return Settlement::kPending;  // (not installed yet)
    const AnchorPeek peek = PeekAnchor(anchor);
    if (peek.Is(wire::Type::kConfirm)) {
      const wire::Confirm& confirm = peek.msg.confirm;
      const char* what = "another request's nonce";
      PeerCheck check = PeerCheck::kMismatch;
      if (confirm.nonce == held_nonce_ && confirm.ring_size == ring_size())
        check = ConfirmedPeer(now_ms, &what);
      if (check == PeerCheck::kWait) {
        settle_at_.store(now_ms + 1, std::memory_order_release);
        return Settlement::kPending;
      }
      if (check == PeerCheck::kMismatch) {
        // A client that confirmed another request than the one held here (the real one
        // lost to a forgery), or whose ring never came: it writes where nobody reads, so
        // the connection can be neither carried nor plain. (The gate keeps its CONFIRM
        // from the application; the caller resets the anchor.)
        SLIP_LOG(kWarn,
                 "%s: the client's CONFIRM does not match this connection's request (%s); "
                 "resetting it",
                 names_.transport, what);
        gate_.Trip();
        SettlePlainLocked(/*gated=*/true);
        Fail(ECONNRESET);
        return Settlement::kReset;
      }
      ConsumeAnchor(anchor, peek);
      failover_.Release();
      settle_at_.store(0, std::memory_order_release);
      OnSettledLocked();
    } else if (peek.kind == AnchorPeek::Kind::kMessage || peek.kind == AnchorPeek::Kind::kBytes ||
               peek.kind == AnchorPeek::Kind::kEnd) {
      // Bytes that are not a CONFIRM come from a plain client (whoever made the request
      // was not its client): they are the application's. EOF or an error: the application
      // sees it on TCP.
      SettlePlainLocked(/*gated=*/false);
      *why = plain_reason_;
      return Settlement::kPlain;
    } else if (held_broken_.load(std::memory_order_seq_cst)) {
      // The request's channel went away (a client that gave up) or broke the protocol: not
      // carried. (A CONFIRM may be partly here: gated.)
      SettlePlainLocked(/*gated=*/true);
      *why = Reason::kConnectSlow;
      return Settlement::kPlain;
    } else if (now_ms < deadline_ms_) {
      settle_at_.store(deadline_ms_, std::memory_order_release);
      return Settlement::kPending;  // the anchor's next bytes, or the deadline
    } else {
      SLIP_LOG(kInfo,
               "%s: no CONFIRM from the client of a requested connection in time; it "
               "continues on TCP",
               names_.transport);
      SettlePlainLocked(/*gated=*/true);
      *why = Reason::kHandshakeTimeout;
      return Settlement::kPlain;
    }
  }
  AfterSettled();
  return Settlement::kSettled;
}

void RemoteRing::AfterSettled() noexcept {
  // On the rings now. The rest posts and polls, which may ask for a failover (and so take
  // failover_.lock()): after the lock. What the application did while held (the same
  // race as CloseTx's, on the carriage):
  if (failover_.finished()) CloseTx();
  if (rx_close_wanted_.load(std::memory_order_seq_cst)) CloseRx();
  // A reader that went to sleep while held took nothing (held, there is nothing to read),
  // so the transport's wake-ups were never armed for it: a note that lands after this
  // would wake nobody. TakeArrivals arms them for an announced sleeper, and takes what is
  // here.
  TakeArrivals();
  if (const int b = proxy_b_.load(); b >= 0 && (rx_eof_.load() || error_.load()))
    sys::shutdown(b, SHUT_WR);
  // Whoever waited for space or bytes while held is owed a wake-up now, if there is
  // anything for them (a token for nothing would make an idle connection readable).
  WakeWriterNow();
  // (Pairs with WakeReaderIfSettled's fence.)
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (rx_produced_.load(std::memory_order_acquire) != failover_.consumed()) WakeReaderNow();
  // Confirmed, but its path broke meanwhile: the client is real, so the stream fails over
  // from where both ends stand (nothing was carried yet). Unless the break was the
  // client's orderly close: its EOF and CLOSED came, and its path went after them (a
  // client that connected, confirmed and closed at once).
  if (held_broken_.load(std::memory_order_seq_cst) &&
      !(rx_eof_.load(std::memory_order_acquire) && peer_closed_.load(std::memory_order_acquire)))
    TransportFailed(wire::FailoverCause::kTransportError);
}

void RemoteRing::SettlePlainLocked(bool gated) noexcept {
  // Nothing lands in our ring from here on: it is ours alone, and carries the TCP path
  // from byte 0 both ways.
  StopRequestLocked();
  if (gated) gate_.Raise();
  // A failure that raced with Hold was the request's, never this connection's.
  error_.store(0, std::memory_order_release);
  settle_at_.store(0, std::memory_order_release);
  failover_.EnterTcp(0, 0);
}

void RemoteRing::Fail(int error) noexcept {
  if (held()) {
    held_broken_.store(true, std::memory_order_seq_cst);  // (settling decides)
    return;
  }
  int expected = 0;
  if (!error_.compare_exchange_strong(expected, error)) return;
  SLIP_LOG(kDebug, "%s: connection failed (%s; eof %d, peer closed %d)", names_.transport,
           strerror(error), int(rx_eof_.load()), int(peer_closed_.load()));
  // Readers see the error after what already arrived; writers wake to it.
  if (const int b = proxy_b_.load(); b >= 0) {
    sys::shutdown(b, SHUT_WR);
    proxy::Unfill(b);
  }
}

uint64_t RemoteRing::RxProduced() const noexcept {
  switch (failover_.carriage()) {
    case Carriage::kHeld:
      return 0;
    case Carriage::kTcp:
      return failover_.Pull();  // (nothing is delivered before the gate opens)
    case Carriage::kTransport:
    case Carriage::kFailing:
      break;
  }
  TakeArrivals();
  return rx_produced_.load(std::memory_order_acquire);
}

void RemoteRing::RxConsumed(uint64_t consumed) noexcept {
  failover_.SetConsumed(consumed);
  if (failover_.carriage() != Carriage::kTransport) return;  // TCP has its own window
  if (consumed - credit_sent_ >= ring_size() / 4 && PostCredit(consumed)) credit_sent_ = consumed;
}

uint64_t RemoteRing::TxConsumed() const noexcept {
  switch (failover_.carriage()) {
    case Carriage::kHeld:
      return failover_.published() - ring_size();  // a full ring: nothing can be sent
    case Carriage::kTcp:
      return failover_.Push();  // the ring frees as the kernel takes its bytes
    case Carriage::kTransport:
    case Carriage::kFailing:
      break;
  }
  TakeArrivals();
  return tx_credit_.load(std::memory_order_acquire);
}

int RemoteRing::Error() const noexcept {
  if (held()) return 0;
  int error = error_.load(std::memory_order_acquire);
  if (error == 0 && failover_.on_tcp()) error = failover_.error();
  return error;
}

void RemoteRing::WakeReaderNow() const noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const int b = proxy_b_.load(std::memory_order_seq_cst);
  if (b >= 0 && proxy::TakeReaderAsk(&rx_wake_)) {
    proxy::WriteToken(&rx_wake_, b);
  } else if (b >= 0 && direct_readers_.load(std::memory_order_relaxed) != 0 &&
             rx_wake_.tokens.load(std::memory_order_relaxed) == 0) {
    // A reader asleep on the transport's descriptor whose event another thread took (the
    // progress thread, or another reader): its ppoll would not return for it, the proxy
    // wakes it.
    proxy::WriteToken(&rx_wake_, b);
  }
}

void RemoteRing::WakeReaderIfSettled() const noexcept {
  // (The fence pairs with AfterSettled's: one of the two sees the other's store.)
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!held()) WakeReaderNow();
}

void RemoteRing::WakeWriterNow() const noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const int b = proxy_b_.load(std::memory_order_seq_cst);
  if (b >= 0 && tx_wake_.writer_waiting.load(std::memory_order_relaxed) &&
      tx_wake_.writer_waiting.exchange(0))
    proxy::Unfill(b);
}

bool RemoteRing::MayDeliver() const noexcept {
  bool reset = false;
  const bool pass = gate_.Pass(failover_.anchor(), names_.transport, &reset);
  if (reset) const_cast<RemoteRing*>(this)->Fail(ECONNRESET);
  return pass;
}

bool RemoteRing::CanFailover() const noexcept {
  return failover_.anchor() >= 0 && PeerKnown() && !orphaned_.load(std::memory_order_acquire) &&
         !aborting_ && error_.load(std::memory_order_acquire) == 0;
}

void RemoteRing::TransportFailed(wire::FailoverCause cause) noexcept {
  RequestFailover(cause);
  MaybeFailover();
}

void RemoteRing::RequestFailover(wire::FailoverCause cause) noexcept {
  if (held()) {
    held_broken_.store(true, std::memory_order_seq_cst);
    return;
  }
  failover_cause_.store(cause, std::memory_order_relaxed);
  failover_wanted_.store(true, std::memory_order_release);
}

void RemoteRing::MaybeFailover() noexcept {
  if (!failover_wanted_.load(std::memory_order_acquire) ||
      failover_.carriage() != Carriage::kTransport)
    return;
  std::lock_guard<std::mutex> lock(failover_.lock());
  if (failover_.carriage() != Carriage::kTransport || error_.load(std::memory_order_acquire) != 0)
    return;
  if (!CanFailover()) {
    Fail(ECONNRESET);
    return;
  }
  if (AnchorGone()) {
    // The peer reset the connection (SO_LINGER {1, 0} closes its anchor before its
    // transport's path, or it died with bytes unread): its reset, not a failing transport.
    SLIP_LOG(kDebug, "%s: the path went down after the peer reset the connection",
             names_.transport);
    Fail(ECONNRESET);
    return;
  }
  if (!FailOverLocked(failover_cause_.load(std::memory_order_relaxed))) Fail(ECONNRESET);
}

bool RemoteRing::TakePeerFailover(int timeout_ms) noexcept {
  const int fd = failover_.anchor();
  wire::Failover peer;
  return fd >= 0 && ReceiveFailover(fd, timeout_ms, &peer) && OnPeerFailover(peer);
}

void RemoteRing::FinishOnAnchor() noexcept {
  const uint64_t published = failover_.published();
  if (failover_.carriage() == Carriage::kFailing && !TakePeerFailover(5000)) {
    // A peer that closed its TCP connection too (EOF or reset) has ended, as a TCP peer
    // that closes with bytes unread would: nothing is lost that it still wanted.
    uint8_t byte;
    const int fd = failover_.anchor();
    const bool peer_ended =
        AnchorGone() || (fd >= 0 && sys::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0);
    if (published != tx_credit_.load() && !peer_ended)
      SLIP_LOG(kWarn,
               "%s: closed during failover without the peer's answer: up to %llu bytes "
               "not confirmed as received",
               names_.transport, (unsigned long long)(published - tx_credit_.load()));
    return;
  }
  // Closing ends the stream (the last holder: these connections do not cross fork).
  if (failover_.on_tcp()) failover_.FinishOnClose(5000);
}

bool RemoteRing::FailOverLocked(wire::FailoverCause cause) noexcept {
  HaltLocked();
  if (!failover_.SendOurs(rx_produced_.load(std::memory_order_acquire), cause)) {
    // A peer that reset the connection meanwhile is gone, not a failure of ours to report.
    const LogLevel level =
        errno == ECONNRESET || errno == EPIPE ? LogLevel::kDebug : LogLevel::kWarn;
    if (LogEnabled(level))
      LogWrite(level, "%s: %s, and the TCP connection cannot take FAILOVER (%s); resetting",
               names_.transport, CauseText(cause), strerror(errno));
    return false;
  }
  SayContinuing(cause);
  // The peer answers with its own FAILOVER, which the control thread hands to
  // OnPeerFailover.
  return true;
}

bool RemoteRing::OnPeerFailover(const wire::Failover& peer) noexcept {
  if (failover_.anchor() < 0 || !PeerKnown() || orphaned_.load()) return false;
  // We resend from what the peer says it received, which is only so if no write of ours
  // landed after an earlier one failed (a note of the later one would claim the earlier
  // one's bytes). A hand-back follows no failure.
  if (peer.cause != wire::FailoverCause::kHandBack && !PeerCountTrusted()) return false;
  std::lock_guard<std::mutex> lock(failover_.lock());
  const Carriage carriage = failover_.carriage();
  if (error_.load(std::memory_order_acquire) != 0 ||
      (carriage != Carriage::kTransport && carriage != Carriage::kFailing))
    return false;
  if (carriage == Carriage::kTransport) {
    // The peer's path failed first (or it hands back): ours stops too, and our answer
    // says what it delivered.
    HaltLocked();
    if (peer.cause != wire::FailoverCause::kHandBack)
      SayContinuing(wire::FailoverCause::kPeerRequest);
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

bool RemoteRing::HandBack(uint64_t consumed, int timeout_ms) noexcept {
  if (failover_.anchor() < 0 || !PeerKnown() || orphaned_.load() || aborting_) return false;
  std::lock_guard<std::mutex> lock(failover_.lock());
  // After a failover the bytes the application did not read came over TCP already: they
  // cannot be given back to the anchor.
  if (failover_.carriage() != Carriage::kTransport || error_.load(std::memory_order_acquire) != 0)
    return false;
  // Whatever happens now, this end never speaks on the transport again (the new program
  // owns its bytes): no close notes, no failover of its own.
  aborting_ = true;
  HaltLocked();
  // What our last writes did not deliver is still in the send ring.
  return failover_.HandBack(consumed, tx_credit_.load(std::memory_order_acquire), timeout_ms);
}

bool RemoteRing::AnchorGone() const noexcept {
  const int fd = failover_.anchor();
  tcp_info info{};
  socklen_t len = sizeof(info);
  return fd >= 0 && sys::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
         info.tcpi_state == TCP_CLOSE;
}

const char* RemoteRing::CauseText(wire::FailoverCause cause) const noexcept {
  switch (cause) {
    case wire::FailoverCause::kPeerRequest:
      return "the peer's path failed";
    case wire::FailoverCause::kTransportError:
      return names_.failure;
    case wire::FailoverCause::kDeviceRemoved:
      return "the device went away";
    case wire::FailoverCause::kHandBack:
      return "the peer handed the connection back to TCP (exec)";
  }
  return "?";
}

void RemoteRing::SayContinuing(wire::FailoverCause cause) const noexcept {
  const LogLevel level = closing_.load() ? LogLevel::kInfo : LogLevel::kWarn;
  if (LogEnabled(level))
    LogWrite(level, "%s: %s: the connection continues on TCP (%llu bytes received over %s)",
             names_.transport, CauseText(cause),
             (unsigned long long)rx_produced_.load(std::memory_order_acquire), names_.path);
}

void RemoteRing::ResetStreamState() noexcept {
  auto reset = [](WakeState* wake) {
    wake->reader_waiting.store(0);
    wake->writer_waiting.store(0);
    wake->tokens.store(0);
  };
  reset(&rx_wake_);
  reset(&tx_wake_);
  rx_produced_.store(0);
  tx_credit_.store(0);
  rx_eof_.store(false);
  peer_closed_.store(false);
  credit_sent_ = 0;
  tx_posted_ = 0;
  eof_posted_.store(false);
  rx_close_wanted_.store(false);
  held_broken_.store(false);
  gate_.Lower();
  closing_.store(false);
  aborting_ = false;
  failover_wanted_.store(false);
  failover_.Reset();  // anchor, cursors, carriage
}

}  // namespace slip
