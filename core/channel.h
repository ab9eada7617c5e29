// The transport interface: what a transport provides for one accelerated connection.
//
// core/ owns stream semantics (ordering, EOF, blocking, readiness); a Channel only moves
// bytes between the two rings of one connection and tells the other side about it.
// Each direction is an SMC-R style ring owned by its receiver and written by its sender:
// the sender tracks `produced`, the receiver `consumed`, both 64-bit byte counts, and
// free space is size - (produced - consumed).
//
// Contract: a Channel is used by at most one sending thread and one receiving thread at a
// time (Stream serialises each side); the Rx* and Tx* halves may run concurrently.
// Nothing here blocks or allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/config.h"
#include "core/proxy.h"
#include "core/stats.h"
#include "core/wire.h"

namespace slip {

class Channel {
 public:
  virtual ~Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  virtual TransportKind kind() const noexcept = 0;
  uint32_t ring_size() const noexcept { return ring_size_; }

  // --- receive side: the local ring that the peer writes ---
  // Bytes the peer has published so far (acquire: the data before it is visible).
  virtual uint64_t RxProduced() const noexcept = 0;
  // The receive ring's bytes (ring_size long).
  virtual const uint8_t* RxData() const noexcept = 0;
  // Returns credits: the receiver has consumed everything before `consumed`. Wakes a
  // sender that is waiting for space.
  virtual void RxConsumed(uint64_t consumed) noexcept = 0;
  // The peer closed its sending side (after its last publish).
  virtual bool RxEof() const noexcept = 0;
  // The local reader is about to sleep: ask for a token on the next publish.
  virtual WakeState* RxWake() noexcept = 0;
  // Non-zero (an errno, e.g. ECONNRESET) once the transport itself failed: bytes in
  // flight may be lost, so the stream reports a reset after what was already received.
  // The transport wakes every sleeper when it fails.
  virtual int Error() const noexcept { return 0; }

  // --- send side: the peer's ring ---
  // Credits: the peer has consumed everything before this count.
  virtual uint64_t TxConsumed() const noexcept = 0;
  // Copies `len` bytes to ring offset `offset` (already reduced modulo ring_size, and not
  // crossing the end of the ring: the caller splits at the wrap).
  virtual void TxCopy(uint32_t offset, const void* src, size_t len) noexcept = 0;
  // Makes everything before `produced` visible to the peer, waking it if it sleeps.
  virtual void TxPublish(uint64_t produced) noexcept = 0;
  // The peer will not read any more (closed): sends fail with EPIPE.
  virtual bool TxPeerClosed() const noexcept = 0;
  virtual WakeState* TxWake() noexcept = 0;

  // --- lifetime ---
  // Marks our sending side finished (EOF for the peer) and wakes the peer.
  virtual void CloseTx() noexcept = 0;
  // Marks that we will read no more, and wakes a peer sender that waits for space.
  virtual void CloseRx() noexcept = 0;
  // The application closes abortively (SO_LINGER {1, 0}): the channel, when destroyed,
  // must not tell the peer an orderly end; the peer sees the reset.
  virtual void Abort() noexcept {}
  // The stream is done with the channel (Stream's destructor calls this). By default it is
  // deleted; a transport whose resources outlive the stream takes it back instead (verbs
  // keeps the queue pair for the next connection: docs/DESIGN.md "Reusing queue pairs").
  virtual void Destroy() noexcept { delete this; }

  // --- failover (docs/DESIGN.md, "Failover") ---
  // A transport that can fail mid-stream continues on the connection's TCP anchor: both
  // ends send FAILOVER (bytes received) there, then carry the stream on TCP from those
  // offsets. Channels that never fail that way keep these defaults.
  // The anchor (non-blocking), once the stream is installed; the channel does not own it.
  virtual void SetAnchor(int fd) noexcept { (void)fd; }
  // Control thread: the peer's FAILOVER arrived (how much of our stream it received, how
  // much of its own it had sent). Answers with our own FAILOVER if we had not sent one.
  // Returns false when the stream cannot continue (the caller then treats the peer as gone
  // with a reset).
  virtual bool OnPeerFailover(const wire::Failover& peer) noexcept {
    (void)peer;
    return false;
  }
  // True once the anchor carries the stream's bytes (no more messages): its readiness
  // (EPOLLIN/EPOLLOUT/...) then goes to OnAnchorReady, from the control thread.
  virtual bool AnchorCarriesStream() const noexcept { return false; }
  virtual void OnAnchorReady(uint32_t events) noexcept { (void)events; }

  // --- hand-back (exec) ---
  // The process is about to exec with this connection's descriptor: the new image knows
  // nothing of rings, so the stream goes back to the anchor for good. `consumed` is what
  // the application read. Sends FAILOVER (cause kHandBack, received = `consumed`), takes
  // the peer's answer and writes onto the anchor what the peer did not receive, all within
  // `timeout_ms`. True when the anchor now carries the stream exactly: in from byte
  // `consumed`, out after the last byte published (EOF following it if the sending side
  // was closed). False leaves the connection unusable. The caller stopped the control
  // thread's watch on the anchor first.
  virtual bool HandBack(uint64_t consumed, int timeout_ms) noexcept {
    (void)consumed;
    (void)timeout_ms;
    return false;
  }
  // True while another process also holds this end of the connection (fork): a hand-back
  // would take the stream from under it.
  virtual bool SharedWithOtherProcess() const noexcept { return true; }
  // In a fork child, for each inherited connection: the child is one more holder.
  virtual void AfterForkChild() noexcept {}

  // --- settling (docs/DESIGN.md, "Settling a connection") ---
  // A connection may be installed before its two ends agreed that it uses the transport:
  // a client whose listener has not answered its registration yet, a server whose client's
  // CONFIRM has not arrived when the application accepts. Neither may wait for the other
  // inside connect() or accept(). Until settled, the channel keeps the stream safe on its
  // own terms (a server's shows no bytes and no space), and the control thread calls Settle
  // whenever the anchor or SettleFd() has news, and at SettleDeadline().
  enum class Settlement : uint8_t {
    kSettled,  // the transport carries the stream
    kPending,  // not yet: call again on news or at the deadline
    kPlain,    // the stream continues on the TCP anchor from here (as after a failover;
               // its readiness goes to OnAnchorReady), for the reason in *why
    kReset,    // neither is safe: the connection must be reset
  };
  // CLOCK_MONOTONIC milliseconds by which the connection must be settled; 0 once settled.
  virtual uint64_t SettleDeadline() const noexcept { return 0; }
  // A descriptor besides the anchor whose readiness to read may settle it, or -1.
  virtual int SettleFd() const noexcept { return -1; }
  // Tries to settle without blocking. At or past the deadline it decides.
  virtual Settlement Settle(uint64_t now_ms, Reason* why) noexcept {
    (void)now_ms;
    (void)why;
    return Settlement::kSettled;
  }
  // The stream found the peer breaking the ring protocol (a cursor out of range): the
  // transport ends the connection in a way the peer notices (shm: resets the anchor).
  virtual void OnPeerViolation() noexcept {}

  // --- direct sleep (optional) ---
  // A transport whose news arrive on a descriptor of its own (verbs: the connection's
  // completion channel) lets a blocking recv sleep on it next to the proxy, woken by the
  // kernel itself rather than by a token that another thread writes. BeginRxSleep announces
  // the sleeper (before it checks for bytes one last time) and returns the descriptor, or -1
  // when the reader must sleep on the proxy as usual; EndRxSleep withdraws it and, when the
  // descriptor woke it (`woken`), takes what woke it. Every other wake-up (EOF, error,
  // shutdown, peer gone) still comes through the proxy.
  virtual int BeginRxSleep() noexcept { return -1; }
  virtual void EndRxSleep(bool woken) noexcept { (void)woken; }

 protected:
  explicit Channel(uint32_t ring_size) noexcept : ring_size_(ring_size) {}

 private:
  uint32_t ring_size_;
};

}  // namespace slip
