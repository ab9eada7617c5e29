// AnchorFailover: continue-on-anchor, written once for every transport.
//
// A connection keeps its TCP socket (the anchor) for its whole life. When its transport
// fails mid-stream, or a process hands the connection back to plain TCP (exec), both ends
// move the stream onto the anchor without losing or repeating a byte (docs/DESIGN.md,
// "Failover"):
//
//   1. The end that starts stops its transport, so that nothing more lands in its receive
//      ring, counts what it received and sends FAILOVER {received, sent} on the anchor
//      (Begin: carriage kFailing; bytes published meanwhile wait in the ring).
//   2. The other end, on that FAILOVER, stops its own transport the same way, checks the
//      counts against its own and answers with its FAILOVER (OnPeerFailover).
//   3. Each end, once it has the peer's counts, carries the stream on the anchor from there:
//      receiving from what it received, resending from what the peer received (kTcp, for
//      good). Whatever the peer did not receive is still in the send ring, because ring
//      space is freed only by the peer's credit.
//
// A hand-back (exec) is the same exchange, its leaving end never continuing (HandBack). A
// server connection that settles as plain TCP (its client was not the transport's, or said
// nothing in time) enters kTcp from byte 0 without any exchange (EnterTcp).
//
// Division of labour: the transport's channel knows how to stop its transport and what it
// received and credited over it, and how to wake its own sleepers (Ends); this class keeps
// which path carries the stream (the carriage), the end's own cursors (what it published,
// what the application consumed, whether it finished sending), the exchange, and the
// stream on TCP afterwards (AnchorPath).
//
// Thread safety: the data-path calls (Publish, FinishTx, SetConsumed, Pull, Push, the
// accessors) take no lock and may race with a switch: a publish or finish racing with
// EnterTcp is pushed by one of the two, because each side writes its own variable before it
// reads the other's, all sequentially consistent. The switching calls (Begin, SendOurs,
// OnPeerFailover, EnterTcp, HandBack, Release) run under lock(), which the channel also
// holds while it settles; Hold comes before the connection is shared.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "core/anchor_path.h"
#include "core/wire.h"

namespace slip {

// Which path carries a connection's stream.
enum class Carriage : uint8_t {
  kHeld,       // a server's connection before its client's CONFIRM: no bytes, no space
  kTransport,  // the transport's rings
  kFailing,    // this end's FAILOVER is out and the peer's is not in: bytes wait in the ring
  kTcp,        // the anchor (AnchorPath), for good
};

class AnchorFailover {
 public:
  // What only the channel can do.
  class Ends {
   public:
    // Wakes a reader asleep on the transport's wake-up (bytes arrived, or the end).
    virtual void WakeReaderNow() const noexcept = 0;
    // Wakes a writer asleep on a full ring (space, or the end).
    virtual void WakeWriterNow() const noexcept = 0;
    // Whether the anchor's next bytes may go to the application: a connection that went
    // plain before seeing any byte of its client looks at the first ones first.
    virtual bool MayDeliver() const noexcept { return true; }

   protected:
    ~Ends() = default;
  };

  // `transport` names the transport in log lines; `ring_size`, a power of two, is both
  // rings'. The carriage starts as kTransport.
  AnchorFailover(const char* transport, Ends* ends, uint32_t ring_size) noexcept
      : transport_(transport), ends_(ends), ring_size_(ring_size) {}
  AnchorFailover(const AnchorFailover&) = delete;
  AnchorFailover& operator=(const AnchorFailover&) = delete;

  // --- set-up (before the connection is shared, except SetAnchor: see its comment)
  // The anchor, non-blocking. May be set after the channel is made (verbs installs the
  // channel first); the exchange needs it, the data path does not.
  void SetAnchor(int fd) noexcept { anchor_.store(fd, std::memory_order_release); }
  int anchor() const noexcept { return anchor_.load(std::memory_order_acquire); }
  // The receive ring and the send ring (whose bytes at offset n % ring_size are byte n of
  // what this end published). Rings may be replaced before EnterTcp, under lock().
  void SetRings(uint8_t* rx_ring, const uint8_t* tx_ring) noexcept {
    rx_ring_ = rx_ring;
    tx_ring_ = tx_ring;
  }
  // B of the stream's own proxy: where the stream's end shows once TCP carries it.
  void SetOwnProxy(int own_b) noexcept { own_b_ = own_b; }
  // A reused transport connection starts a new stream: kTransport, cursors at zero.
  void Reset() noexcept;

  // --- which path carries the stream
  // (Sequentially consistent: settling's Release is ordered against the data path's
  // "wanted while held" flags this way.)
  Carriage carriage() const noexcept { return carriage_.load(std::memory_order_seq_cst); }
  bool held() const noexcept { return carriage() == Carriage::kHeld; }
  bool on_tcp() const noexcept { return carriage() == Carriage::kTcp; }
  // Held or kTransport: the transport's rings are the stream's (or will be, once settled).
  bool on_transport() const noexcept {
    const Carriage c = carriage();
    return c == Carriage::kHeld || c == Carriage::kTransport;
  }
  std::mutex& lock() noexcept { return mu_; }
  // A server's connection until its client confirmed (settling); Release when it did.
  void Hold() noexcept { carriage_.store(Carriage::kHeld, std::memory_order_seq_cst); }
  // (A WINDOW announced while held goes out here: the anchor is known to carry messages.)
  void Release() noexcept;

  // --- this end's own cursors (never read back from anything the peer can write)
  uint64_t published() const noexcept { return published_.load(std::memory_order_seq_cst); }
  uint64_t consumed() const noexcept { return consumed_.load(std::memory_order_acquire); }
  bool finished() const noexcept { return finished_.load(std::memory_order_seq_cst); }
  void SetConsumed(uint64_t consumed) noexcept {
    consumed_.store(consumed, std::memory_order_release);
  }
  // The stream's `produced` after a publish; a full fence follows the store. Returns the
  // carriage as read after it: on kTcp the bytes went to the anchor here; on kTransport
  // (or kHeld) the transport sends them; on kFailing they wait for the peer's counts.
  Carriage Publish(uint64_t produced) noexcept;
  // The application finished sending (FIN after the last byte). Returns the carriage as
  // read after it, as Publish.
  Carriage FinishTx() noexcept;

  // --- the stream on TCP (carriage kTcp)
  // Reads what the anchor holds into the receive ring; returns the receive cursor. Shows
  // the stream's end on the own proxy once the anchor says it.
  uint64_t Pull() const noexcept;
  // Writes what is published and not yet taken by the kernel; returns the send cursor
  // (bytes before it are free ring space again).
  uint64_t Push() const noexcept { return path_.Push(published()); }
  bool eof() const noexcept { return path_.eof(); }
  bool peer_closed() const noexcept { return path_.peer_closed(); }
  int error() const noexcept { return path_.error(); }
  // The anchor's readiness (the control thread): moves bytes both ways, wakes whoever
  // waits for them, shows the end. Nothing unless on kTcp.
  void OnAnchorReady(uint32_t events) const noexcept;
  // Closing on kTcp: every published byte to the anchor, then its FIN, within
  // `timeout_ms`. False (logged) when bytes stayed behind.
  bool FinishOnClose(int timeout_ms) noexcept;
  // Bytes to the anchor within `timeout_ms` (a flush before fork or exit).
  bool PushAll(int timeout_ms) noexcept { return path_.PushAll(published(), timeout_ms); }

  // --- switching, under lock()
  // The transport is being stopped: bytes published from here on wait. (kHeld stays: a
  // held connection's bytes were never the stream's.)
  void Begin() noexcept;
  // Our FAILOVER {received, published} with `cause`, once the transport is stopped and
  // `received` (bytes it delivered into the receive ring) counted. False when the anchor
  // cannot take it (errno says why).
  bool SendOurs(uint64_t received, wire::FailoverCause cause) noexcept;

  enum class Outcome : uint8_t {
    kContinued,   // on TCP from where both ends stand
    kMisfit,      // the peer's counts contradict this end's (logged): neither path is safe
    kUnanswered,  // the anchor did not take our answer (logged)
  };
  // The peer's FAILOVER. If ours is not out yet (the peer started), the transport must be
  // stopped already and `received` counted: the counts are checked, our answer sent, and
  // the stream continues on TCP. If ours is out, `received` is ignored (ours said it).
  // `credited`: the bytes the peer acknowledged over the transport.
  Outcome OnPeerFailover(const wire::Failover& peer, uint64_t received, uint64_t credited) noexcept;
  // The stream continues on the anchor: receiving from byte `rx_from`, sending from byte
  // `tx_from`. Moves what it can at once and wakes every sleeper.
  void EnterTcp(uint64_t rx_from, uint64_t tx_from) noexcept;
  // The leaving end of a hand-back, its transport stopped: sends FAILOVER {`consumed`,
  // published, hand_back}, takes the peer's answer, checks it (`credited` is what the
  // peer acknowledged over the transport) and writes what the peer did not receive onto
  // the anchor, then FIN if the application had finished. All within `timeout_ms`; false,
  // logged, when any of it fails. This end never carries the stream afterwards.
  bool HandBack(uint64_t consumed, uint64_t credited, int timeout_ms) noexcept;

  // --- urgent data (docs/DESIGN.md, "Urgent data")
  enum class UrgentRoute : uint8_t {
    kMarked,    // the peer knows the mark: publish the byte as any other
    kOnAnchor,  // TCP carries the stream: the anchor sends the byte as TCP urgent data
    kUnmarked,  // the peer did not answer in time (logged): the byte goes as any other
    kNone,      // no anchor to say it on (failover is off): no urgent data
  };
  // The application sends urgent data whose byte will be byte `offset` of this end's
  // stream, `byte`. While the transport carries the stream: tells the peer (URGENT) and
  // waits up to `timeout_ms` for its answer, or for the stream to move to TCP (then the
  // peer had the mark before our FAILOVER, which follows it on the anchor). On TCP, or
  // with our FAILOVER out: marks the byte for the anchor. Any thread but the control one.
  UrgentRoute AnnounceUrgent(uint64_t offset, uint8_t byte, int timeout_ms) noexcept;
  // Control thread: the peer's URGENT at `offset` arrived (the stream took the mark):
  // answers it unless our FAILOVER is out, after which the anchor carries no message of
  // ours (the peer's wait then ends with the switch to TCP).
  void AnswerUrgent(uint64_t offset) noexcept;
  // Control thread: the peer's answer to our URGENT.
  void OnUrgentAck(uint64_t offset) noexcept;
  // Whether an URGENT or a WINDOW of ours went out (a connection declined after it cannot
  // start over from byte 0 on TCP: the peer's application would read the message).
  bool said_in_band() const noexcept { return said_in_band_.load(std::memory_order_relaxed); }

  // --- buffer sizes (docs/DESIGN.md, "Buffer sizes")
  // The receive buffer the application set, `bytes` as getsockopt reads it back (0: the
  // kernel's own): told to the peer (WINDOW) while the transport carries the stream;
  // while held, at Release. On TCP the kernel's own buffers bound the stream.
  void AnnounceWindow(uint32_t bytes) noexcept;
  // recv(MSG_OOB) while TCP carries the stream: the anchor's own urgent byte (TCP urgent
  // data from a peer that sent it on TCP). -errno as recv would say.
  ssize_t RecvUrgentOnAnchor(uint8_t* byte, int flags) const noexcept;

 private:
  // Whether the peer's counts fit this end's: it received no less than we saw credited and
  // nothing we did not publish, and it sent at least what we received.
  bool Fits(const wire::Failover& peer, uint64_t credited, uint64_t received) const noexcept;

  const char* const transport_;
  Ends* const ends_;
  const uint32_t ring_size_;
  std::atomic<int> anchor_{-1};
  uint8_t* rx_ring_ = nullptr;
  const uint8_t* tx_ring_ = nullptr;
  int own_b_ = -1;

  std::atomic<Carriage> carriage_{Carriage::kTransport};
  std::atomic<uint64_t> published_{0};
  std::atomic<uint64_t> consumed_{0};
  std::atomic<bool> finished_{false};

  std::mutex mu_;
  bool ours_sent_ = false;             // under mu_
  uint64_t received_ = 0;              // what our FAILOVER said, under mu_
  std::condition_variable urgent_cv_;  // (with mu_) an answer came, or the carriage changed
  uint64_t urgent_acked_ = 0;          // under mu_: the peer's last answer's offset + 1
  std::atomic<bool> said_in_band_{false};
  uint32_t window_ = 0;          // under mu_: the last AnnounceWindow's
  bool window_pending_ = false;  // under mu_: announced while held, not yet sent
  mutable AnchorPath path_;
};

}  // namespace slip
