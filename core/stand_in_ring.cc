#include "core/stand_in_ring.h"

#include <cstring>
#include <new>

#include "core/sys.h"

namespace slip {

std::unique_ptr<StandInRing> StandInRing::Create(const Names& names, uint32_t ring_size,
                                                 uint64_t nonce, uint64_t deadline_ms) noexcept {
  std::unique_ptr<StandInRing> ring(new (std::nothrow) StandInRing(names, ring_size));
  if (!ring) return nullptr;
  ring->rx_.reset(new (std::nothrow) uint8_t[ring_size]);
  ring->tx_.reset(new (std::nothrow) uint8_t[ring_size]);
  if (!ring->rx_ || !ring->tx_) return nullptr;
  ring->failover_.SetRings(ring->rx_.get(), ring->tx_.get());
  // Bytes that are not a CONFIRM: a client that went plain when its request was dropped.
  ring->plain_reason_ = Reason::kRendezvousBusy;
  ring->Hold(nonce, deadline_ms);
  return ring;
}

StandInRing::~StandInRing() {
  // (A fork child's copy leaves the anchor to the parent.)
  if (!orphaned_.load(std::memory_order_acquire) && !aborting_ && !on_transport()) FinishOnAnchor();
  if (const int b = proxy_b_.exchange(-1); b >= 0) sys::close(b);
}

void StandInRing::TxCopy(uint32_t offset, const void* src, size_t len) noexcept {
  std::memcpy(tx_.get() + offset, src, len);
}

RemoteRing::PeerCheck StandInRing::ConfirmedPeer(uint64_t, const char**) noexcept {
  held_broken_.store(true, std::memory_order_seq_cst);  // fails over once settled
  return PeerCheck::kReady;
}

}  // namespace slip
