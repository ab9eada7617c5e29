// AnchorPath: a connection's byte stream carried on its TCP anchor after failover.
//
// When a transport fails mid-stream, both ends tell each other in FAILOVER messages on
// the anchor how many bytes they received over the transport (docs/DESIGN.md, "Failover").
// From then on the channel keeps its two rings and Stream keeps its cursors, but the rings
// are filled and drained over TCP: Pull reads the anchor into the receive ring, Push
// writes the send ring's unsent bytes into the anchor. Everything a sender published and
// the peer had not received is still in the send ring (the peer frees space only by
// crediting bytes it received), so nothing is lost and nothing is delivered twice; the
// application sees the same stream, slower.
//
// Thread safety: Pull and Push each serialise on their own lock, so the application's
// receiving and sending threads and the control thread (which reacts to the anchor's
// readiness) may call them concurrently. Nothing blocks except PushAll, which waits at
// most its timeout. The anchor must be non-blocking.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/wire.h"

namespace slip {

// What the bytes at the head of a connection's TCP socket are, looked at without consuming
// them and without waiting: the one place that peeks and parses our in-band messages.
struct AnchorPeek {
  enum class Kind : uint8_t {
    kMessage,  // a whole, valid message of ours: `msg`, `length` bytes on the wire
    kPartial,  // the start of one (our magic so far): the rest is on its way
    kBytes,    // bytes that are not a message of ours (`status` says why)
    kNone,     // nothing queued
    kEnd,      // EOF (`error` 0) or an error (`error`: the errno, e.g. ECONNRESET)
  };
  Kind kind = Kind::kNone;
  wire::Message msg;
  size_t length = 0;
  wire::ParseStatus status = wire::ParseStatus::kNeedMore;
  int error = 0;

  bool Is(wire::Type type) const noexcept { return kind == Kind::kMessage && msg.type == type; }
};
AnchorPeek PeekAnchor(int fd) noexcept;
// Consumes the message PeekAnchor found (its `length` bytes, already queued).
void ConsumeAnchor(int fd, const AnchorPeek& peek) noexcept;

// Sends one message whole as the anchor's next bytes (a short write continues: a message
// half written is a stream the peer cannot parse), waiting at most `timeout_ms` for room.
bool SendOnAnchor(int fd, const wire::Message& msg, int timeout_ms) noexcept;
// The client's CONFIRM (the first bytes of an accelerated connection).
bool SendConfirm(int fd, uint64_t nonce, uint32_t ring_size, int timeout_ms) noexcept;

// The FAILOVER exchange on the anchor. Both wait at most `timeout_ms` (0: no wait).
// Sends `failover` whole (a short write continues), or returns false.
bool SendFailover(int fd, const wire::Failover& failover, int timeout_ms) noexcept;
// Consumes one whole FAILOVER at the head of the anchor's bytes. False, consuming nothing,
// on anything else there (other bytes, EOF, an error) or when none came in time.
bool ReceiveFailover(int fd, int timeout_ms, wire::Failover* out) noexcept;

class AnchorPath {
 public:
  AnchorPath() = default;
  AnchorPath(const AnchorPath&) = delete;
  AnchorPath& operator=(const AnchorPath&) = delete;

  // Starts carrying the stream on `fd`: the receive ring continues at byte `rx_from` (what
  // this end received), the send ring at `tx_from` (what the peer received). `ring_size` is
  // a power of two; byte n of a direction lives at ring offset n % ring_size.
  void Start(int fd, uint8_t* rx_ring, const uint8_t* tx_ring, uint32_t ring_size, uint64_t rx_from,
             uint64_t tx_from) noexcept;
  bool started() const noexcept { return started_.load(std::memory_order_acquire); }

  // Reads what the anchor holds into the ring space before `consumed + ring_size`
  // (`consumed` may lag behind a value another caller already gave). Returns the receive
  // cursor (bytes of the stream now in the ring).
  uint64_t Pull(uint64_t consumed) noexcept;
  // Writes ring bytes before `published` that the kernel takes. Returns the send cursor
  // (bytes the kernel accepted; the ring space before it is free again). After Finish,
  // shuts the anchor's sending side once everything is written.
  uint64_t Push(uint64_t published) noexcept;
  // Like Push, waiting (poll) up to `timeout_ms` until everything is written. For a
  // closing connection, whose bytes must not stay behind in a ring that goes away.
  bool PushAll(uint64_t published, int timeout_ms) noexcept;
  // No byte will be published after `published`: the anchor's FIN follows the last one.
  void Finish(uint64_t published) noexcept;
  // Byte `offset` of the sent stream is urgent: the push sends it alone with MSG_OOB (TCP
  // marks the last byte of such a send). One mark, the latest, as TCP keeps. May come
  // before Start; a mark before the start's send cursor is forgotten.
  void MarkUrgent(uint64_t offset) noexcept;

  // The anchor's readiness while it carries the stream (`events` as epoll says them):
  // pulls what arrived (when `may_pull`) and pushes what is published before `published`.
  // Says whether bytes came in or went out, for the caller's wake-ups.
  struct Moved {
    bool received = false;
    bool sent = false;
  };
  Moved OnReady(uint32_t events, uint64_t consumed, uint64_t published,
                bool may_pull = true) noexcept;
  // Shows the stream's end on the application's proxy (`proxy_b`, its far end) as the
  // transport would have: EOF, or the error, for readers once the anchor says so; a wake-up
  // for writers once the peer stopped reading (or the error). Each once: every later read
  // of the ring would come here again. Nothing before the end.
  void ShowEnd(int proxy_b) const noexcept;

  uint64_t received() const noexcept { return rx_.load(std::memory_order_acquire); }
  uint64_t sent() const noexcept { return tx_.load(std::memory_order_acquire); }
  bool eof() const noexcept { return eof_.load(std::memory_order_acquire); }
  // The peer stopped reading (EPIPE): sends fail from now on.
  bool peer_closed() const noexcept { return peer_closed_.load(std::memory_order_acquire); }
  // An errno (ECONNRESET, ...) once the TCP connection itself failed; 0 otherwise.
  int error() const noexcept { return error_.load(std::memory_order_acquire); }

 private:
  uint64_t PushLocked(uint64_t published) noexcept;

  int fd_ = -1;
  uint8_t* rx_ring_ = nullptr;
  const uint8_t* tx_ring_ = nullptr;
  uint32_t mask_ = 0;
  std::atomic<bool> started_{false};

  std::mutex rx_mu_;
  std::mutex tx_mu_;
  std::atomic<uint64_t> rx_{0};
  std::atomic<uint64_t> tx_{0};
  std::atomic<bool> eof_{false};
  std::atomic<bool> peer_closed_{false};
  std::atomic<int> error_{0};
  mutable std::atomic<bool> rx_end_shown_{false};  // ShowEnd: the proxy shut for readers
  mutable std::atomic<bool> tx_end_shown_{false};  // ShowEnd: writers woken
  bool finish_ = false;                            // under tx_mu_
  uint64_t final_ = 0;                             // under tx_mu_
  bool shut_ = false;                              // under tx_mu_
  uint64_t urgent_end_ = 0;  // under tx_mu_: the urgent byte's offset + 1 (0: none)
};

}  // namespace slip
