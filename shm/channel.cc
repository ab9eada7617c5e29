// The shm Channel: plain stores into the peer's ring with release/acquire on the cursors,
// and proxy wake-ups only when the other side announced it is going to sleep.
//
// Everything in the region is written by a process we do not trust (docs/SECURITY.md):
// the ring size and the nonce are snapshots taken when the region was validated, and this
// end's own cursors (what it published, what it consumed) are kept here, never read back
// from the region. The cursors the peer writes are range-checked by Stream.
//
// Carriage (core/failover.h; docs/DESIGN.md, "Settling a connection"):
//   held       server, the client's CONFIRM not arrived yet: no bytes, no space, either way
//   transport  the rings carry the stream (a client awaiting its listener's answer is here)
//   tcp        the anchor carries it: the peer handed the connection back (exec), or the
//              connection settled as plain after it was installed
// shm never fails on its own (memory does not go away under a live process), so it never
// starts a failover: it answers a peer's hand-back and settles as plain.
#include <sys/epoll.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/anchor_path.h"
#include "core/failover.h"
#include "core/log.h"
#include "core/sys.h"
#include "shm/region.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

// How long, after its deadline, a server waits for the CONFIRM of a client that committed
// to sending it (at least): only a client held up between the two takes longer, and that
// connection is then reset, never handed over as plain TCP.
constexpr uint64_t kCommittedWaitMs = 1000;

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
        holder_byte_(setup.is_client ? 0 : 1),
        peer_b_(setup.peer_b),
        own_b_(setup.own_b),
        anchor_(setup.anchor),
        rendezvous_(setup.rendezvous),
        timeout_ms_(setup.handshake_timeout_ms),
        claim_(&static_cast<RegionControl*>(setup.region)->header.claim),
        failover_("shm", this, setup.ring_size) {
    auto* control = static_cast<RegionControl*>(region_);
    uint8_t* to_server = static_cast<uint8_t*>(region_) + kControlPage;
    uint8_t* to_client = to_server + ring_size();
    tx_ = setup.is_client ? &control->to_server : &control->to_client;
    rx_ = setup.is_client ? &control->to_client : &control->to_server;
    tx_data_ = setup.is_client ? to_server : to_client;
    rx_data_ = setup.is_client ? to_client : to_server;
    if (setup.held || setup.rendezvous >= 0)
      deadline_.store(sys::MonotonicMs() + uint64_t(timeout_ms_), std::memory_order_relaxed);
    failover_.SetAnchor(anchor_);
    failover_.SetRings(rx_data_, tx_data_);
    failover_.SetOwnProxy(own_b_);
    if (setup.held) failover_.Hold();
    TakeHolderLock();
  }
  ~ShmChannel() override {
    // A client that never heard its listener's answer withdraws (its server then stays
    // plain); one whose server held it never confirmed, so there is nothing to undo.
    if (const int fd = rendezvous_.load(std::memory_order_relaxed); fd >= 0) {
      Withdraw();
      sys::close(fd);
    }
    // On TCP, bytes still in the ring would go away with it: they go to the anchor first.
    if (failover_.on_tcp() && !aborted_) failover_.FinishOnClose(5000);
    munmap(region_, region_size_);
    if (private_rings_) munmap(private_rings_, 2 * size_t(ring_size()));
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
    std::memcpy(tx_data_ + offset, src, len);
  }
  void TxPublish(uint64_t produced) noexcept override {
    // Into the region first (once on TCP its cursor is nobody's business; writing it costs
    // nothing), then ours: Publish's sequentially consistent store and load also order the
    // publish before the reader's sleep flag, read below.
    tx_->produced.store(produced, std::memory_order_release);
    if (failover_.Publish(produced) == Carriage::kTcp) return;
    WakeState& wake = tx_->wake;
    if (wake.reader_waiting.load(std::memory_order_relaxed) && wake.reader_waiting.exchange(0))
      proxy::WriteToken(&wake, peer_b_);
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

  bool OnPeerFailover(const wire::Failover& peer) noexcept override;
  bool OnPeerDecline() noexcept override;
  bool AnchorCarriesStream() const noexcept override {
    return failover_.carriage() != Carriage::kTransport;
  }
  void OnAnchorReady(uint32_t events) noexcept override { failover_.OnAnchorReady(events); }

  bool HandBack(uint64_t consumed, int timeout_ms) noexcept override;
  bool SharedWithOtherProcess() const noexcept override;
  void AfterForkChild() noexcept override { TakeHolderLock(); }

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
  Settlement SettleServer(uint64_t now_ms, Reason* why) noexcept;
  Settlement SettleClient(uint64_t now_ms, Reason* why) noexcept;
  // A connection settled as plain: the stream goes to the anchor from byte 0;
  // `private_rings`: leave the shared region (whoever registered it is not this
  // connection's peer). False when there is no memory for rings of our own.
  bool SettlePlain(bool private_rings) noexcept;
  bool SendConfirm() noexcept;
  void Withdraw() noexcept {
    uint32_t expected = uint32_t(Claim::kOpen);
    claim_->compare_exchange_strong(expected, uint32_t(Claim::kWithdrawn),
                                    std::memory_order_acq_rel);
  }
  void Settled() noexcept {
    deadline_.store(0, std::memory_order_release);
    if (const int fd = rendezvous_.exchange(-1); fd >= 0) sys::close(fd);
  }

  // Each process holding this end keeps a read lock on its proxy's B (our end of the
  // socketpair, which every holder of this end has, and which the peer holds but never
  // locks). POSIX locks belong to a process, are not inherited by fork and vanish when the
  // process closes the file or dies, so a conflicting lock is exactly another live holder.
  // (The region's memfd served before; it is no longer kept open.)
  void TakeHolderLock() noexcept {
    if (own_b_ < 0) return;
    flock lock{};
    lock.l_type = F_RDLCK;
    lock.l_whence = SEEK_SET;
    lock.l_start = holder_byte_;
    lock.l_len = 1;
    sys::fcntl(own_b_, F_SETLK, reinterpret_cast<long>(&lock));
  }

  void WakeReaderNow() const noexcept override {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = rx_->wake;
    if (wake.reader_waiting.load(std::memory_order_relaxed) && wake.reader_waiting.exchange(0))
      proxy::WriteToken(&wake, own_b_);
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
  const int holder_byte_;
  int peer_b_;  // B of the peer's proxy: tokens for its readers, fill drained for its writers
  int own_b_;   // B of our own proxy (the Stream's): wake-ups once TCP carries the stream
  const int anchor_;
  // Client, until its listener answered: the socket it answers on (read by the control
  // thread to watch it, closed here once settled).
  std::atomic<int> rendezvous_;
  const int timeout_ms_;
  std::atomic<uint32_t>* const claim_;  // in the region: shm.h, Claim
  DirectionControl* tx_;
  DirectionControl* rx_;
  uint8_t* tx_data_;
  uint8_t* rx_data_;
  void* private_rings_ = nullptr;  // a server's rings once it left a region it cannot trust

  std::atomic<uint64_t> deadline_{0};
  bool extended_ = false;  // the server's wait for a committed client (control thread only)
  bool aborted_ = false;
  // The carriage and this end's own cursors (never read back from the region); its lock
  // serialises the peer's hand-back, ours and settling.
  AnchorFailover failover_;
};

bool ShmChannel::SettlePlain(bool private_rings) noexcept {
  if (private_rings) {
    // Nothing was carried yet (the connection was held), so fresh rings lose nothing; the
    // region, and whoever holds it, are left out of the connection from here on.
    void* rings = mmap(nullptr, 2 * size_t(ring_size()), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rings == MAP_FAILED) return false;
    private_rings_ = rings;
    rx_data_ = static_cast<uint8_t*>(rings);
    tx_data_ = rx_data_ + ring_size();
    failover_.SetRings(rx_data_, tx_data_);
    if (peer_b_ >= 0) sys::close(peer_b_);
    peer_b_ = -1;
  }
  failover_.EnterTcp(0, 0);
  return true;
}

ChannelControl::Settlement ShmChannel::Settle(uint64_t now_ms, Reason* why) noexcept {
  std::lock_guard<std::mutex> lock(failover_.lock());
  if (deadline_.load(std::memory_order_relaxed) == 0) return Settlement::kSettled;
  return rendezvous_.load(std::memory_order_relaxed) >= 0 ? SettleClient(now_ms, why)
                                                          : SettleServer(now_ms, why);
}

// The server's side: the application has the connection; its client's first bytes decide.
ChannelControl::Settlement ShmChannel::SettleServer(uint64_t now_ms, Reason* why) noexcept {
  const AnchorPeek peek = PeekAnchor(anchor_);
  Reason plain = Reason::kNone;
  if (peek.Is(wire::Type::kConfirm)) {
    if (peek.msg.confirm.nonce == nonce_ && peek.msg.confirm.ring_size == ring_size()) {
      ConsumeAnchor(anchor_, peek);
      failover_.Release();
      if (failover_.finished()) CloseTx();
      Settled();
      // Whoever waited for space or bytes while held is owed a wake-up now, if there is
      // anything for them (a token for nothing would make an idle connection readable).
      WakeWriterNow();
      if (rx_->produced.load(std::memory_order_acquire) != failover_.consumed()) WakeReaderNow();
      return Settlement::kSettled;
    }
    // A client that confirmed a registration other than the one held here (the real one
    // lost to a same-uid forgery): it writes to a ring nobody reads, so the connection
    // can be neither accelerated nor plain.
    SLIP_LOG(kWarn,
             "shm: the client confirmed another registration than this connection's; "
             "resetting it");
    Settled();
    return Settlement::kReset;
  }
  if (peek.kind == AnchorPeek::Kind::kMessage || peek.kind == AnchorPeek::Kind::kBytes ||
      peek.kind == AnchorPeek::Kind::kEnd) {
    // Bytes that are not a CONFIRM come from a plain client (whoever registered this
    // 4-tuple was not its client): they are the application's. EOF or an error: the
    // application sees it on TCP.
    plain = Reason::kPeerNotSlipstream;
  }
  if (plain == Reason::kNone) {
    const Claim claim = Claim(claim_->load(std::memory_order_acquire));
    if (claim == Claim::kWithdrawn || claim == Claim::kAbandoned) {
      plain = Reason::kConnectSlow;
    } else if (now_ms >= deadline_.load(std::memory_order_relaxed)) {
      // Giving up is safe only while the client has not committed: the claim says so,
      // decided once for both ends. One that committed sends its CONFIRM next.
      uint32_t expected = uint32_t(Claim::kOpen);
      if (claim_->compare_exchange_strong(expected, uint32_t(Claim::kAbandoned),
                                          std::memory_order_acq_rel) ||
          expected != uint32_t(Claim::kConfirmed)) {
        plain = expected == uint32_t(Claim::kWithdrawn) ? Reason::kConnectSlow
                                                        : Reason::kHandshakeTimeout;
      } else if (!extended_) {
        extended_ = true;
        deadline_.store(now_ms + std::max<uint64_t>(uint64_t(timeout_ms_), kCommittedWaitMs),
                        std::memory_order_release);
        return Settlement::kPending;
      } else {
        SLIP_LOG(kWarn,
                 "shm: the client committed to its CONFIRM but it did not come; resetting "
                 "the connection rather than passing it on as plain TCP");
        Settled();
        return Settlement::kReset;
      }
    } else {
      return Settlement::kPending;
    }
  }
  Settled();
  if (!SettlePlain(/*private_rings=*/true)) {
    SLIP_LOG(kWarn, "shm: no memory to carry a plain connection; resetting it");
    return Settlement::kReset;
  }
  *why = plain;
  return Settlement::kPlain;
}

// The client's side: the listener answers its registration on the rendezvous socket.
ChannelControl::Settlement ShmChannel::SettleClient(uint64_t now_ms, Reason* why) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  ssize_t n =
      sys::recv(rendezvous_.load(std::memory_order_relaxed), buf, sizeof(buf), MSG_DONTWAIT);
  Reason plain = Reason::kNone;
  if (n > 0) {
    wire::Message msg;
    size_t used = 0;
    wire::ParseStatus st = wire::ParseMessage(buf, size_t(n), &msg, &used);
    if (st == wire::ParseStatus::kOk && used == size_t(n) && msg.type == wire::Type::kAccept &&
        msg.accept.nonce == nonce_) {
      // The server took the registration. Claim the connection and confirm it in band;
      // a server that gave up meanwhile (claim abandoned) has the connection as plain TCP.
      uint32_t expected = uint32_t(Claim::kOpen);
      if (!claim_->compare_exchange_strong(expected, uint32_t(Claim::kConfirmed),
                                           std::memory_order_acq_rel)) {
        plain = Reason::kHandshakeTimeout;
      } else if (!SendConfirm()) {
        // The CONFIRM may be half in the stream: neither path is safe.
        SLIP_LOG(kWarn, "shm: cannot send CONFIRM (%s); resetting", strerror(errno));
        Settled();
        return Settlement::kReset;
      } else {
        Settled();
        return Settlement::kSettled;
      }
    } else if (st == wire::ParseStatus::kOk && msg.type == wire::Type::kDecline) {
      plain = ReasonForDecline(msg.decline.reason);
      SLIP_LOG(kInfo, "shm: the listener declined the registration (%s)", ReasonName(plain));
    } else {
      SLIP_LOG(kWarn, "shm: unexpected answer on the rendezvous (%s); plain",
               wire::ParseStatusName(st));
      plain = Reason::kDeclined;
    }
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    plain = Reason::kDeclined;  // the listener went away without answering
  } else if (now_ms >= deadline_.load(std::memory_order_relaxed)) {
    plain = Reason::kHandshakeTimeout;
  } else {
    return Settlement::kPending;
  }
  Withdraw();
  Settled();
  // The server reads the rings only after our CONFIRM, which never comes: everything we
  // published since is still in our ring, and it sent nothing. The region is shared with
  // the listener's own process only (verified), so its rings may carry the TCP path.
  if (!SettlePlain(/*private_rings=*/false)) return Settlement::kReset;
  *why = plain;
  return Settlement::kPlain;
}

bool ShmChannel::SendConfirm() noexcept {
  wire::Message msg;
  msg.type = wire::Type::kConfirm;
  msg.confirm = wire::Confirm{nonce_, ring_size()};
  uint8_t buf[wire::kMaxMessageSize];
  const size_t len = wire::EncodeMessage(msg, buf, sizeof(buf));
  // The first bytes on a fresh connection: the socket's buffer is empty, so a short write
  // would mean a broken connection.
  ssize_t n;
  do {
    n = sys::send(anchor_, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n == ssize_t(len)) return true;
  if (n >= 0) errno = EPIPE;
  return false;
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

bool ShmChannel::OnPeerDecline() noexcept {
  std::lock_guard<std::mutex> lock(failover_.lock());
  if (anchor_ < 0 || failover_.carriage() != Carriage::kTransport ||
      deadline_.load(std::memory_order_relaxed) != 0 || SharedWithOtherProcess())
    return false;
  // The process that registered the connection never had it (another one accepted it), so
  // nobody wrote to our ring or read from the peer's: every byte we published is still
  // there from 0, and nothing arrived. Anything else is no decline of ours to continue from.
  if (rx_->produced.load(std::memory_order_acquire) != 0 ||
      tx_->consumed.load(std::memory_order_acquire) != 0)
    return false;
  // The region is shared with the listener's own process only (verified at registration),
  // so its rings may carry the TCP path, as for a client that settled as plain.
  failover_.EnterTcp(0, 0);
  return true;
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
  if (own_b_ < 0 || private_rings_) return true;
  flock lock{};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = holder_byte_;
  lock.l_len = 1;
  if (sys::fcntl(own_b_, F_GETLK, reinterpret_cast<long>(&lock)) != 0) return true;
  return lock.l_type != F_UNLCK;
}

}  // namespace

std::unique_ptr<Channel> MakeChannel(const ChannelSetup& setup) noexcept {
  return std::unique_ptr<Channel>(new (std::nothrow) ShmChannel(setup));
}

}  // namespace slip::shm
