// StreamConn's own completion queue (connected endpoints): who polls it, who sleeps on its
// descriptor, and when the progress thread watches it, by the rules of docs/DESIGN.md ("A
// connection's own completion queue"), over libfabric's wait objects: fi_trywait takes
// what the queue holds and asks for an event on its next completion (the verbs provider:
// drains the channel's events, ibv_req_notify_cq), or says that completions are there to
// take first. Another thread that takes the queue's events first (a trywait of its own)
// takes the completion too, and the note it hands in wakes the announced reader through
// the proxy (WakeReaderNow). The event's handler polls, which sets the shot again while it
// is still wanted. Where the provider moves data only when asked (FI_PROGRESS_MANUAL:
// tcp), the thread watches every connection from the moment its endpoint is up, as it
// watched the process's one queue.
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include "core/proxy.h"
#include "fabric/stream_conn.h"
#include "fabric/stream_fabric.h"

namespace slip::fabric {

namespace {

// fi_trywait answers -FI_EAGAIN while completions wait; each answer costs a poll, and a
// queue that keeps filling is one whose connection is busy (its waiters have news).
constexpr int kArmTries = 16;

}  // namespace

int StreamConn::Poll() noexcept {
  if (!cq_) return fabric_->Poll();
  if (orphaned_.load(std::memory_order_relaxed)) return 0;
  const int taken = (tx_cq_ ? fabric_->Drain(tx_cq_.get(), this) : 0) + DrainOwn();
  if (!watched_.load(std::memory_order_relaxed) && WantsProgress()) WatchFromProgress();
  return taken;
}

int StreamConn::DrainOwn() noexcept {
  if (!sends_) return fabric_->Drain(cq_.get(), this);
  // Whoever finds the queue busy asks the thread at it for another round (wanted), which
  // it sees after letting go: a message that came after its last read is never left.
  int taken = 0;
  rx_drain_wanted_.store(true, std::memory_order_seq_cst);
  while (rx_drain_wanted_.load(std::memory_order_seq_cst)) {
    if (rx_draining_.exchange(true, std::memory_order_seq_cst)) return taken;
    rx_drain_wanted_.store(false, std::memory_order_seq_cst);
    taken += fabric_->Drain(cq_.get(), this);
    rx_draining_.store(false, std::memory_order_seq_cst);
  }
  return taken;
}

bool StreamConn::WantsProgress() const noexcept {
  if (!on_transport()) return false;  // the anchor's news come through the control thread
  // A provider that moves data only when asked (tcp) needs it asked on both ends whether
  // anybody waits or not: the peer's writes complete (delivered) only once ours took them.
  if (fabric_->manual_progress()) return true;
  return SomebodyWaitsOnProxy();
}

bool StreamConn::ArmCq() noexcept {
  fid* cq = &cq_->fid;
  for (int i = 0; i < kArmTries; ++i) {
    const int rc = fi_trywait(fabric_->domain().fabric(), &cq, 1);
    if (rc == FI_SUCCESS) return true;
    if (rc != -FI_EAGAIN) return false;
    DrainOwn();
  }
  return false;
}

void StreamConn::WatchFromProgress() noexcept {
  if (cq_fd_ < 0 || orphaned_.load(std::memory_order_relaxed) ||
      watched_.exchange(true, std::memory_order_seq_cst))
    return;
  // Not armed (a queue that keeps filling) or not watched: the thread's turns poll it.
  ArmCq();
  if (!fabric_->WatchConn(cq_fd_, tag_, &watch_added_))
    watched_.store(false, std::memory_order_seq_cst);
}

void StreamConn::OnWatchEvent() noexcept {
  // The one shot fired. Cleared before polling: a waiter that announces itself after this
  // store sets it again (its own poll), one that did before is seen by ours.
  watched_.store(false, std::memory_order_seq_cst);
  Poll();
}

void StreamConn::OnProgressTurn() noexcept {
  if (cq_ && (cq_fd_ < 0 || WantsProgress())) Poll();
}

int StreamConn::BeginRxSleep() noexcept {
  if (!cq_ || cq_fd_ < 0 || proxy_b_.load() < 0 || orphaned_.load(std::memory_order_relaxed))
    return -1;
  // After failover the news come from the anchor, through the control thread and the proxy.
  if (!on_transport()) return -1;
  // Armed first, announced after: a note taken while arming is ours to see at the stream's
  // check (no token for it); one taken by another thread after the check finds us
  // announced and writes one.
  if (!ArmCq()) return -1;
  direct_readers_.fetch_add(1, std::memory_order_seq_cst);
  return cq_fd_;
}

void StreamConn::EndRxSleep(bool woken) noexcept {
  (void)woken;  // (what woke it stays on the descriptor until the next arming takes it)
  direct_readers_.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace slip::fabric
