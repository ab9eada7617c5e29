// The shm Channel: plain stores into the peer's ring with release/acquire on the cursors,
// and proxy wake-ups only when the other side announced it is going to sleep.
#include <sys/mman.h>

#include <cstring>

#include "core/sys.h"
#include "shm/region.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

class ShmChannel final : public Channel {
 public:
  // `peer_b` is B of the peer's proxy: tokens for its readers, fill drained for its writers.
  ShmChannel(void* region, size_t region_size, bool is_client, int peer_b) noexcept
      : Channel(static_cast<RegionControl*>(region)->header.ring_size),
        region_(region),
        region_size_(region_size),
        peer_b_(peer_b) {
    auto* control = static_cast<RegionControl*>(region);
    uint8_t* to_server = static_cast<uint8_t*>(region) + kControlPage;
    uint8_t* to_client = to_server + ring_size();
    tx_ = is_client ? &control->to_server : &control->to_client;
    rx_ = is_client ? &control->to_client : &control->to_server;
    tx_data_ = is_client ? to_server : to_client;
    rx_data_ = is_client ? to_client : to_server;
  }
  ~ShmChannel() override {
    munmap(region_, region_size_);
    sys::close(peer_b_);
  }

  TransportKind kind() const noexcept override { return TransportKind::kShm; }

  uint64_t RxProduced() const noexcept override {
    return rx_->produced.load(std::memory_order_acquire);
  }
  const uint8_t* RxData() const noexcept override { return rx_data_; }
  void RxConsumed(uint64_t consumed) noexcept override {
    rx_->consumed.store(consumed, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = rx_->wake;
    if (wake.writer_waiting.load(std::memory_order_relaxed) && wake.writer_waiting.exchange(0))
      proxy::Unfill(peer_b_);
  }
  bool RxEof() const noexcept override { return rx_->eof.load(std::memory_order_acquire) != 0; }
  WakeState* RxWake() noexcept override { return &rx_->wake; }

  uint64_t TxConsumed() const noexcept override {
    return tx_->consumed.load(std::memory_order_acquire);
  }
  void TxCopy(uint32_t offset, const void* src, size_t len) noexcept override {
    std::memcpy(tx_data_ + offset, src, len);
  }
  void TxPublish(uint64_t produced) noexcept override {
    tx_->produced.store(produced, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WakeState& wake = tx_->wake;
    if (wake.reader_waiting.load(std::memory_order_relaxed) && wake.reader_waiting.exchange(0))
      proxy::WriteToken(&wake, peer_b_);
  }
  bool TxPeerClosed() const noexcept override {
    return tx_->reader_closed.load(std::memory_order_acquire) != 0;
  }
  WakeState* TxWake() noexcept override { return &tx_->wake; }

  void CloseTx() noexcept override {
    tx_->eof.store(1, std::memory_order_release);
    // EOF on the peer's proxy: its sleepers wake, its pollers see EPOLLIN|EPOLLRDHUP.
    sys::shutdown(peer_b_, SHUT_WR);
  }
  void CloseRx() noexcept override {
    rx_->reader_closed.store(1, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    proxy::Unfill(peer_b_);  // a peer sender asleep on a full ring wakes up to EPIPE
  }

 private:
  void* region_;
  size_t region_size_;
  int peer_b_;
  DirectionControl* tx_;
  DirectionControl* rx_;
  uint8_t* tx_data_;
  uint8_t* rx_data_;
};

}  // namespace

std::unique_ptr<Channel> MakeChannel(void* region, size_t region_size, bool is_client,
                                     int peer_b) noexcept {
  return std::unique_ptr<Channel>(new (std::nothrow)
                                      ShmChannel(region, region_size, is_client, peer_b));
}

}  // namespace slip::shm
