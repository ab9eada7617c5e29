// Stream: TCP byte-stream semantics over a Channel and a readiness proxy.
//
// This is what an accelerated socket is: ordered bytes each way, EOF after the peer's
// shutdown or close, half-close, MSG_PEEK/WAITALL/DONTWAIT/NOSIGNAL, blocking with
// SO_RCVTIMEO/SO_SNDTIMEO and signals (the sleeps are real kernel sleeps on the proxy),
// and readiness that epoll/poll/select see on the proxy.
//
// Thread safety: any number of threads may call Send and Recv concurrently; each side is
// serialised by its own lock, which is never held while sleeping. MarkPeerGone may be
// called from the control thread at any time.
// Errors are returned as -errno; nothing here allocates after construction.
// The peer's cursors are input from another process (shm: its shared memory): they are
// range-checked before any use, and a peer that breaks the protocol ends its own
// connection (ECONNRESET), never the process.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/channel.h"
#include "core/channel_control.h"
#include "core/proxy.h"
#include "core/shared_sides.h"

namespace slip {

class RearmList;

struct StreamOptions {
  uint32_t spin_us = 50;
};

class Stream {
 public:
  // Takes ownership of `channel` and of the descriptors `proxy_a` (a duplicate of the
  // application's end) and `proxy_b` (our end).
  Stream(std::unique_ptr<Channel> channel, int proxy_a, int proxy_b,
         StreamOptions options) noexcept;
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Like sendmsg on a TCP socket: bytes sent, or -errno (-EAGAIN, -EPIPE, -EINTR, ...).
  // Raises SIGPIPE on EPIPE unless MSG_NOSIGNAL is given, when TCP would: after the peer's
  // orderly close the first write is accepted (and dropped), the next one fails.
  ssize_t Send(const iovec* iov, int iovcnt, int flags, bool nonblocking) noexcept;
  // Like recvmsg on a TCP socket: bytes received, 0 at EOF, or -errno.
  ssize_t Recv(const iovec* iov, int iovcnt, int flags, bool nonblocking) noexcept;

  // --- urgent data (core/stream_urgent.cc; docs/DESIGN.md, "Urgent data")
  // As TCP: send(MSG_OOB) makes its last byte urgent; the receiver keeps the latest mark, a
  // receive stops at it, and there skips the urgent byte unless SO_OOBINLINE is set;
  // recv(MSG_OOB) returns that byte once; SIOCATMARK says whether the next byte read is it.
  // Control thread: the peer's URGENT says byte `offset` of its stream is urgent, `byte`.
  // False (nothing taken) for an offset this end cannot have ahead of it.
  bool OnPeerUrgent(uint64_t offset, uint8_t byte) noexcept;
  // sockatmark(): 1 when the next byte to read is the urgent one, 0 otherwise.
  int AtMark() noexcept;
  // SO_OOBINLINE: the urgent byte stays in the stream at its place.
  void SetUrgentInline(bool on) noexcept { urgent_inline_.store(on, std::memory_order_relaxed); }

  // --- buffer sizes (docs/DESIGN.md, "Buffer sizes")
  // Over TCP what a sender can have unread by its peer is bounded by its send buffer and
  // the peer's receive buffer; here by the ring. When the application set both (its
  // SO_SNDBUF, the peer's SO_RCVBUF as the peer's WINDOW said), their sum bounds it too,
  // as TCP's would (never more than the ring). 0: the kernel's own, no bound.
  void SetSendBuffer(uint32_t bytes) noexcept;
  // Control thread: the peer's WINDOW.
  void OnPeerWindow(uint32_t bytes) noexcept;

  int ShutdownRead() noexcept;
  int ShutdownWrite() noexcept;
  // Both directions are finished for good: EOF for the peer, and its sends fail. For a
  // connection that only this process can hold. (The destructor, by contrast, tells the
  // peer nothing; see stream.cc.)
  void Close() noexcept;

  // Bytes ready to read (FIONREAD) and bytes sent but not yet consumed (SIOCOUTQ).
  size_t ReadableBytes() const noexcept;
  size_t UnconsumedBytes() const noexcept;

  // Readiness computed from the rings (EPOLLIN/OUT/RDHUP/HUP/ERR bits), without syscalls.
  uint32_t Ready(uint32_t interest) const noexcept;
  // A thread is about to sleep in the kernel waiting for `interest` on the proxy: make the
  // proxy's readiness true now, and arm wake-ups for later changes.
  void PrepareToSleep(uint32_t interest) noexcept;

  // Whether an edge-triggered epoll set watches this stream's proxy: then every publish
  // writes a token (a new edge at each arrival, as TCP gives), not just one per sleep.
  void SetEdgeTriggered(bool on) noexcept;

  // From now on a receive that leaves this stream unarmed (core/rearm_list.h) lists it in
  // `list`, which prepares it before the next sleep; null leaves the list. The stream
  // leaves by itself when destroyed.
  void SetRearmList(RearmList* list) noexcept;

  // The peer process is gone (its TCP anchor closed or reset). Wakes every sleeper.
  // `reset`: it went with a reset (RST on the anchor, e.g. SO_LINGER {1,0}): after the bytes
  // already here, the reader gets ECONNRESET once, as on TCP.
  void MarkPeerGone(bool reset = false) noexcept;

  // The process execs with this connection: the stream goes back to the TCP anchor for
  // good, from the byte the application read up to (ChannelControl::HandBack). Takes both sides'
  // locks, so a send or receive in progress finishes first. False when the channel cannot
  // (peer gone, no answer in `timeout_ms`): the connection is then unusable.
  bool HandBack(int timeout_ms) noexcept;
  // What Send and Recv return once a hand-back has succeeded (in this call, or one another
  // thread was sleeping in): the ring carries nothing more, the call is the kernel's (on
  // the TCP socket the application's number refers to once the face has put it there).
  static constexpr ssize_t kHandedBack = -(1l << 41);
  // After a hand-back, once the face has moved the application's numbers off the proxy:
  // wakes the threads asleep in the stream.
  void WakeAfterHandBack() noexcept;

  Channel* channel() noexcept { return channel_.get(); }
  // Its control side (settling, failover, hand-back, fork): never on the data path.
  ChannelControl* control() const noexcept { return channel_->control(); }
  // A (the application's end of the proxy), for the face that puts it at the
  // application's descriptor number.
  int proxy_a() const noexcept { return proxy_a_; }
  // For a stream that was never installed: its proxies go back to whoever created them
  // (the destructor will not close them).
  void ReleaseProxies() noexcept { proxy_a_ = proxy_b_ = -1; }
  uint64_t bytes_produced() const noexcept { return LoadProduced(std::memory_order_relaxed); }

  // The process is about to fork with this connection: from now on its cursors and side
  // locks live in a page the child shares (core/shared_sides.h), so that several processes
  // may send (or receive) on it at once, each call whole, as on TCP. Takes both sides'
  // locks for a moment. False when the page cannot be made (then each process keeps its
  // own cursors, and two processes must not use one side at once).
  bool ShareAcrossFork() noexcept;

 private:
  friend class RearmList;

  ssize_t RecvUntilDone(const iovec* iov, int iovcnt, int flags, bool nonblocking) noexcept;
  // Send's loop over the first `total` bytes of `iov`, and its urgent form (the last byte
  // published only once the peer knows the mark).
  ssize_t SendUpTo(const iovec* iov, int iovcnt, size_t total, int flags,
                   bool nonblocking) noexcept;
  ssize_t SendUrgent(const iovec* iov, int iovcnt, size_t total, int flags,
                     bool nonblocking) noexcept;
  // recv(MSG_OOB).
  ssize_t RecvUrgent(const iovec* iov, int iovcnt, int flags) noexcept;
  // A receive from byte `from` with `avail` bytes there, past an urgent mark: whether it
  // must stop (it copied bytes already and stands at the mark), how many bytes it skips
  // first (the urgent byte, not inline) and how many it may take after them.
  struct UrgentCut {
    bool stop = false;
    uint64_t skip = 0;
    uint64_t take = 0;
  };
  UrgentCut CutAtMark(uint64_t from, uint64_t avail, bool copied) noexcept;
  // The reader consumed up to `consumed`: a mark behind it is forgotten, as TCP does.
  void PassMark(uint64_t consumed) noexcept;
  // Takes the proxy's own urgent byte (the POLLPRI the peer's mark raised).
  void TakeProxyUrgent() noexcept;
  // The proxy fill that makes A unwritable before a non-blocking send reports EAGAIN.
  // True when space came meanwhile (the caller tries again).
  bool ArmWritable() noexcept;
  // Armed: the proxy shows what comes next (rearm_list.h). A token is queued, or the ring
  // is empty and the next publish writes one.
  bool Armed() const noexcept;
  uint32_t Ask() const noexcept {
    return edge_triggered_.load(std::memory_order_relaxed) ? kAskEvery : kAskOnce;
  }
  // One attempt under the side's lock. Returns a result (bytes or -errno) or kMustWait,
  // with progress kept in *done; the caller then sleeps without the lock.
  static constexpr ssize_t kMustWait = -(1l << 40);
  ssize_t SendOnce(const iovec* iov, int iovcnt, size_t total, int flags, bool nonblocking,
                   size_t* done) noexcept;
  ssize_t RecvOnce(const iovec* iov, int iovcnt, size_t total, int flags, bool nonblocking,
                   size_t* done, uint64_t* seen) noexcept;
  size_t CopyOut(const iovec* iov, int iovcnt, size_t skip, size_t len, uint64_t from) noexcept;
  // 0 (nothing wrong), -errno, or kDiscard: accept this write and drop it (TCP's first
  // write after the peer's orderly close).
  static constexpr int kDiscard = 1;
  // The cursors: this process's, or the shared page's once the stream crossed a fork.
  uint64_t LoadProduced(std::memory_order order) const noexcept {
    const SharedSides* sides = sides_.load(std::memory_order_acquire);
    return sides ? sides->produced.load(order) : produced_.load(order);
  }
  uint64_t LoadConsumed(std::memory_order order) const noexcept {
    const SharedSides* sides = sides_.load(std::memory_order_acquire);
    return sides ? sides->consumed.load(order) : consumed_.load(order);
  }
  void StoreProduced(uint64_t value) noexcept;
  void StoreConsumed(uint64_t value) noexcept;
  int SendError(int flags) noexcept;
  int RecvEndState() noexcept;  // 0 = EOF, -errno, or 1 = nothing yet
  template <typename Pred>
  bool SpinUntil(Pred ready) const noexcept;
  // The peer's cursors, checked: bytes it published that we have not consumed (at most a
  // ring), and bytes we published that it has not credited (likewise). `strict`: the
  // side's own thread, under its lock, whose cursor cannot move meanwhile: a cursor out of
  // range ends the connection (PeerViolation) and reads as nothing to receive, no space.
  // Any other thread's view is clamped into the ring, never judged: its copy of our own
  // cursor may be stale while the peer legitimately moved past it.
  uint64_t RxAvail(bool strict = false) const noexcept;
  uint64_t TxUsed(bool strict = false) const noexcept;
  void PeerViolation(const char* what, uint64_t value, uint64_t ours) const noexcept;
  bool HasRxData() const noexcept { return RxAvail() != 0; }
  bool HasTxSpace() const noexcept { return TxUsed() < TxLimit(); }
  // How much may be unconsumed by the peer: the ring, or less (SetSendBuffer).
  uint64_t TxLimit() const noexcept { return tx_limit_.load(std::memory_order_relaxed); }
  void UpdateTxLimit() noexcept;
  bool RxFinished() const noexcept;  // EOF, peer gone or SHUT_RD: no more bytes will come
  bool TxFinished() const noexcept;  // sending can only fail now
  int WaitReadable(uint64_t seen) noexcept;
  int WaitReadableDirect(uint64_t seen, int wake_fd) noexcept;
  int SleepDirect(int wake_fd, bool* woken) noexcept;
  int WaitWritable() noexcept;

  std::unique_ptr<Channel> channel_;
  int proxy_a_;
  int proxy_b_;
  const StreamOptions options_;
  const uint32_t mask_;
  // How many bytes a receive copies out before it credits them: a quarter ring (16 KiB at
  // least), so that a large write and its read overlap (the sender refills what the
  // receiver freed while the receiver copies the rest). Chunking the sender's publishes
  // instead gains as much on shm but costs verbs a write per chunk.
  static constexpr uint64_t CreditChunk(uint32_t ring_size) noexcept {
    return ring_size / 4 > 16384 ? ring_size / 4 : 16384;
  }

  std::mutex tx_mu_;
  std::mutex rx_mu_;
  std::atomic<uint64_t> produced_{0};  // written under tx_mu_
  std::atomic<uint64_t> consumed_{0};  // written under rx_mu_
  // Set before a fork (ShareAcrossFork), under both locks: then the cursors that count are
  // there, and the side's lock there is taken inside tx_mu_/rx_mu_.
  std::atomic<SharedSides*> sides_{nullptr};
  std::atomic<bool> shut_rd_{false};
  std::atomic<bool> shut_wr_{false};
  std::atomic<bool> peer_gone_{false};
  std::atomic<bool> handed_back_{false};  // set under both sides' locks (HandBack)
  std::atomic<bool> reset_reported_{false};
  std::atomic<bool> reset_by_peer_{false};
  std::atomic<bool> closed_{false};
  mutable std::atomic<bool> violated_{false};
  std::atomic<bool> discarded_after_close_{false};
  std::atomic<int> rx_sleepers_{0};  // threads asleep in WaitReadable
  std::atomic<bool> edge_triggered_{false};
  std::atomic<uint32_t> send_buffer_{0};  // SetSendBuffer's
  std::atomic<uint32_t> peer_window_{0};  // the peer's WINDOW
  std::atomic<uint64_t> tx_limit_;        // (UpdateTxLimit)

  // Urgent data: the latest mark the peer announced, as TCP keeps one (stream_urgent.cc).
  std::mutex urgent_mu_;                    // the fields below it
  std::atomic<bool> urgent_active_{false};  // a mark is known and not passed (read unlocked)
  std::atomic<bool> urgent_inline_{false};  // SO_OOBINLINE
  uint64_t urgent_offset_ = 0;
  uint8_t urgent_byte_ = 0;
  bool urgent_read_ = false;  // recv(MSG_OOB) took it

  // RearmList membership; the links and flags are the list's, under its lock.
  std::atomic<RearmList*> rearm_{nullptr};
  Stream* rearm_prev_ = nullptr;
  Stream* rearm_next_ = nullptr;
  std::atomic<bool> rearm_listed_{false};  // (read unlocked by Recv)
  bool rearm_always_ = false;
};

}  // namespace slip
