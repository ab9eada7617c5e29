// The shm Channel: plain stores into the peer's ring with release/acquire on the cursors,
// and proxy wake-ups only when the other side announced it is going to sleep.
//
// A connection can leave shared memory for its TCP anchor (docs/DESIGN.md, "Exec"): the
// peer hands it back before it execs (HandBack on its side, OnPeerFailover on ours). From
// then on this end keeps its rings and cursors, but fills and drains them over TCP
// (AnchorPath), as a verbs connection does after failover.
#include <sys/epoll.h>
#include <sys/mman.h>

#include <cstring>
#include <mutex>

#include "core/anchor_path.h"
#include "core/log.h"
#include "core/sys.h"
#include "shm/region.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

class ShmChannel final : public Channel {
 public:
  ShmChannel(void* region, size_t region_size, int memfd, bool is_client, int peer_b,
             int own_b) noexcept
      : Channel(static_cast<RegionControl*>(region)->header.ring_size),
        region_(region),
        region_size_(region_size),
        memfd_(memfd),
        holder_byte_(is_client ? 0 : 1),
        peer_b_(peer_b),
        own_b_(own_b) {
    auto* control = static_cast<RegionControl*>(region);
    uint8_t* to_server = static_cast<uint8_t*>(region) + kControlPage;
    uint8_t* to_client = to_server + ring_size();
    tx_ = is_client ? &control->to_server : &control->to_client;
    rx_ = is_client ? &control->to_client : &control->to_server;
    tx_data_ = is_client ? to_server : to_client;
    rx_data_ = is_client ? to_client : to_server;
    TakeHolderLock();
  }
  ~ShmChannel() override {
    // On TCP, bytes still in the ring would go away with it: they go to the anchor first.
    if (tcp() && !aborted_) {
      const uint64_t published = tx_->produced.load(std::memory_order_acquire);
      path_.Finish(published);
      if (!path_.PushAll(published, 5000))
        SLIP_LOG(kWarn, "shm: closing with %llu bytes not taken by the TCP connection",
                 (unsigned long long)(published - path_.sent()));
    }
    munmap(region_, region_size_);
    sys::close(peer_b_);
    if (memfd_ >= 0) sys::close(memfd_);
  }

  TransportKind kind() const noexcept override { return TransportKind::kShm; }

  uint64_t RxProduced() const noexcept override {
    if (tcp()) {
      uint64_t received = path_.Pull(rx_->consumed.load(std::memory_order_acquire));
      WakeAtEnd();
      return received;
    }
    return rx_->produced.load(std::memory_order_acquire);
  }
  const uint8_t* RxData() const noexcept override { return rx_data_; }
  void RxConsumed(uint64_t consumed) noexcept override {
    rx_->consumed.store(consumed, std::memory_order_release);
    if (tcp()) return;  // TCP has its own window
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = rx_->wake;
    if (wake.writer_waiting.load(std::memory_order_relaxed) && wake.writer_waiting.exchange(0))
      proxy::Unfill(peer_b_);
  }
  bool RxEof() const noexcept override {
    if (tcp()) return path_.eof();
    return rx_->eof.load(std::memory_order_acquire) != 0;
  }
  WakeState* RxWake() noexcept override { return &rx_->wake; }
  int Error() const noexcept override { return tcp() ? path_.error() : 0; }

  uint64_t TxConsumed() const noexcept override {
    // On TCP the ring frees as the kernel takes its bytes.
    if (tcp()) return path_.Push(tx_->produced.load(std::memory_order_acquire));
    return tx_->consumed.load(std::memory_order_acquire);
  }
  void TxCopy(uint32_t offset, const void* src, size_t len) noexcept override {
    std::memcpy(tx_data_ + offset, src, len);
  }
  void TxPublish(uint64_t produced) noexcept override {
    // Published before the mode is read (the fence also orders it before the reader's
    // sleep flag), as OnPeerFailover sets the mode before it pushes what is published: a
    // publish racing with the switch is sent by one of the two.
    tx_->produced.store(produced, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (mode_.load(std::memory_order_relaxed) == Mode::kTcp) {
      path_.Push(produced);
      return;
    }
    WakeState& wake = tx_->wake;
    if (wake.reader_waiting.load(std::memory_order_relaxed) && wake.reader_waiting.exchange(0))
      proxy::WriteToken(&wake, peer_b_);
  }
  bool TxPeerClosed() const noexcept override {
    if (tcp()) return path_.peer_closed();
    return tx_->reader_closed.load(std::memory_order_acquire) != 0;
  }
  WakeState* TxWake() noexcept override { return &tx_->wake; }

  void CloseTx() noexcept override {
    tx_->eof.store(1, std::memory_order_seq_cst);  // (the same race as TxPublish's)
    if (mode_.load(std::memory_order_seq_cst) == Mode::kTcp) {
      path_.Finish(tx_->produced.load(std::memory_order_acquire));
      return;
    }
    // EOF on the peer's proxy: its sleepers wake, its pollers see EPOLLIN|EPOLLRDHUP.
    sys::shutdown(peer_b_, SHUT_WR);
  }
  void CloseRx() noexcept override {
    rx_->reader_closed.store(1, std::memory_order_release);
    if (tcp()) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    proxy::Unfill(peer_b_);  // a peer sender asleep on a full ring wakes up to EPIPE
  }
  void Abort() noexcept override { aborted_ = true; }

  void SetAnchor(int fd) noexcept override { anchor_ = fd; }
  bool OnPeerFailover(const wire::Failover& peer) noexcept override;
  bool AnchorCarriesStream() const noexcept override { return tcp(); }
  void OnAnchorReady(uint32_t events) noexcept override;

  bool HandBack(uint64_t consumed, int timeout_ms) noexcept override;
  bool SharedWithOtherProcess() const noexcept override;
  void AfterForkChild() noexcept override { TakeHolderLock(); }

 private:
  enum class Mode : uint8_t { kShm, kTcp };

  bool tcp() const noexcept { return mode_.load(std::memory_order_acquire) == Mode::kTcp; }

  // Each process holding this end keeps a read lock on one byte of the region's file
  // (byte 0 for the client's end, 1 for the server's). POSIX locks belong to a process,
  // are not inherited by fork and vanish when the process closes the file or dies, so a
  // conflicting lock is exactly another live holder.
  void TakeHolderLock() noexcept {
    if (memfd_ < 0) return;
    flock lock{};
    lock.l_type = F_RDLCK;
    lock.l_whence = SEEK_SET;
    lock.l_start = holder_byte_;
    lock.l_len = 1;
    sys::fcntl(memfd_, F_SETLK, reinterpret_cast<long>(&lock));
  }

  void WakeReaderNow() const noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = rx_->wake;
    if (wake.reader_waiting.load(std::memory_order_relaxed) && wake.reader_waiting.exchange(0))
      proxy::WriteToken(&wake, own_b_);
  }
  void WakeWriterNow() const noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = tx_->wake;
    if (wake.writer_waiting.load(std::memory_order_relaxed) && wake.writer_waiting.exchange(0))
      proxy::Unfill(own_b_);
  }
  // As the peer's CloseTx and a reset would on shm: readers see EOF (or the error) on the
  // proxy, writers wake. Once each: every later read of the ring would come here again.
  void WakeAtEnd() const noexcept {
    if ((path_.eof() || path_.error()) && !rx_end_woken_.exchange(true))
      sys::shutdown(own_b_, SHUT_WR);
    if ((path_.peer_closed() || path_.error()) && !tx_end_woken_.exchange(true))
      proxy::Unfill(own_b_);
  }

  void* region_;
  size_t region_size_;
  int memfd_;
  const int holder_byte_;
  int peer_b_;  // B of the peer's proxy: tokens for its readers, fill drained for its writers
  int own_b_;   // B of our own proxy (the Stream's): wake-ups once TCP carries the stream
  DirectionControl* tx_;
  DirectionControl* rx_;
  uint8_t* tx_data_;
  uint8_t* rx_data_;

  int anchor_ = -1;
  bool aborted_ = false;
  std::mutex switch_mu_;  // OnPeerFailover against HandBack
  std::atomic<Mode> mode_{Mode::kShm};
  mutable AnchorPath path_;
  mutable std::atomic<bool> rx_end_woken_{false};
  mutable std::atomic<bool> tx_end_woken_{false};
};

bool ShmChannel::OnPeerFailover(const wire::Failover& peer) noexcept {
  std::lock_guard<std::mutex> lock(switch_mu_);
  if (anchor_ < 0 || tcp()) return false;
  if (SharedWithOtherProcess()) {
    SLIP_LOG(kWarn,
             "shm: the peer hands the connection back to TCP, but another process (fork) "
             "holds this end too and would keep writing to the ring; reset");
    return false;
  }
  // Everything the peer published is in our ring; it consumed at least what it credited
  // and received nothing we did not publish.
  const uint64_t received = rx_->produced.load(std::memory_order_acquire);
  const uint64_t published = tx_->produced.load(std::memory_order_seq_cst);
  const uint64_t credited = tx_->consumed.load(std::memory_order_acquire);
  if (!FailoverFits(peer, credited, published, received)) return false;
  const wire::Failover answer{
      .received = received, .sent = published, .cause = wire::FailoverCause::kPeerRequest};
  if (!SendFailover(anchor_, answer, 1000)) {
    SLIP_LOG(kWarn, "shm: cannot answer the peer's FAILOVER on TCP (%s); reset", strerror(errno));
    return false;
  }
  path_.Start(anchor_, rx_data_, tx_data_, ring_size(), received, peer.received);
  mode_.store(Mode::kTcp, std::memory_order_seq_cst);
  if (tx_->eof.load(std::memory_order_seq_cst))
    path_.Finish(tx_->produced.load(std::memory_order_seq_cst));
  SLIP_LOG(kInfo,
           "shm: the peer handed the connection back to TCP (exec); resending %llu bytes from "
           "byte %llu",
           (unsigned long long)(published - peer.received), (unsigned long long)peer.received);
  OnAnchorReady(EPOLLIN | EPOLLOUT);
  // Send space jumped from the peer's last credit to what it received, and the peer's
  // proxy wakes nobody here any more.
  WakeWriterNow();
  WakeReaderNow();
  return true;
}

void ShmChannel::OnAnchorReady(uint32_t events) noexcept {
  if (!tcp()) return;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    uint64_t before = path_.received();
    path_.Pull(rx_->consumed.load(std::memory_order_acquire));
    if (path_.received() != before) WakeReaderNow();
  }
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) {
    uint64_t before = path_.sent();
    path_.Push(tx_->produced.load(std::memory_order_acquire));
    if (path_.sent() != before) WakeWriterNow();
  }
  WakeAtEnd();
}

bool ShmChannel::HandBack(uint64_t consumed, int timeout_ms) noexcept {
  std::lock_guard<std::mutex> lock(switch_mu_);
  // On TCP already (the peer handed back first), the bytes the application did not read
  // came over TCP: they cannot be given back to the anchor.
  if (anchor_ < 0 || tcp()) return false;
  aborted_ = true;  // whatever happens, nothing of ours is left to flush
  // The peer's ring holds everything we published: normally nothing is resent.
  return HandBackOnAnchor(anchor_, tx_data_, ring_size(), consumed,
                          tx_->consumed.load(std::memory_order_acquire),
                          tx_->produced.load(std::memory_order_seq_cst),
                          tx_->eof.load(std::memory_order_acquire) != 0, timeout_ms);
}

bool ShmChannel::SharedWithOtherProcess() const noexcept {
  if (memfd_ < 0) return true;
  flock lock{};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = holder_byte_;
  lock.l_len = 1;
  if (sys::fcntl(memfd_, F_GETLK, reinterpret_cast<long>(&lock)) != 0) return true;
  return lock.l_type != F_UNLCK;
}

}  // namespace

std::unique_ptr<Channel> MakeChannel(void* region, size_t region_size, int memfd, bool is_client,
                                     int peer_b, int own_b) noexcept {
  return std::unique_ptr<Channel>(
      new (std::nothrow) ShmChannel(region, region_size, memfd, is_client, peer_b, own_b));
}

}  // namespace slip::shm
