// RemoteRing: what every channel whose sender writes into the peer's registered ring
// shares (verbs over RC queue pairs, fabric over libfabric's RMA writes): the stream's
// cursors and ends as the peer's notes say them, the continue-on-anchor (AnchorFailover),
// and settling a server's connection that is held until its client proves, in band, that
// it made the request. A transport derives its channel from this and supplies what its
// device alone knows: posting writes and credits, taking its completions, halting.
//
// A transport whose path retransmits (one that carries the bytes in packets of its own
// rather than as one-sided writes) fits the same hooks: PostData(from, to) sends the ring's
// bytes [from, to), which stay in the send ring until the peer's credit says they were
// consumed, so a resend reads them from there (no copy of its own); its receiver places
// what arrived in order into the ring and hands the new cursor to TakeProduced, where a
// duplicate or a stale one is kNothing. Halting means the path delivers nothing more, and
// PeerCountTrusted says whether a failover may trust the peer's count.
//
// Settling (docs/DESIGN.md, "Settling a connection"). A listener's request names the TCP
// 4-tuple it is for, but anybody who can reach the listener can name any tuple: until the
// TCP connection's client proves, in band, that it made the request (its CONFIRM carries
// the request's nonce), the request's channel is not this connection's. So accept()
// installs the connection *held*: the application has it at once, and sees no bytes and no
// space; nothing the request's channel does reaches it. The client's first bytes on TCP
// decide:
//
//   CONFIRM(nonce) of the request, its ring known  -> the rings carry the stream
//   other bytes, EOF, an error                      -> TCP from byte 0 (a plain client)
//   the request's channel fails                     -> TCP from byte 0, gated
//   nothing by the deadline                         -> TCP from byte 0, gated
//   a CONFIRM of another nonce, or no ring for it   -> reset (neither path is safe)
//
// "Gated": no byte of the client has been seen, and a real client may yet be late with its
// CONFIRM, which must never be delivered as data. The first bytes that arrive are looked at
// before any is delivered (SettleGate): a CONFIRM there resets the connection. A plain
// client's bytes pass. So a forged request costs a plain client at most a wait for its
// first bytes from the server (a server that speaks first), never its connection, and
// costs accept() nothing.
//
// Thread safety: the Channel contract for the data path; settling and the carriage's
// switches run under failover_.lock() (the control thread, the progress thread, the
// application's close).
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "core/channel.h"
#include "core/channel_control.h"
#include "core/config.h"
#include "core/failover.h"
#include "core/settle_gate.h"
#include "core/stats.h"
#include "core/wire.h"

namespace slip {

class RemoteRing : public Channel, public ChannelControl, protected AnchorFailover::Ends {
 public:
  // What the log lines and the stats call the transport.
  struct Names {
    TransportKind kind;
    const char* transport;  // "verbs"
    const char* path;       // what carries its bytes: "RDMA"
    const char* failure;    // what fails when it fails: "the queue pair failed"
  };

  // --- settling a server's connection ---
  // Listener, before the proxy is set: the request whose 4-tuple the accepted TCP
  // connection has is installed held until that connection's client proves it made the
  // request (a CONFIRM with `nonce`); Settle decides by `deadline_ms`. A failure of the
  // request's channel before now is the request's, not the connection's (which may yet be
  // plain): it only marks the request broken.
  void Hold(uint64_t nonce, uint64_t deadline_ms) noexcept;
  bool held() const noexcept { return failover_.held(); }

  // Marks the channel failed for good and wakes every sleeper (setup failures, protocol
  // violations: no failover). Held, a failure is the request's, not the connection's
  // client's: it only marks the request broken, and settling decides.
  void Fail(int error) noexcept;
  // After fork, in the child: the device's objects are the parent's, never touched again;
  // the stream fails (ECONNRESET).
  void Orphan() noexcept;
  // The local proxy end that receives tokens and fill drains (owned from now on).
  void SetProxy(int proxy_b) noexcept;
  // The transport's path failed: the stream fails over to the anchor when it can (the
  // peer's ring was known, the anchor is there, the application did not abort, the peer
  // did not reset it), else the channel fails (ECONNRESET). Held, the failure is the
  // request's: it only marks the request broken. Not under a lock that halting takes
  // (HaltLocked): there, RequestFailover.
  void TransportFailed(wire::FailoverCause cause) noexcept;

  // --- Channel: the cursors, as the carriage has them ---
  // On the transport, the peer's notes (taken first); on TCP, the anchor's stream; held,
  // nothing: no bytes and a full ring.
  uint64_t RxProduced() const noexcept override;
  // Credits the peer every quarter ring (a sender waits only on a full ring, and a reader
  // that wants more must first empty it, so the two never wait on each other).
  void RxConsumed(uint64_t consumed) noexcept override;
  uint64_t TxConsumed() const noexcept override;
  // The carriage's dispatch: on the transport, PostData and PostEnd; on TCP, failing or
  // held, AnchorFailover (core/failover.h), which pushes to the anchor, resends from where
  // the peer says once it says, or leaves it to settling.
  void TxPublish(uint64_t produced) noexcept final;
  void CloseTx() noexcept final;
  // The ends, as the peer's notes say them; on TCP, the anchor's; held, neither. The
  // reader's end is taken from the transport's completions first where nobody else takes
  // them (a sender's look costs nothing: it is asked on every send).
  bool RxEof() const noexcept override;
  bool TxPeerClosed() const noexcept override;
  int Error() const noexcept override;
  TransportKind kind() const noexcept override { return names_.kind; }
  // The peer's cursors were out of range (core/stream.cc): the connection fails.
  void OnPeerViolation() noexcept override { Fail(EPROTO); }
  WakeState* RxWake() noexcept override { return &rx_wake_; }
  WakeState* TxWake() noexcept override { return &tx_wake_; }
  ChannelControl* control() noexcept override { return this; }

  // --- ChannelControl ---
  void Abort() noexcept override { aborting_ = true; }
  void SetAnchor(int fd) noexcept override { failover_.SetAnchor(fd); }
  void OnAnchorReady(uint32_t events) noexcept override { failover_.OnAnchorReady(events); }
  AnchorFailover* failover() noexcept override { return &failover_; }
  // (Held, the anchor's bytes are the client's, for settling alone.)
  bool AnchorCarriesStream() const noexcept override {
    const Carriage carriage = failover_.carriage();
    return carriage == Carriage::kTcp || carriage == Carriage::kHeld;
  }
  // A fork child's copy fails at once (the device's objects are the parent's): never
  // shared.
  bool SharedWithOtherProcess() const noexcept override { return false; }
  uint64_t SettleDeadline() const noexcept override {
    return settle_at_.load(std::memory_order_acquire);
  }
  Settlement Settle(uint64_t now_ms, Reason* why) noexcept override;
  // The peer's FAILOVER (its path failed, or it hands back at exec): ours stops too, and
  // our answer says what it delivered (core/failover.h has the exchange).
  bool OnPeerFailover(const wire::Failover& peer) noexcept override;
  bool HandBack(uint64_t consumed, int timeout_ms) noexcept override;

 protected:
  RemoteRing(const Names& names, uint32_t ring_size) noexcept;
  ~RemoteRing() override = default;

  // --- what the transport alone knows ---
  // The client's CONFIRM names the held request and its ring size: is the request's side
  // ready to carry the stream? kReady (the peer's ring is known: the rings carry it from
  // now on; a path that broke meanwhile marks held_broken_, and the stream fails over once
  // settled), kWait (it may be in flight: Settle looks again in a millisecond), or
  // kMismatch (it never will be: the connection is reset; *what says why, for the log).
  enum class PeerCheck : uint8_t { kReady, kWait, kMismatch };
  virtual PeerCheck ConfirmedPeer(uint64_t now_ms, const char** what) noexcept = 0;
  // Under failover_.lock(): the carriage leaves the transport (AnchorFailover::Begin),
  // nothing lands in our ring from here on, and what arrived so far (rx_produced_) is
  // what we received.
  virtual void HaltLocked() noexcept = 0;
  // Under failover_.lock(), settling as plain: halts, and the request's peer learns it
  // where the transport can say so.
  virtual void StopRequestLocked() noexcept { HaltLocked(); }
  // Whether the peer's ring is known: without it nothing ran on the transport, and there
  // is nothing to fail over or hand back.
  virtual bool PeerKnown() const noexcept { return true; }
  // Whether the count of our bytes in the peer's FAILOVER can be trusted (a transport
  // whose later writes may land after an earlier one failed cannot always say). False:
  // the transport failed the channel, and said why.
  virtual bool PeerCountTrusted() noexcept { return true; }
  // Takes what the transport's completions hold now (and arms its wake-ups for a sleeper).
  virtual void TakeArrivals() const noexcept = 0;
  // Sends the peer a credit note for `consumed`. False when it could not be posted (the
  // next consumption tries again).
  virtual bool PostCredit(uint64_t consumed) noexcept = 0;
  // Sender thread, on the transport: writes the ring's bytes [from, to) into the peer's
  // ring and the note that says `to`. False when not all of it went (the next publish
  // posts from `from` again, or the failover that a refusal asked for resends).
  virtual bool PostData(uint64_t from, uint64_t to) noexcept = 0;
  // The end of our stream (EOF after tx_posted_), once.
  virtual void PostEnd() noexcept = 0;
  // Settled on the rings, under failover_.lock().
  virtual void OnSettledLocked() noexcept {}
  // SetProxy ran: `live` when the stream carries on the transport from now on (not held).
  virtual void OnProxySet(bool live) noexcept { (void)live; }

  // The peer's notes: a cursor into rx_produced_ (its data, its end) or tx_credit_ (its
  // credit, its CLOSED), which only move forward. Moved by this note; not (stale: another
  // poller took a later one, or no further than known); or the peer broke the protocol
  // (a cursor past what the ring holds, a credit for bytes never sent: the connection
  // failed, said in the log).
  enum class Took : uint8_t { kMoved, kNothing, kViolation };
  Took TakeProduced(uint64_t produced) noexcept;
  Took TakeCredit(uint64_t credit) noexcept;
  bool on_transport() const noexcept { return failover_.on_transport(); }
  // A thread waits through the proxy (a reader in poll or epoll, a writer for room): the
  // progress thread must take the transport's completions for it.
  bool SomebodyWaitsOnProxy() const noexcept {
    return rx_wake_.reader_waiting.load(std::memory_order_relaxed) != 0 ||
           tx_wake_.writer_waiting.load(std::memory_order_relaxed) != 0;
  }

  // --- settling, for the transport's own ways to settle ---
  // Under failover_.lock(): the stream goes to TCP from byte 0 (StopRequestLocked first).
  // `gated`: nothing was read from the client yet, and its first bytes are looked at
  // before they are delivered (MayDeliver).
  void SettlePlainLocked(bool gated) noexcept;
  // Settled on the rings (after the lock): what the application did while held, and the
  // wake-ups it is owed.
  void AfterSettled() noexcept;
  bool MayDeliver() const noexcept override;

  // --- failover, for the transport's own ways to fail over ---
  // A failure noticed where halting cannot run (under the transport's poll lock): kept
  // for MaybeFailover, which the transport calls once it let go of that lock.
  void RequestFailover(wire::FailoverCause cause) noexcept;
  void MaybeFailover() noexcept;
  // The stream may still move to the anchor: it is there, the peer's ring was known, and
  // nothing ended the channel (an error, an abortive close, a fork child's copy).
  bool CanFailover() const noexcept;
  // Under failover_.lock(): halts and sends our FAILOVER (what we received) on the anchor,
  // with the log line. False when the anchor cannot take it: the caller resets.
  bool FailOverLocked(wire::FailoverCause cause) noexcept;
  // The anchor was reset or closed for good: the peer is gone, not the transport. (From
  // TCP_INFO: a peek or SO_ERROR would take the pending ECONNRESET from the control
  // thread, which reports it to the application.)
  bool AnchorGone() const noexcept;
  // Takes a FAILOVER the peer sent on the anchor, waiting up to `timeout_ms` (only when
  // nobody else reads the anchor: the control thread no longer watches it, as at close).
  bool TakePeerFailover(int timeout_ms) noexcept;
  // Closing after failover (the last holder): the peer's FAILOVER if still missing, then
  // every byte out on the anchor.
  void FinishOnAnchor() noexcept;
  // The log line of a stream that continues on TCP for `cause` (at info while the
  // application closes: then the outcome is what matters).
  void SayContinuing(wire::FailoverCause cause) const noexcept;

  // A transport that carries another stream on the same channel (verbs' reused queue
  // pairs): the stream's state back to a new connection's (cursors, ends, wake-ups,
  // settling, the carriage and the anchor). Only once nothing of the old stream can
  // arrive any more.
  void ResetStreamState() noexcept;

  // Wakes a reader: through the proxy when it asked, or one asleep on the transport's own
  // descriptor (direct_readers_) whose event another thread took.
  void WakeReaderNow() const noexcept override;
  // The peer's bytes moved the cursor. Held, they are not the application's yet: settling
  // wakes the reader once, for all of them (a token now and another then would be two
  // edges for one arrival).
  void WakeReaderIfSettled() const noexcept;
  void WakeWriterNow() const noexcept override;

  // What `cause` means, for the log.
  const char* CauseText(wire::FailoverCause cause) const noexcept;

  const Names names_;
  // B of the application's proxy: set once the stream exists, while the progress thread
  // may already be taking the peer's notes and reading it to wake a reader.
  std::atomic<int> proxy_b_{-1};
  bool aborting_ = false;             // SO_LINGER {1, 0}: no orderly notes at close
  std::atomic<bool> closing_{false};  // the application let go: its close is under way
  std::atomic<bool> orphaned_{false};

  // The peer's notes as taken (by whoever polls: hence mutable where polling is a const
  // read): its published cursor, its credit (what it consumed of ours), its ends, and the
  // channel's failure.
  mutable WakeState rx_wake_{};
  mutable WakeState tx_wake_{};
  mutable std::atomic<uint64_t> rx_produced_{0};
  mutable std::atomic<uint64_t> tx_credit_{0};
  mutable std::atomic<bool> rx_eof_{false};
  mutable std::atomic<bool> peer_closed_{false};
  mutable std::atomic<int> error_{0};
  // Readers asleep on the transport's own descriptor (Channel::BeginRxSleep).
  mutable std::atomic<uint32_t> direct_readers_{0};
  // Receiver thread only: the last credit sent. Sender thread only: what was posted.
  uint64_t credit_sent_ = 0;
  uint64_t tx_posted_ = 0;
  std::atomic<bool> eof_posted_{false};  // CloseTx's end note went (once)

  // Settling: held (the carriage) until the CONFIRM; settle_at_ is when Settle must run
  // next (0: settled), deadline_ms_ when it must decide. held_broken_: the request's
  // channel failed or broke the protocol while held (plain, or a failover once confirmed).
  std::atomic<bool> held_broken_{false};
  std::atomic<uint64_t> settle_at_{0};
  uint64_t held_nonce_ = 0;
  uint64_t deadline_ms_ = 0;
  std::atomic<bool> rx_close_wanted_{false};  // CloseRx while held
  // Why bytes that are not a CONFIRM make the connection plain.
  Reason plain_reason_ = Reason::kPeerNotSlipstream;
  SettleGate gate_;  // MayDeliver has not seen the first bytes yet

  // RequestFailover's, for MaybeFailover.
  std::atomic<bool> failover_wanted_{false};
  std::atomic<wire::FailoverCause> failover_cause_{wire::FailoverCause::kTransportError};

  // The carriage, the anchor, this end's own cursors (published, consumed, finished) and
  // the stream on TCP after failover.
  AnchorFailover failover_;
};

}  // namespace slip
