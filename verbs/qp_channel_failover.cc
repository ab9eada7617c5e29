// QpChannel's failover to the TCP anchor, what verbs adds to core's (core/remote_ring.h:
// deciding, answering the peer's FAILOVER, the hand-back at exec): halting the queue pair,
// a server's DECLINE, closing after failover, flushing before a close, and the liveness
// check that finds a queue pair that stopped without telling anyone.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/qp_channel.h"
#include "verbs/qp_channel_internal.h"

namespace slip::verbs {

using namespace qp_channel_internal;

void QpChannel::HaltLocked() noexcept {
  SpinGuard guard(&poll_busy_);
  failover_.Begin();
  // Nothing may land in our ring after we count what arrived: the queue pair goes to the
  // error state first (late writes are dropped), then the completions that made it are
  // taken.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (qp_ && !rdma_released_.load(std::memory_order_relaxed))
    ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
  DrainLocked();
}

bool QpChannel::OnPeerDecline() noexcept {
  std::lock_guard<std::mutex> lock(failover_.lock());
  // (An URGENT or WINDOW of ours on the anchor would reach the declining server's
  // application as bytes: only a reset is safe then.)
  if (failover_.anchor() < 0 || orphaned_.load() || failover_.carriage() != Carriage::kTransport ||
      error_.load(std::memory_order_acquire) != 0 || failover_.said_in_band())
    return false;
  // The process whose rdma_cm listener took our request never had the connection (another
  // one accepted it): its queue pair wrote nothing into our ring and credited nothing.
  // (Counted once nothing more can land.)
  HaltLocked();
  if (rx_produced_.load(std::memory_order_acquire) != 0 ||
      tx_credit_.load(std::memory_order_acquire) != 0)
    return false;
  failover_.EnterTcp(0, 0);
  return true;
}

bool QpChannel::Flush(int timeout_ms) noexcept {
  switch (failover_.carriage()) {
    case Carriage::kTcp:
      return failover_.PushAll(timeout_ms);
    case Carriage::kFailing:
      return false;  // where to resend from is not known yet
    case Carriage::kHeld:
    case Carriage::kTransport:
      break;
  }
  return FlushRdma(timeout_ms, false);
}

bool QpChannel::FlushRdma(int timeout_ms, bool own_anchor) noexcept {
  if (!on_transport()) return false;
  ibv_send_wr fence{};
  fence.opcode = IBV_WR_RDMA_WRITE;  // zero length: nothing lands, only the acknowledgement
  fence.wr.rdma.remote_addr = peer_ring_addr_;
  fence.wr.rdma.rkey = peer_rkey_;
  uint64_t done_at = 0;
  if (!sq_.Fence(&fence, &done_at)) return false;
  if (sq_.completed() >= done_at) return true;
  const uint64_t deadline = sys::MonotonicMs() + uint64_t(timeout_ms);
  for (;;) {
    Poll();
    if (error_.load(std::memory_order_acquire) != 0 || !on_transport()) return false;
    // A peer that failed over waits for our answer, not for acknowledgements.
    if (own_anchor && TakePeerFailover(0)) return false;
    // A peer that went away acknowledges nothing more (our queue pair, ours and not
    // rdma_cm's, would retry for seconds). One that only closed still acknowledges: its
    // queue pair lives until its own notes are acknowledged, and ours (EOF, CLOSED) must
    // arrive, or it would take our disconnect for a failing transport.
    if (peer_disconnected_.load(std::memory_order_acquire))
      return peer_closed_.load(std::memory_order_acquire);
    if (sq_.completed() >= done_at) return true;
    if (sys::MonotonicMs() > deadline) return false;
    sched_yield();
  }
}

// ------------------------------------------------------------------------ liveness

void CheckAllConns(uint64_t now_ms) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (QpChannel* c = g_registry_head; c; c = c->next_) {
    c->CheckLiveness(now_ms);
    if (c->failover_.on_tcp() && !c->rdma_released())
      c->ReleaseRdma("the stream is on TCP for good");
  }
}

void QpChannel::CheckLiveness(uint64_t now_ms) noexcept {
  // (stream_live_ first: it orders the peer's ring address and key before their use.)
  if (!stream_live_.load(std::memory_order_acquire) || orphaned_.load(std::memory_order_relaxed) ||
      parked_.load(std::memory_order_relaxed) || failover_.carriage() != Carriage::kTransport ||
      error_.load(std::memory_order_acquire) != 0 || rdma_released_.load()) {
    live_ = Liveness{};
    return;
  }
  // Anything that moved: bytes in, credit back, sends acknowledged (each only grows, so
  // their sum changes whenever one does).
  const uint64_t progress = rx_produced_.load(std::memory_order_relaxed) +
                            tx_credit_.load(std::memory_order_relaxed) + sq_.completed();
  if (progress != live_.progress || live_.quiet_since_ms == 0 || !SomebodyWaits()) {
    // (Nobody waiting: nobody can hang on it; the first to wait starts the clock.)
    live_ = Liveness{progress, now_ms, 0};
    return;
  }
  if (now_ms - live_.quiet_since_ms < kQuietMs) return;
  // Quiet while somebody waits: the data or credit may simply not be sent yet (a peer
  // that computes), or the path may be dead without anybody having been told.
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp_, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state != IBV_QPS_RTS &&
      attr.qp_state != IBV_QPS_SQD) {
    SLIP_LOG(kWarn,
             "verbs: queue pair %u is in state %d with nothing reported: its RDMA path "
             "is taken as failed",
             qp_num_, int(attr.qp_state));
    live_ = Liveness{};
    TransportFailed(wire::FailoverCause::kTransportError);
    return;
  }
  if (live_.probe_done_at == 0) {
    // The peer's queue pair must acknowledge a write; one that died without telling (no
    // disconnect) lets it run into the transport's retry limit: a completion error.
    // (Never waiting for the send queue: a writer holding it, or a full queue, already has
    // writes in flight for the transport to judge.)
    ibv_send_wr probe{};
    probe.opcode = IBV_WR_RDMA_WRITE;  // zero length: nothing lands, only the acknowledgement
    probe.wr.rdma.remote_addr = peer_ring_addr_;
    probe.wr.rdma.rkey = peer_rkey_;
    uint64_t done_at = 0;
    switch (sq_.TryPost(&probe, 1, &done_at)) {
      case SendQueue::Result::kPosted:
        live_.probe_done_at = done_at;
        break;
      case SendQueue::Result::kRefused:
        TransportFailed(wire::FailoverCause::kTransportError);
        break;
      case SendQueue::Result::kNoRoom:
        break;
    }
    return;
  }
  if (sq_.completed() >= live_.probe_done_at) {
    live_ = Liveness{progress, now_ms, 0};  // the peer answered: alive, and quiet
  }
}

}  // namespace slip::verbs
