// The shm Channel: plain stores into the peer's ring with release/acquire on the cursors,
// and proxy wake-ups only when the other side announced it is going to sleep.
//
// Everything in the region is written by a process we do not trust (docs/SECURITY.md):
// the ring size and the nonce are snapshots taken when the region was validated, and this
// end's own cursors (what it published, what it consumed) are kept here, never read back
// from the region. The cursors the peer writes are range-checked by Stream.
//
// Carriage (core/failover.h; docs/DESIGN.md, "Settling a connection"):
//   transport  the rings carry the stream (from the start: a client whose registration is
//              not taken yet writes into the ring, which holds its bytes until it is)
//   tcp        the anchor carries it: the peer handed the connection back (exec), or the
//              client's connection went to a process that did not take it
// shm never fails on its own (memory does not go away under a live process), so it never
// starts a failover: it answers a peer's hand-back and settles as plain.
#include <sys/epoll.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/anchor_path.h"
#include "core/failover.h"
#include "core/local_address.h"
#include "core/log.h"
#include "core/sock_diag.h"
#include "core/sys.h"
#include "shm/region.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

// A client whose registration is not taken yet looks whether its connection was accepted
// (then by a process that did not take it): first this soon after its handshake, then
// at twice the interval each time, up to kLookMaxMs. The listener's ACCEPT, or bytes from a
// plain acceptor, usually settle it before the first look.
constexpr uint64_t kFirstLookMs = 10;
constexpr uint64_t kLookMaxMs = 200;
// The accepting process takes the registration in the same accept() call, right after
// accept4() returns (reading what is queued before it, a step at a time, when its control
// thread is behind a burst): seen accepted and still not taken this much later, it never
// will be. (Withdrawing early is safe, only slower: the claim word decides for both ends.)
constexpr uint64_t kTakeGraceMs = 100;
// The same at a listener shared by forked workers (kListenerShared): the acceptor reads
// registrations only inside its accept(), for at most Rendezvous' kTakeSearchMs (20 ms), so
// a registration another worker read is never taken, and a client that speaks first (HTTP)
// waited the whole 100 ms for nothing. (Not 20 ms plus a little: an acceptor descheduled
// after accept4() is late too. nginx, 2 workers, `ab -c 16`, 4,000 requests: at 100 ms,
// 39-60 connections plain and the slowest request 115 ms; at 30 ms, 70-95 plain and 45 ms;
// at 50 ms, 44-58 plain and 64 ms.)
constexpr uint64_t kSharedTakeGraceMs = 50;
// Nobody takes a registration later than this (the listener drops it at 30 s).
constexpr uint64_t kGiveUpMs = 31000;

Reason ReasonForDecline(wire::DeclineReason reason) noexcept {
  switch (reason) {
    case wire::DeclineReason::kDescriptors:
      return Reason::kFdLimit;
    case wire::DeclineReason::kBusy:
      return Reason::kRendezvousBusy;
    case wire::DeclineReason::kResources:
      return Reason::kResources;
    default:
      return Reason::kDeclined;
  }
}

class ShmChannel final : public Channel, public ChannelControl, private AnchorFailover::Ends {
 public:
  explicit ShmChannel(const ChannelSetup& setup) noexcept
      : Channel(setup.ring_size),
        region_(setup.region),
        region_size_(setup.region_size),
        nonce_(setup.nonce),
        peer_b_(setup.peer_b),
        own_b_(setup.own_b),
        anchor_(setup.anchor),
        rendezvous_(setup.rendezvous),
        client_(setup.client),
        server_(setup.server),
        listener_inode_(setup.listener_inode),
        across_namespaces_(setup.across_namespaces),
        claim_(&static_cast<RegionControl*>(setup.region)->header.claim),
        failover_("shm", this, setup.ring_size) {
    auto* control = static_cast<RegionControl*>(region_);
    uint8_t* to_server = static_cast<uint8_t*>(region_) + kControlPage;
    uint8_t* to_client = to_server + ring_size();
    tx_ = setup.is_client ? &control->to_server : &control->to_client;
    rx_ = setup.is_client ? &control->to_client : &control->to_server;
    tx_data_ = setup.is_client ? to_server : to_client;
    rx_data_ = setup.is_client ? to_client : to_server;
    if (setup.rendezvous >= 0) {
      started_ms_ = sys::MonotonicMs();
      deadline_.store(started_ms_ + kFirstLookMs, std::memory_order_relaxed);
    }
    failover_.SetAnchor(anchor_);
    failover_.SetRings(rx_data_, tx_data_);
    failover_.SetOwnProxy(own_b_);
  }
  ~ShmChannel() override {
    // A client whose registration was not taken withdraws it; its server, when it accepts,
    // then has a plain connection, onto which what we wrote goes before our end (below).
    if (const int fd = rendezvous_.exchange(-1); fd >= 0) {
      if (WithdrawClaim()) failover_.EnterTcp(0, 0);
      sys::close(fd);
    }
    // On TCP, bytes still in the ring would go away with it: they go to the anchor first.
    if (failover_.on_tcp() && !aborted_) failover_.FinishOnClose(5000);
    munmap(region_, region_size_);
    if (peer_b_ >= 0) sys::close(peer_b_);
  }

  TransportKind kind() const noexcept override { return TransportKind::kShm; }

  uint64_t RxProduced() const noexcept override {
    switch (failover_.carriage()) {
      case Carriage::kTransport:
        return rx_->produced.load(std::memory_order_acquire);
      case Carriage::kTcp:
        return failover_.Pull();
      case Carriage::kHeld:
      case Carriage::kFailing:
        break;
    }
    return 0;
  }
  const uint8_t* RxData() const noexcept override { return rx_data_; }
  void RxConsumed(uint64_t consumed) noexcept override {
    failover_.SetConsumed(consumed);
    if (failover_.carriage() != Carriage::kTransport) return;  // TCP has its own window
    rx_->consumed.store(consumed, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = rx_->wake;
    if (wake.writer_waiting.load(std::memory_order_relaxed) && wake.writer_waiting.exchange(0))
      proxy::Unfill(peer_b_);
  }
  bool RxEof() const noexcept override {
    switch (failover_.carriage()) {
      case Carriage::kTransport:
        return rx_->eof.load(std::memory_order_acquire) != 0;
      case Carriage::kTcp:
        return failover_.eof();
      case Carriage::kHeld:
      case Carriage::kFailing:
        break;
    }
    return false;
  }
  WakeState* RxWake() noexcept override { return &rx_->wake; }
  int Error() const noexcept override { return failover_.on_tcp() ? failover_.error() : 0; }

  uint64_t TxConsumed() const noexcept override {
    switch (failover_.carriage()) {
      case Carriage::kTransport:
        return tx_->consumed.load(std::memory_order_acquire);
      case Carriage::kTcp:
        return failover_.Push();  // the ring frees as the kernel takes its bytes
      case Carriage::kHeld:
      case Carriage::kFailing:
        break;
    }
    // Nothing credited: a full ring, so nothing can be sent.
    return failover_.published() - ring_size();
  }
  void TxCopy(uint32_t offset, const void* src, size_t len) noexcept override {
    if (len >= kPopulateMin && offset + len > populated_) Populate(offset + len);
    std::memcpy(tx_data_ + offset, src, len);
  }
  void TxPublish(uint64_t produced) noexcept override {
    // Into the region first (once on TCP its cursor is nobody's business; writing it costs
    // nothing), then ours: Publish's sequentially consistent store and load also order the
    // publish before the reader's sleep flag, read below.
    tx_->produced.store(produced, std::memory_order_release);
    if (failover_.Publish(produced) == Carriage::kTcp) return;
    WakeState& wake = tx_->wake;
    if (proxy::TakeReaderAsk(&wake)) proxy::WriteToken(&wake, peer_b_);
  }
  bool TxPeerClosed() const noexcept override {
    switch (failover_.carriage()) {
      case Carriage::kTransport:
        return tx_->reader_closed.load(std::memory_order_acquire) != 0;
      case Carriage::kTcp:
        return failover_.peer_closed();
      case Carriage::kHeld:
      case Carriage::kFailing:
        break;
    }
    return false;
  }
  WakeState* TxWake() noexcept override { return &tx_->wake; }

  void CloseTx() noexcept override {
    // Held: settling finishes it, on the rings or on TCP.
    if (failover_.FinishTx() != Carriage::kTransport) return;
    tx_->eof.store(1, std::memory_order_release);
    // EOF on the peer's proxy: its sleepers wake, its pollers see EPOLLIN|EPOLLRDHUP.
    sys::shutdown(peer_b_, SHUT_WR);
  }
  void CloseRx() noexcept override {
    if (failover_.carriage() != Carriage::kTransport) return;
    rx_->reader_closed.store(1, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    proxy::Unfill(peer_b_);  // a peer sender asleep on a full ring wakes up to EPIPE
  }
  ChannelControl* control() noexcept override { return this; }
  void Abort() noexcept override { aborted_ = true; }
  bool WithdrawUninstalled() noexcept override {
    std::lock_guard<std::mutex> lock(failover_.lock());
    const int fd = rendezvous_.exchange(-1);
    if (fd < 0) return false;  // settled on the rings, or a server's: claimed
    sys::close(fd);
    deadline_.store(0, std::memory_order_release);
    aborted_ = true;  // nothing was installed: nothing of ours to flush when destroyed
    return WithdrawClaim();
  }

  bool OnPeerFailover(const wire::Failover& peer) noexcept override;
  AnchorFailover* failover() noexcept override { return &failover_; }
  bool AnchorCarriesStream() const noexcept override {
    return failover_.carriage() != Carriage::kTransport;
  }
  void OnAnchorReady(uint32_t events) noexcept override { failover_.OnAnchorReady(events); }

  bool HandBack(uint64_t consumed, int timeout_ms) noexcept override;
  bool SharedWithOtherProcess() const noexcept override;
  void HoldAcrossFork() noexcept override { TakeHolderLock(); }

  uint64_t SettleDeadline() const noexcept override {
    return deadline_.load(std::memory_order_acquire);
  }
  int SettleFd() const noexcept override { return rendezvous_.load(std::memory_order_acquire); }
  Settlement Settle(uint64_t now_ms, Reason* why) noexcept override;
  void OnPeerViolation() noexcept override {
    // The peer learns it from the anchor (EOF, then the reset): its control thread ends
    // its side. Nothing more of ours goes into the region.
    aborted_ = true;
    if (anchor_ >= 0) sys::shutdown(anchor_, SHUT_RDWR);
  }

 private:
  // Whether the process that accepted our connection was one that did not take it:
  // Reason::kNone while that is not known yet (deadline_ then says when to look again).
  Reason TakenElsewhere(uint64_t now_ms) noexcept;
  // The claim as this end reads it (any value the server had no business writing: not
  // taken, so the connection cannot be on the rings).
  Claim ReadClaim() const noexcept {
    const uint32_t value = claim_->load(std::memory_order_acquire);
    return value <= uint32_t(Claim::kAbandoned) ? Claim(value) : Claim::kAbandoned;
  }
  bool WithdrawClaim() noexcept { return shm::WithdrawClaim(claim_); }
  void Settled() noexcept {
    deadline_.store(0, std::memory_order_release);
    if (const int fd = rendezvous_.exchange(-1); fd >= 0) sys::close(fd);
  }
  // Settled on the rings: what the listener said of itself (stored before its claim, which
  // we read with acquire) decides how the next connections there register.
  void SettledTaken() noexcept {
    const auto& header = static_cast<RegionControl*>(region_)->header;
    if (listener_inode_ != 0 &&
        (header.listener_flags.load(std::memory_order_relaxed) & kListenerSolo) != 0)
      NoteSoloListener(listener_inode_);
    Settled();
  }

  // Each process holding this end keeps a read lock on a byte of its TCP anchor, which
  // only the holders of this end have (the peer's anchor is another socket, even in this
  // process). POSIX locks belong to a process, are not inherited by fork and vanish when
  // the process closes the file or dies, so a conflicting lock is exactly another live
  // holder. A process drops its locks on a file when it closes any descriptor of it, so
  // the lock is taken only once the anchor's one copy is in its hidden place: at fork, the
  // only way a second holder comes (HoldAcrossFork). Not on the proxy's B: the peer holds
  // a copy of it, and in a process that holds both ends the peer's close of that copy
  // would drop this end's lock.
  void TakeHolderLock() noexcept {
    if (anchor_ < 0) return;
    flock lock{};
    lock.l_type = F_RDLCK;
    lock.l_whence = SEEK_SET;
    lock.l_start = 0;
    lock.l_len = 1;
    sys::fcntl(anchor_, F_SETLK, reinterpret_cast<long>(&lock));
  }

  void WakeReaderNow() const noexcept override {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = rx_->wake;
    if (proxy::TakeReaderAsk(&wake)) proxy::WriteToken(&wake, own_b_);
  }
  void WakeWriterNow() const noexcept override {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = tx_->wake;
    if (wake.writer_waiting.load(std::memory_order_relaxed) && wake.writer_waiting.exchange(0))
      proxy::Unfill(own_b_);
  }

  void* region_;
  size_t region_size_;
  const uint64_t nonce_;
  int peer_b_;  // B of the peer's proxy: tokens for its readers, fill drained for its writers
  int own_b_;   // B of our own proxy (the Stream's): wake-ups once TCP carries the stream
  const int anchor_;
  // Client, until its registration is decided: the socket the listener answers on (read by
  // the control thread to watch it, closed here once settled).
  std::atomic<int> rendezvous_;
  wire::Endpoint client_;          // the 4-tuple (client only; the port maybe 0
  const wire::Endpoint server_;    // until TakenElsewhere reads it)
  const uint64_t listener_inode_;  // (client only)
  // Client: the listener is in another network namespace (found in the rendezvous
  // directory), where this one's kernel cannot see the server's end; the listener itself
  // says DECLINE when the connection went elsewhere.
  const bool across_namespaces_;
  std::atomic<uint32_t>* const claim_;  // in the region: shm.h, Claim
  DirectionControl* tx_;
  DirectionControl* rx_;
  uint8_t* tx_data_;
  // How much of our ring a large write has had the kernel allocate ahead: the first pass
  // over a fresh ring would otherwise take a page fault per page (a fresh connection's
  // large writes: 16 us per KiB on a paravirtualised host), where MADV_POPULATE_WRITE
  // allocates a chunk in one call. Small writes fault their pages in as before (no system
  // call per message). Only grows; sends are serialised by the stream's side lock.
  size_t populated_ = 0;
  bool populate_works_ = true;
  static constexpr size_t kPopulateMin = 16 * 1024;     // a write this large populates
  static constexpr size_t kPopulateChunk = 256 * 1024;  // one this large, also as far ahead
  void Populate(size_t end) noexcept {
    const size_t want = end - populated_ >= kPopulateChunk ? end + kPopulateChunk : end;
    const size_t upto = std::min<size_t>(ring_size(), (want + 4095) & ~size_t(4095));
    // (Best effort: a kernel without it, before 5.14, faults the pages in as before.)
    if (populate_works_ &&
        madvise(tx_data_ + populated_, upto - populated_, 23 /* MADV_POPULATE_WRITE */) != 0)
      populate_works_ = false;
    populated_ = upto;
  }
  uint8_t* rx_data_;

  std::atomic<uint64_t> deadline_{0};
  // Client, while unsettled (control thread only): when it started waiting, the interval
  // to its next look, and when it first saw its connection accepted.
  uint64_t started_ms_ = 0;
  uint64_t look_ms_ = kFirstLookMs;
  uint64_t accepted_ms_ = 0;
  bool aborted_ = false;
  // The carriage and this end's own cursors (never read back from the region); its lock
  // serialises the peer's hand-back, ours and settling.
  AnchorFailover failover_;
};

// Only a client settles: its listener's answer, news on the anchor and its looks prompt it,
// and the claim word decides.
ChannelControl::Settlement ShmChannel::Settle(uint64_t now_ms, Reason* why) noexcept {
  std::lock_guard<std::mutex> lock(failover_.lock());
  const int rendezvous = rendezvous_.load(std::memory_order_relaxed);
  if (deadline_.load(std::memory_order_relaxed) == 0 || rendezvous < 0) return Settlement::kSettled;
  // The answer, read to clear the descriptor's readiness: it only says which way the claim
  // went, or why the listener will not take the connection.
  uint8_t buf[wire::kMaxMessageSize];
  const ssize_t n = sys::recv(rendezvous, buf, sizeof(buf), MSG_DONTWAIT);
  Reason plain = Reason::kNone;
  if (n > 0) {
    wire::Message msg;
    size_t used = 0;
    const wire::ParseStatus st = wire::ParseMessage(buf, size_t(n), &msg, &used);
    if (st == wire::ParseStatus::kOk && used == size_t(n) && msg.type == wire::Type::kDecline &&
        msg.decline.nonce == nonce_) {
      plain = ReasonForDecline(msg.decline.reason);
    } else if (st != wire::ParseStatus::kOk || used != size_t(n) ||
               msg.type != wire::Type::kAccept || msg.accept.nonce != nonce_) {
      SLIP_LOG(kWarn, "shm: unexpected answer on the rendezvous (%s); plain",
               wire::ParseStatusName(st));
      plain = Reason::kDeclined;
    }
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    plain = Reason::kDeclined;  // the listener went away without taking it
  }
  switch (ReadClaim()) {
    case Claim::kTaken:
      SettledTaken();  // (the rings carried the stream from the start: nothing else changes)
      return Settlement::kSettled;
    case Claim::kOpen:
      break;
    case Claim::kWithdrawn:
    case Claim::kAbandoned:
      if (plain == Reason::kNone) plain = Reason::kDeclined;
      break;
  }
  if (plain == Reason::kNone) plain = TakenElsewhere(now_ms);
  if (plain == Reason::kNone) return Settlement::kPending;
  if (!WithdrawClaim()) {  // taken just now
    SettledTaken();
    return Settlement::kSettled;
  }
  if (plain == Reason::kDeclined || plain == Reason::kRendezvousBusy)
    SLIP_LOG(kInfo, "shm: the listener declined the registration (%s)", ReasonName(plain));
  Settled();
  // The server never reads our ring now: everything we published since is still there,
  // and it sent nothing over it: the stream goes to the anchor from byte 0. (The region
  // is shared with the listener's own process only, verified, so its rings may carry the
  // TCP path.)
  failover_.EnterTcp(0, 0);
  *why = plain;
  return Settlement::kPlain;
}

Reason ShmChannel::TakenElsewhere(uint64_t now_ms) noexcept {
  // Bytes or the end from the server before it took the registration: the process that
  // accepted the connection has it as plain TCP (a plain member of the listener's group, or
  // a sibling without the registration). Nothing of ours was sent on it.
  const AnchorPeek peek = PeekAnchor(anchor_);
  if (peek.kind != AnchorPeek::Kind::kNone) return Reason::kAcceptedElsewhere;
  if (now_ms < deadline_.load(std::memory_order_relaxed)) return Reason::kNone;
  if (now_ms - started_ms_ >= kGiveUpMs) return Reason::kHandshakeTimeout;
  // (What the listener said of itself, once its worker read the registration: a hint.)
  const uint32_t flags =
      static_cast<RegionControl*>(region_)->header.listener_flags.load(std::memory_order_relaxed);
  const uint64_t grace = (flags & kListenerShared) != 0 ? kSharedTakeGraceMs : kTakeGraceMs;
  if (accepted_ms_ != 0 && now_ms - accepted_ms_ >= grace) return Reason::kAcceptedElsewhere;
  if (accepted_ms_ == 0 && !across_namespaces_) {
    // The kernel knows whether a process accepted the server's end: it has an inode then.
    // (Registered by its socket, the client learns its port from the anchor: connect()
    // picked it.)
    sockaddr_storage local, remote;
    SocketInfo end;
    if (client_.port == 0) LocalEndpoint(anchor_, &client_);
    if (wire::SockaddrFromEndpoint(server_, &local) &&
        wire::SockaddrFromEndpoint(client_, &remote) &&
        FindConnection(reinterpret_cast<sockaddr*>(&local), reinterpret_cast<sockaddr*>(&remote),
                       &end) == 0 &&
        end.inode != 0)
      accepted_ms_ = now_ms;
  }
  const uint64_t next = accepted_ms_ != 0 ? accepted_ms_ + grace : now_ms + look_ms_;
  look_ms_ = std::min(2 * look_ms_, kLookMaxMs);
  deadline_.store(next, std::memory_order_release);
  return Reason::kNone;
}

bool ShmChannel::OnPeerFailover(const wire::Failover& peer) noexcept {
  std::lock_guard<std::mutex> lock(failover_.lock());
  if (anchor_ < 0 || failover_.carriage() != Carriage::kTransport ||
      deadline_.load(std::memory_order_relaxed) != 0)
    return false;
  if (SharedWithOtherProcess()) {
    SLIP_LOG(kWarn,
             "shm: the peer hands the connection back to TCP, but another process (fork) "
             "holds this end too and would keep writing to the ring; reset");
    return false;
  }
  // The peer stopped writing before it sent its FAILOVER: everything it published is in
  // our ring (checked against what we consumed: the cursor is the peer's).
  const uint64_t received = rx_->produced.load(std::memory_order_acquire);
  if (received - failover_.consumed() > ring_size()) {
    SLIP_LOG(kWarn, "shm: the peer's cursor is out of range at its hand-back; reset");
    return false;
  }
  return failover_.OnPeerFailover(peer, received, tx_->consumed.load(std::memory_order_acquire)) ==
         AnchorFailover::Outcome::kContinued;
}

bool ShmChannel::HandBack(uint64_t consumed, int timeout_ms) noexcept {
  std::lock_guard<std::mutex> lock(failover_.lock());
  // On TCP already (the peer handed back first), the bytes the application did not read
  // came over TCP: they cannot be given back to the anchor. An unsettled connection has
  // nothing agreed to hand back.
  if (anchor_ < 0 || failover_.carriage() != Carriage::kTransport ||
      deadline_.load(std::memory_order_relaxed) != 0)
    return false;
  aborted_ = true;  // whatever happens, nothing of ours is left to flush
  // The peer's ring holds everything we published: normally nothing is resent.
  return failover_.HandBack(consumed, tx_->consumed.load(std::memory_order_acquire), timeout_ms);
}

bool ShmChannel::SharedWithOtherProcess() const noexcept {
  if (anchor_ < 0) return true;
  flock lock{};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = 0;
  lock.l_len = 1;
  if (sys::fcntl(anchor_, F_GETLK, reinterpret_cast<long>(&lock)) != 0) return true;
  return lock.l_type != F_UNLCK;
}

}  // namespace

std::unique_ptr<Channel> MakeChannel(const ChannelSetup& setup) noexcept {
  return std::unique_ptr<Channel>(new (std::nothrow) ShmChannel(setup));
}

}  // namespace slip::shm
