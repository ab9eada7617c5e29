// StreamConn's control side, what fabric adds to core's (core/remote_ring.h: settling,
// answering the peer's FAILOVER, the hand-back at exec): its endpoint at settling,
// halting (the stream goes on in a copy of the registered ring), and whether the peer's
// count of our bytes can be trusted.
//
// A client's REQ carried its ring, so a CONFIRM of the request settles the connection as
// soon as our endpoint for it is up (connected endpoints: it may come a moment after the
// client's).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/anchor_path.h"
#include "core/log.h"
#include "core/sanitizer.h"
#include "core/sys.h"
#include "fabric/stream_conn.h"
#include "fabric/stream_fabric.h"

namespace slip::fabric {

namespace {

// How long a failover waits for our writes' completions before it knows their order.
constexpr int kOrderWaitMs = 1000;

}  // namespace

void StreamConn::Hold(uint64_t nonce, uint64_t deadline_ms) noexcept {
  unproven_ = false;  // (its TCP connection is accepted)
  RemoteRing::Hold(nonce, deadline_ms);
}

RemoteRing::PeerCheck StreamConn::ConfirmedPeer(uint64_t now_ms, const char**) noexcept {
  if (ep_.load(std::memory_order_acquire) == nullptr) {
    // Its client's endpoint was connected before its SYN left, but ours may hear of it a
    // moment later (the provider's last handshake message, the progress thread). An
    // endpoint that went down: nothing to wait for.
    if (fabric_->connected() && link_state_.load(std::memory_order_acquire) != LinkState::kDown &&
        now_ms < deadline_ms_)
      return PeerCheck::kWait;
    held_broken_.store(true, std::memory_order_seq_cst);  // fails over once settled
  }
  return PeerCheck::kReady;
}

void StreamConn::HaltLocked() noexcept {
  failover_.Begin();
  halted_.store(true, std::memory_order_seq_cst);
  // (Sends: a message being copied into the ring lands before the copy below, or not at
  // all; TakeSent.)
  while (rx_copying_.load(std::memory_order_seq_cst) != 0) sched_yield();
  if (rx_copy_) return;
  // The peer's writes in flight may still land in the registered ring, which stays as it
  // is (taking its registration away would break the provider's connection to that peer
  // for its other streams): the stream goes on in a copy.
  std::unique_ptr<uint8_t[]> copy(new (std::nothrow) uint8_t[ring_size()]);
  if (!copy) {
    rx_mr_.reset();  // (no memory: the peer's late writes fail instead)
    return;
  }
  {
    // (Where the peer's late writes land meanwhile is space no cursor published: the
    // stream never reads it from the copy.)
    san::PeerMemoryReads peer_writes;
    std::memcpy(copy.get(), rx_ring_.load(std::memory_order_relaxed), ring_size());
  }
  rx_ring_.store(copy.get(), std::memory_order_release);
  failover_.SetRings(copy.get(), tx_ring_);
  rx_copy_ = std::move(copy);
}

bool StreamConn::PeerCountTrusted() noexcept {
  // Where a write may land after an earlier one failed (StreamFabric::checks_write_order),
  // failing over would deliver bytes that never came: reset instead.
  if (!fabric_->checks_write_order() || WritesLandedInOrder(kOrderWaitMs)) return true;
  SLIP_LOG(kWarn,
           "fabric: a write failed and a later one may have landed (the provider connected "
           "again): the peer's count of our bytes cannot be trusted; resetting");
  Fail(ECONNRESET);
  return false;
}

}  // namespace slip::fabric
