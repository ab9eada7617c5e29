// The channel: what a transport provides to the data path of one accelerated connection,
// and nothing else (how a connection is set up is core/transport.h; its settling, failover
// and hand-back core/channel_control.h).
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

class ChannelControl;

class Channel {
 public:
  virtual ~Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  virtual TransportKind kind() const noexcept = 0;
  // What carries the transport, for the stats, where it has a choice (fabric: the
  // libfabric provider, "tcp;ofi_rxm"); null for the others.
  virtual const char* provider() const noexcept { return nullptr; }
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
  // Whether what arrives after a token shows without a new ask: the peer publishes and ends
  // the stream itself (shm: into our ring, onto our proxy). A transport whose arrivals are
  // taken in only while someone asks (verbs: an ask is what makes its completions
  // polled) is armed again before every sleep (core/rearm_list.h).
  virtual bool ShowsArrivalsWithoutAsk() const noexcept { return true; }
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

  // --- the end of each direction ---
  // Marks our sending side finished (EOF for the peer) and wakes the peer.
  virtual void CloseTx() noexcept = 0;
  // Marks that we will read no more, and wakes a peer sender that waits for space.
  virtual void CloseRx() noexcept = 0;
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

  // --- everything else (core/channel_control.h) ---
  // The connection's control side: settling, failover, hand-back, fork, abortive close.
  // Never called on the data path. A channel without any keeps the defaults.
  virtual ChannelControl* control() noexcept;
  // The stream is done with the channel (Stream's destructor calls this). By default it is
  // deleted; a transport whose resources outlive the stream takes it back instead (verbs
  // keeps the queue pair for the next connection: docs/DESIGN.md "Reusing queue pairs").
  virtual void Destroy() noexcept { delete this; }

 protected:
  explicit Channel(uint32_t ring_size) noexcept : ring_size_(ring_size) {}

 private:
  uint32_t ring_size_;
};

}  // namespace slip
