#include "core/stream.h"

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>

#include "core/log.h"
#include "core/rearm_list.h"
#include "core/sys.h"

namespace slip {

namespace {

inline void CpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

size_t IovTotal(const iovec* iov, int iovcnt) noexcept {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len > SIZE_MAX / 2 - total) return SIZE_MAX;
    total += iov[i].iov_len;
  }
  return total;
}

// Walks an iovec array from a byte offset, handing out contiguous pieces.
class IovCursor {
 public:
  IovCursor(const iovec* iov, int iovcnt, size_t skip) noexcept : iov_(iov), left_(iovcnt) {
    while (left_ > 0 && skip >= iov_->iov_len) {
      skip -= iov_->iov_len;
      ++iov_;
      --left_;
    }
    offset_ = skip;
  }
  // Returns a piece of at most `max` bytes; *len is 0 when the array is exhausted.
  uint8_t* Next(size_t max, size_t* len) noexcept {
    while (left_ > 0 && offset_ == iov_->iov_len) {
      ++iov_;
      --left_;
      offset_ = 0;
    }
    if (left_ == 0) {
      *len = 0;
      return nullptr;
    }
    *len = std::min(max, iov_->iov_len - offset_);
    uint8_t* base = static_cast<uint8_t*>(iov_->iov_base);
    uint8_t* p = base ? base + offset_ : nullptr;
    offset_ += *len;
    return p;
  }

 private:
  const iovec* iov_;
  int left_;
  size_t offset_ = 0;
};

}  // namespace

Stream::Stream(std::unique_ptr<Channel> channel, int proxy_a, int proxy_b,
               StreamOptions options) noexcept
    : channel_(std::move(channel)),
      proxy_a_(proxy_a),
      proxy_b_(proxy_b),
      options_(options),
      mask_(channel_->ring_size() - 1),
      tx_limit_(channel_->ring_size()) {}

// Destruction only lets go of this process's resources. It tells the peer nothing: after
// fork another process may still hold the connection, and only the kernel knows when the
// last holder is gone (it then closes the TCP anchor, whose FIN the peer watches).
Stream::~Stream() {
  SetRearmList(nullptr);
  SharedSides::Destroy(sides_.load(std::memory_order_relaxed));
  if (proxy_a_ >= 0) sys::close(proxy_a_);
  if (proxy_b_ >= 0) sys::close(proxy_b_);
  if (Channel* channel = channel_.release()) channel->Destroy();
}

bool Stream::HandBack(int timeout_ms) noexcept {
  std::scoped_lock lock(rx_mu_, tx_mu_);
  SharedSides* sides = sides_.load(std::memory_order_acquire);
  SideLock rx(sides, SharedSides::Side::kRx), tx(sides, SharedSides::Side::kTx);
  if (peer_gone_.load(std::memory_order_acquire) || !rx.ok() || !tx.ok()) return false;
  if (!channel_->control()->HandBack(LoadConsumed(std::memory_order_relaxed), timeout_ms))
    return false;
  // Not one more byte through the ring (the peer resends from `consumed` on TCP).
  handed_back_.store(true, std::memory_order_release);
  return true;
}

void Stream::WakeAfterHandBack() noexcept {
  // EOF and writable on A: threads asleep in a receive or a send wake, find kHandedBack.
  sys::shutdown(proxy_b_, SHUT_WR);
  proxy::Unfill(proxy_b_);
}

bool Stream::ShareAcrossFork() noexcept {
  std::scoped_lock lock(rx_mu_, tx_mu_);
  if (sides_.load(std::memory_order_relaxed)) return true;  // (shared at an earlier fork)
  SharedSides* sides = SharedSides::Create(produced_.load(std::memory_order_relaxed),
                                           consumed_.load(std::memory_order_relaxed));
  if (!sides) {
    SLIP_LOG(kWarn,
             "no page to share a connection's cursors across fork (%s): two processes "
             "must not send (or receive) on it at once",
             strerror(errno));
    return false;
  }
  sides_.store(sides, std::memory_order_release);
  return true;
}

void Stream::StoreProduced(uint64_t value) noexcept {
  produced_.store(value, std::memory_order_release);
  if (SharedSides* sides = sides_.load(std::memory_order_relaxed))
    sides->produced.store(value, std::memory_order_release);
}

void Stream::StoreConsumed(uint64_t value) noexcept {
  consumed_.store(value, std::memory_order_release);
  if (SharedSides* sides = sides_.load(std::memory_order_relaxed))
    sides->consumed.store(value, std::memory_order_release);
}

uint64_t Stream::RxAvail(bool strict) const noexcept {
  if (violated_.load(std::memory_order_acquire)) return 0;
  const uint64_t consumed = LoadConsumed(std::memory_order_acquire);
  const uint64_t produced = channel_->RxProduced();
  const uint64_t avail = produced - consumed;
  if (avail <= channel_->ring_size()) return avail;
  if (strict) {
    PeerViolation("published", produced, consumed);
    return 0;
  }
  // Another thread's view: our cursor may be stale (the reader consumed, credited, and the
  // peer published further meanwhile), so only the reader judges.
  return int64_t(avail) < 0 ? 0 : channel_->ring_size();
}

uint64_t Stream::TxUsed(bool strict) const noexcept {
  const uint32_t size = channel_->ring_size();
  if (violated_.load(std::memory_order_acquire)) return size;
  // The peer's credit first, then ours (which only grows and never trails what was
  // published, so it is never behind what the credit covers).
  const uint64_t credited = channel_->TxConsumed();
  const uint64_t produced = LoadProduced(std::memory_order_acquire);
  const uint64_t used = produced - credited;
  if (used <= size) return used;
  if (strict) {
    PeerViolation("credited", credited, produced);
    return size;
  }
  // Another thread's view: the credit it read may be older than the bytes published
  // since; only the sender judges (a credit past what was published reads as all free,
  // which sends the writer to that judgement).
  return int64_t(used) < 0 ? 0 : size;
}

void Stream::PeerViolation(const char* what, uint64_t value, uint64_t ours) const noexcept {
  if (violated_.exchange(true)) return;
  SLIP_LOG(kWarn,
           "the peer broke the ring protocol (it %s byte %llu, this end is at %llu, ring %u); "
           "resetting the connection",
           what, (unsigned long long)value, (unsigned long long)ours, channel_->ring_size());
  channel_->OnPeerViolation();
  // Readers see what they had, then ECONNRESET; writers wake to it.
  auto* self = const_cast<Stream*>(this);
  self->MarkPeerGone(true);
}

bool Stream::RxFinished() const noexcept {
  return channel_->RxEof() || peer_gone_.load(std::memory_order_acquire) ||
         shut_rd_.load(std::memory_order_relaxed) || channel_->Error() != 0;
}

bool Stream::TxFinished() const noexcept {
  return channel_->TxPeerClosed() || peer_gone_.load(std::memory_order_acquire) ||
         shut_wr_.load(std::memory_order_seq_cst) || channel_->Error() != 0;
}

template <typename Pred>
bool Stream::SpinUntil(Pred ready) const noexcept {
  if (options_.spin_us == 0) return false;
  const uint64_t deadline = sys::MonotonicNs() + uint64_t(options_.spin_us) * 1000;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      CpuRelax();
    }
    if (sys::MonotonicNs() >= deadline) return false;
    // The peer may be runnable on this very CPU (few cores, wake-affine scheduling):
    // spinning without yielding would only delay the bytes we wait for.
    sched_yield();
  }
}

// ---------------------------------------------------------------------------- send

int Stream::SendError(int flags) noexcept {
  if (!shut_wr_.load(std::memory_order_relaxed)) {
    if (!channel_->TxPeerClosed() && !peer_gone_.load(std::memory_order_acquire)) {
      // The transport itself broke: bytes may be lost in flight, so say so, as a reset
      // (once, as TCP does; then EPIPE).
      int error = channel_->Error();
      if (error == 0) return 0;
      if (!reset_reported_.exchange(true)) return -error;
    } else if (reset_by_peer_.load(std::memory_order_acquire) || TxUsed() != 0) {
      // As TCP when the peer's close met bytes it had not read (its kernel resets): the
      // reset is reported once, without a signal, unless a receive reported it already.
      if (!reset_reported_.exchange(true)) return -ECONNRESET;
    } else if (!discarded_after_close_.exchange(true)) {
      // As TCP after an orderly close by the peer: the first write is still accepted (the
      // peer's kernel answers it with a reset), and only the next one fails with EPIPE
      // and SIGPIPE. Raising the signal a write earlier would kill programs that TCP
      // lets live.
      return kDiscard;
    }
  }
  if (!(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
  return -EPIPE;
}

ssize_t Stream::Send(const iovec* iov, int iovcnt, int flags, bool nonblocking) noexcept {
  size_t total = IovTotal(iov, iovcnt);
  if (total == SIZE_MAX) return -EINVAL;
  nonblocking = nonblocking || (flags & MSG_DONTWAIT);
  if ((flags & MSG_OOB) && total > 0)
    return SendUrgent(iov, iovcnt, total, flags & ~MSG_OOB, nonblocking);
  return SendUpTo(iov, iovcnt, total, flags & ~MSG_OOB, nonblocking);
}

ssize_t Stream::SendUpTo(const iovec* iov, int iovcnt, size_t total, int flags,
                         bool nonblocking) noexcept {
  size_t sent = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(tx_mu_);
      // (Held by several processes since a fork: their lock too, core/shared_sides.h.)
      SideLock side(sides_.load(std::memory_order_acquire), SharedSides::Side::kTx);
      if (!side.ok()) return sent ? ssize_t(sent) : -EIO;
      ssize_t rc = SendOnce(iov, iovcnt, total, flags, nonblocking, &sent);
      if (rc != kMustWait) return rc;
    }
    // Sleep without the lock: other threads' MSG_DONTWAIT sends must not wait behind us.
    if (SpinUntil([this] { return HasTxSpace() || TxFinished(); })) continue;
    if (int rc = WaitWritable(); rc < 0) return sent ? ssize_t(sent) : rc;
  }
}

ssize_t Stream::SendOnce(const iovec* iov, int iovcnt, size_t total, int flags, bool nonblocking,
                         size_t* done) noexcept {
  const uint32_t size = channel_->ring_size();
  size_t& sent = *done;
  if (handed_back_.load(std::memory_order_relaxed)) return sent ? ssize_t(sent) : kHandedBack;
  for (;;) {
    if (int err = SendError(sent ? flags | MSG_NOSIGNAL : flags)) {
      if (err == kDiscard) return ssize_t(total);  // accepted, and dropped as TCP would
      return sent ? ssize_t(sent) : err;
    }
    if (sent == total) return ssize_t(sent);
    const uint64_t used = TxUsed(/*strict=*/true), limit = TxLimit();
    uint64_t space = used < limit ? limit - used : 0;
    uint64_t produced = LoadProduced(std::memory_order_relaxed);
    if (space > 0) {
      size_t n = std::min<uint64_t>(space, total - sent);
      IovCursor cursor(iov, iovcnt, sent);
      size_t copied = 0;
      while (copied < n) {
        uint32_t offset = uint32_t((produced + copied) & mask_);
        size_t piece;
        const uint8_t* src = cursor.Next(std::min<size_t>(n - copied, size - offset), &piece);
        channel_->TxCopy(offset, src, piece);
        copied += piece;
      }
      produced += n;
      // (The cursor first: a process that dies before it publishes leaves the next sender
      // to publish these bytes with its own.)
      StoreProduced(produced);
      channel_->TxPublish(produced);
      sent += n;
      continue;
    }
    if (!nonblocking) return kMustWait;
    if (sent > 0) return ssize_t(sent);
    if (ArmWritable()) continue;
    return -EAGAIN;
  }
}

bool Stream::ArmWritable() noexcept {
  // Make the proxy unwritable before reporting EAGAIN, so that the application's wait for
  // EPOLLOUT sleeps until the peer frees space (and drains the fill).
  proxy::Fill(proxy_a_);
  channel_->TxWake()->writer_waiting.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!HasTxSpace()) return false;
  channel_->TxWake()->writer_waiting.store(0, std::memory_order_relaxed);
  proxy::Unfill(proxy_b_);
  return true;
}

int Stream::WaitWritable() noexcept {
  proxy::Fill(proxy_a_);
  channel_->TxWake()->writer_waiting.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (HasTxSpace() || TxFinished()) {
    proxy::Unfill(proxy_b_);
    return 0;
  }
  // Sleeps in the kernel until A is writable, with the socket's own timeout and signal
  // semantics; the byte written is one more harmless fill byte.
  char fill = 0;
  if (sys::send(proxy_a_, &fill, 1, MSG_NOSIGNAL) == 1) return 0;
  return errno == EPIPE ? 0 : -errno;
}

// ---------------------------------------------------------------------------- receive

size_t Stream::CopyOut(const iovec* iov, int iovcnt, size_t skip, size_t len,
                       uint64_t from) noexcept {
  const uint8_t* ring = channel_->RxData();
  const uint32_t size = channel_->ring_size();
  IovCursor cursor(iov, iovcnt, skip);
  size_t done = 0;
  while (done < len) {
    uint32_t offset = uint32_t((from + done) & mask_);
    size_t piece;
    uint8_t* dst = cursor.Next(std::min<size_t>(len - done, size - offset), &piece);
    if (piece == 0) break;
    if (dst) std::memcpy(dst, ring + offset, piece);  // null base: MSG_TRUNC discard
    done += piece;
  }
  return done;
}

int Stream::RecvEndState() noexcept {
  // After SHUT_RD, as on TCP, queued bytes are still delivered; then EOF.
  if (shut_rd_.load(std::memory_order_relaxed)) return HasRxData() ? 1 : 0;
  if (channel_->RxEof()) return HasRxData() ? 1 : 0;
  if (int error = channel_->Error()) {
    // As TCP after a reset: the bytes that arrived, the error once, then EOF.
    if (HasRxData()) return 1;
    return reset_reported_.exchange(true) ? 0 : -error;
  }
  if (peer_gone_.load(std::memory_order_acquire)) {
    if (HasRxData()) return 1;
    // Like TCP: a peer that died with our bytes unread resets the connection once.
    bool unread = TxUsed() != 0;
    if ((unread || reset_by_peer_.load(std::memory_order_acquire)) &&
        !reset_reported_.exchange(true))
      return -ECONNRESET;
    return 0;
  }
  return 1;
}

ssize_t Stream::Recv(const iovec* iov, int iovcnt, int flags, bool nonblocking) noexcept {
  const ssize_t rc = RecvUntilDone(iov, iovcnt, flags, nonblocking);
  // The receive may have left the stream unarmed (the last token taken, and no ask pending
  // or bytes left behind one): then the proxy would not show them, and whoever sleeps next
  // must arm it first.
  // (A stream already listed stays so until the next sleep arms it: no lock then, as for a
  // program that never waits in epoll_wait, poll or select.)
  if (!rearm_listed_.load(std::memory_order_relaxed) && !Armed()) {
    if (RearmList* list = rearm_.load(std::memory_order_acquire)) list->MarkChanged(this);
  }
  return rc;
}

bool Stream::Armed() const noexcept {
  const WakeState* wake = channel_->RxWake();
  if (wake->tokens.load(std::memory_order_relaxed) != 0) return true;
  // An ask is taken by the next publish, not by one that came before it: bytes left in
  // the ring that the asker did not see (a blocking receive that asked, then found bytes
  // and did not sleep; an arming that saw bytes and a token the reader was draining)
  // would stay unshown with nothing more to come. Seen as a poll that slept through a
  // full ring (threads_accept over fabric, a settling connection with other threads in
  // epoll_wait).
  return wake->reader_waiting.load(std::memory_order_relaxed) != 0 && !HasRxData();
}

void Stream::SetEdgeTriggered(bool on) noexcept {
  if (edge_triggered_.exchange(on, std::memory_order_relaxed) == on) return;
  // The ask changes at the next arming, however armed the stream is now.
  if (RearmList* list = rearm_.load(std::memory_order_acquire)) list->MarkChanged(this);
}

void Stream::SetRearmList(RearmList* list) noexcept {
  RearmList* old = rearm_.load(std::memory_order_relaxed);
  if (old == list) return;
  if (old) old->Leave(this);
  if (list) list->Join(this);
}

ssize_t Stream::RecvUntilDone(const iovec* iov, int iovcnt, int flags, bool nonblocking) noexcept {
  if (flags & MSG_OOB) return RecvUrgent(iov, iovcnt, flags);
  size_t total = IovTotal(iov, iovcnt);
  if (total == SIZE_MAX) return -EINVAL;
  nonblocking = nonblocking || (flags & MSG_DONTWAIT);
  size_t got = 0;
  uint64_t seen = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(rx_mu_);
      SideLock side(sides_.load(std::memory_order_acquire), SharedSides::Side::kRx);
      if (!side.ok()) return got ? ssize_t(got) : -EIO;
      ssize_t rc = RecvOnce(iov, iovcnt, total, flags, nonblocking, &got, &seen);
      if (rc != kMustWait) return rc;
    }
    // Sleep without the lock, until bytes beyond `seen` arrive or the stream ends.
    if (SpinUntil([this, seen] { return channel_->RxProduced() != seen || RxFinished(); }))
      continue;
    if (int rc = WaitReadable(seen); rc < 0) return got ? ssize_t(got) : rc;
  }
}

ssize_t Stream::RecvOnce(const iovec* iov, int iovcnt, size_t total, int flags, bool nonblocking,
                         size_t* done, uint64_t* seen) noexcept {
  const bool peek = flags & MSG_PEEK;
  const bool waitall = (flags & MSG_WAITALL) && !nonblocking;
  WakeState* wake = channel_->RxWake();
  size_t& got = *done;
  if (handed_back_.load(std::memory_order_relaxed)) return got ? ssize_t(got) : kHandedBack;
  if (total == 0) return 0;
  uint64_t consumed = LoadConsumed(std::memory_order_relaxed);
  uint64_t avail = RxAvail(/*strict=*/true);
  uint64_t produced = consumed + avail;
  // Past an urgent mark: stop at it, skip its byte there unless it is inline.
  uint64_t take = avail, skip = 0;
  if (urgent_active_.load(std::memory_order_acquire)) {
    const UrgentCut cut = CutAtMark(consumed, avail, got > 0);
    if (cut.stop) return ssize_t(got);
    take = cut.take;
    skip = cut.skip;
    if (skip && !peek) {
      consumed += skip;
      StoreConsumed(consumed);
      channel_->RxConsumed(consumed);
      PassMark(consumed);
    }
  }
  if (peek) {
    // Like TCP, MSG_PEEK|MSG_WAITALL waits until the whole amount is there (or EOF).
    if (take > 0 && (take >= total || !waitall || RxFinished()))
      return ssize_t(CopyOut(iov, iovcnt, 0, std::min<uint64_t>(take, total), consumed + skip));
  } else if (take > 0) {
    // Credited a chunk at a time: the sender refills the ring while we copy the rest, where
    // crediting once at the end had the two ends take turns over whole rings.
    const uint64_t want = std::min<uint64_t>(take, total - got);
    const uint64_t chunk = CreditChunk(channel_->ring_size());
    for (uint64_t done = 0; done < want;) {
      const size_t n = CopyOut(iov, iovcnt, got, std::min(chunk, want - done), consumed);
      consumed += n;
      StoreConsumed(consumed);
      channel_->RxConsumed(consumed);
      got += n;
      done += n;
      if (n == 0) break;
    }
    if (urgent_active_.load(std::memory_order_relaxed)) PassMark(consumed);
    if (got == total || !waitall) {
      if (!HasRxData()) proxy::DrainTokens(wake, proxy_a_);
      return ssize_t(got);
    }
    produced = consumed;
  }
  int end = RecvEndState();
  if (end <= 0) return got ? ssize_t(got) : end;
  if (nonblocking) {
    proxy::DrainAllTokens(wake, proxy_a_);
    if (RxAvail(/*strict=*/true) != produced - LoadConsumed(std::memory_order_relaxed) ||
        RecvEndState() <= 0)
      return RecvOnce(iov, iovcnt, total, flags, nonblocking, done, seen);
    return got ? ssize_t(got) : -EAGAIN;
  }
  *seen = produced;
  return kMustWait;
}

int Stream::WaitReadable(uint64_t seen) noexcept {
  if (int fd = channel_->BeginRxSleep(); fd >= 0) return WaitReadableDirect(seen, fd);
  WakeState* wake = channel_->RxWake();
  rx_sleepers_.fetch_add(1, std::memory_order_relaxed);
  wake->reader_waiting.store(Ask(), std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  int rc = 0;
  if (channel_->RxProduced() == seen && !RxFinished()) {
    // Sleeps in the kernel on the proxy: SO_RCVTIMEO, signals and SA_RESTART behave as on
    // the TCP socket. A token, EOF (B shut down) or an error ends the sleep.
    char token;
    ssize_t n = sys::recv(proxy_a_, &token, 1, 0);
    if (n == 1) {
      // (Saturating: a token nobody counted, e.g. a peer's stray byte, must not wrap the
      // count and silence every later wake-up.)
      uint32_t tokens = wake->tokens.load(std::memory_order_relaxed);
      while (tokens != 0 &&
             !wake->tokens.compare_exchange_weak(tokens, tokens - 1, std::memory_order_relaxed)) {
      }
    } else if (n < 0) {
      rc = -errno;
    }
  }
  // One token wakes one sleeper. If others still sleep, arm again on their behalf (and
  // wake one now if bytes are already there), so that each of them is woken in turn.
  if (rx_sleepers_.fetch_sub(1, std::memory_order_relaxed) > 1) {
    wake->reader_waiting.store(Ask(), std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (HasRxData() && wake->tokens.load(std::memory_order_relaxed) == 0)
      proxy::WriteToken(wake, proxy_b_);
  }
  return rc;
}

// A blocking recv over a transport with a wake descriptor (verbs: the completion channel)
// sleeps in ppoll on that descriptor and the proxy: the kernel wakes it when a completion
// arrives, with no thread in between (the proxy's token path costs a second thread's
// wake-up per message). EOF, errors, shutdown and a dead peer still arrive on the proxy.
int Stream::WaitReadableDirect(uint64_t seen, int wake_fd) noexcept {
  rx_sleepers_.fetch_add(1, std::memory_order_relaxed);
  int rc = 0;
  // BeginRxSleep announced us (and the poll below arms the transport's events), so a
  // publish after this check wakes the descriptor.
  bool woken = false;
  if (channel_->RxProduced() == seen && !RxFinished()) rc = SleepDirect(wake_fd, &woken);
  channel_->EndRxSleep(woken);
  // Another thread may sleep on this socket too (on the descriptor or the proxy): if bytes
  // are here, wake one, as the proxy path hands its token on.
  if (rx_sleepers_.fetch_sub(1, std::memory_order_relaxed) > 1) {
    WakeState* wake = channel_->RxWake();
    if (HasRxData() && wake->tokens.load(std::memory_order_relaxed) == 0)
      proxy::WriteToken(wake, proxy_b_);
  }
  return rc;
}

namespace {

// Signals the kernel raises on the instruction that faults (a bad access, a bad operand, a
// trap): they are delivered as that instruction runs, never to a thread asleep in a system
// call, so their handlers cannot be what interrupted one. (AddressSanitizer's runtime
// installs SIGSEGV, SIGBUS and SIGFPE handlers without SA_RESTART; counted, they made every
// restart under it an EINTR.)
bool RaisedByAFault(int sig) noexcept {
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP ||
         sig == SIGSYS;
}

// After a signal handler interrupted a sleep that the kernel never restarts (ppoll), decides
// what a recv on a TCP socket without SO_RCVTIMEO would have done: restart when the handler
// has SA_RESTART. Which signal it was is not known here, so this restarts only when every
// handler that could have run (installed, signal not blocked in this thread, not raised only
// by a faulting instruction) has SA_RESTART.
bool SignalWouldRestart() noexcept {
  struct KernelSigaction {
    void* handler;
    unsigned long flags;
    void* restorer;
    uint64_t mask;
  };
  uint64_t blocked = 0;
  if (::syscall(SYS_rt_sigprocmask, SIG_BLOCK, nullptr, &blocked, sizeof(blocked)) != 0)
    return false;
  for (int sig = 1; sig <= 64; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP || RaisedByAFault(sig) || (blocked & (1ull << (sig - 1))))
      continue;
    KernelSigaction old{};
    if (::syscall(SYS_rt_sigaction, sig, nullptr, &old, sizeof(uint64_t)) != 0) continue;
    if (old.handler == reinterpret_cast<void*>(SIG_DFL) ||
        old.handler == reinterpret_cast<void*>(SIG_IGN))
      continue;
    if (!(old.flags & SA_RESTART)) return false;
  }
  return true;
}

}  // namespace

// Sleeps until the proxy or `wake_fd` is readable, with the semantics of a recv on A:
// SO_RCVTIMEO (read from A, where setsockopt mirrors it) ends it with EAGAIN, a signal with
// EINTR, or a restart as SA_RESTART would (see SignalWouldRestart). Returns 0 or -errno.
int Stream::SleepDirect(int wake_fd, bool* woken) noexcept {
  timeval tv{};
  socklen_t len = sizeof(tv);
  if (sys::getsockopt(proxy_a_, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) != 0) tv = timeval{};
  const bool timed = tv.tv_sec != 0 || tv.tv_usec != 0;
  const uint64_t deadline = timed ? sys::MonotonicNs() + uint64_t(tv.tv_sec) * 1000000000ull +
                                        uint64_t(tv.tv_usec) * 1000ull
                                  : 0;
  for (;;) {
    pollfd fds[2] = {{proxy_a_, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    timespec ts{};
    if (timed) {
      uint64_t now = sys::MonotonicNs();
      if (now >= deadline) return -EAGAIN;
      ts.tv_sec = time_t((deadline - now) / 1000000000ull);
      ts.tv_nsec = long((deadline - now) % 1000000000ull);
    }
    long n = ::syscall(SYS_ppoll, fds, 2, timed ? &ts : nullptr, nullptr, 0);
    if (n > 0) {
      *woken = (fds[1].revents & POLLIN) != 0;
      // Tokens on A with no bytes behind them (a wake-up meant for us, handed on by whoever
      // took the completion event first) are taken here: A must not stay readable for
      // nothing, or the next sleep would return at once.
      // (Counted or not: the proxy's urgent byte, a peer's stray one, keep A readable too.)
      if ((fds[0].revents & POLLIN) && !HasRxData())
        proxy::DrainAllTokens(channel_->RxWake(), proxy_a_);
      return 0;
    }
    if (n == 0) return -EAGAIN;
    if (errno != EINTR) return -errno;
    // As signal(7) says for sockets: with a receive timeout, never restarted.
    if (timed || !SignalWouldRestart()) return -EINTR;
  }
}

// ---------------------------------------------------------------------------- control

int Stream::ShutdownRead() noexcept {
  shut_rd_.store(true, std::memory_order_relaxed);
  // Like TCP: readers wake up and see EOF; pollers see EPOLLIN|EPOLLRDHUP.
  sys::shutdown(proxy_a_, SHUT_RD);
  return 0;
}

int Stream::ShutdownWrite() noexcept {
  if (shut_wr_.exchange(true)) return 0;
  proxy::Unfill(proxy_b_);  // a sender asleep on a full ring wakes up and sees EPIPE
  std::lock_guard<std::mutex> lock(tx_mu_);
  SideLock side(sides_.load(std::memory_order_acquire), SharedSides::Side::kTx);
  channel_->CloseTx();
  sys::shutdown(proxy_a_, SHUT_WR);
  return 0;
}

void Stream::Close() noexcept {
  if (closed_.exchange(true)) return;
  ShutdownWrite();
  channel_->CloseRx();
}

void Stream::MarkPeerGone(bool reset) noexcept {
  channel_->control()->BeforePeerGone();
  if (reset) reset_by_peer_.store(true, std::memory_order_release);
  peer_gone_.store(true, std::memory_order_release);
  // EOF on A for readers (and pollers: EPOLLIN|EPOLLRDHUP), writable A for writers.
  sys::shutdown(proxy_b_, SHUT_WR);
  proxy::Unfill(proxy_b_);
}

size_t Stream::ReadableBytes() const noexcept {
  return RxAvail();
}

size_t Stream::UnconsumedBytes() const noexcept {
  return TxUsed();
}

uint32_t Stream::Ready(uint32_t interest) const noexcept {
  uint32_t ready = 0;
  bool gone = peer_gone_.load(std::memory_order_acquire);
  bool eof = channel_->RxEof() || gone;
  if (channel_->Error() != 0) ready |= EPOLLERR | EPOLLHUP | EPOLLIN | EPOLLOUT;
  // As TCP after an RST: error and hang-up until the reset has been reported.
  if (gone && reset_by_peer_.load(std::memory_order_acquire) &&
      !reset_reported_.load(std::memory_order_relaxed))
    ready |= EPOLLERR | EPOLLHUP;
  if (HasRxData() || eof || shut_rd_.load(std::memory_order_relaxed)) ready |= EPOLLIN;
  if (eof || shut_rd_.load(std::memory_order_relaxed)) ready |= EPOLLRDHUP;
  if (HasTxSpace() || gone || channel_->TxPeerClosed() || shut_wr_.load(std::memory_order_relaxed))
    ready |= EPOLLOUT;
  // As TCP after a FIN: HUP only once our side has shut down its writes too.
  if (eof && shut_wr_.load(std::memory_order_relaxed)) ready |= EPOLLHUP;
  return ready & (interest | EPOLLHUP | EPOLLERR);
}

void Stream::PrepareToSleep(uint32_t interest) noexcept {
  if (interest & (EPOLLIN | EPOLLRDHUP)) {
    WakeState* wake = channel_->RxWake();
    wake->reader_waiting.store(Ask(), std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (HasRxData() && wake->tokens.load(std::memory_order_relaxed) == 0)
      proxy::WriteToken(wake, proxy_b_);
  }
  if (interest & EPOLLOUT) {
    WakeState* wake = channel_->TxWake();
    if (TxFinished()) {
      proxy::Unfill(proxy_b_);  // sends fail at once now: writable, as TCP reports it
    } else if (!HasTxSpace()) {
      proxy::Fill(proxy_a_);
      wake->writer_waiting.store(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (HasTxSpace()) proxy::Unfill(proxy_b_);
    } else if (wake->writer_waiting.load(std::memory_order_relaxed) &&
               wake->writer_waiting.exchange(0)) {
      proxy::Unfill(proxy_b_);
    }
  }
}

}  // namespace slip
