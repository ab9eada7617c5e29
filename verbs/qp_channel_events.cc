// QpChannel's own completion channel: where a blocking reader sleeps (Stream's direct sleep) and
// what the progress thread watches, one shot, while somebody waits through the proxy, by
// the rules of docs/DESIGN.md ("A connection's own completion queue").
#include <sys/epoll.h>

#include <mutex>

#include "verbs/qp_channel.h"
#include "verbs/qp_channel_internal.h"

namespace slip::verbs {

using namespace qp_channel_internal;

void OnConnWatchEvent(uint64_t key) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto* channel = reinterpret_cast<QpChannel*>(uintptr_t(key & ~uint64_t(1)));
  if (!OwnChannel::ListedLocked(channel)) return;  // destroyed since
  // A client waiting for its claim's answer takes its events itself (they are what wakes
  // it): taken here, the answer would come without waking it.
  if (channel->claiming_.load(std::memory_order_acquire)) return;
  // The one shot fired. Cleared before taking the events: a proxy sleeper that announces
  // itself after this store arms it again (Poll), one that did before is seen below.
  channel->own_.Fired();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  channel->TakeEvents(1 << 30);
  if (channel->WantsProgress()) channel->own_.Rearm();
}

void QpChannel::TakeEvents(int max) noexcept {
  if (!own_.get() || orphaned_.load(std::memory_order_relaxed)) return;
  OwnChannel::Use use(&own_);
  if (!use.ok()) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  for (int i = 0; i < max && ibv_get_cq_event(own_.get(), &cq, &context) == 0; ++i)
    OnCompletionEvent();  // acks
}

int QpChannel::BeginRxSleep() noexcept {
  if (!own_.get() || proxy_b_.load() < 0 || orphaned_.load(std::memory_order_relaxed)) return -1;
  // After failover the news come from the anchor, through the control thread and the proxy.
  if (!on_transport()) return -1;
  direct_readers_.fetch_add(1, std::memory_order_seq_cst);
  // Announced, then checked: ReleaseRdma sets the flag, then looks for us (and wakes us).
  if (rdma_released_.load(std::memory_order_seq_cst)) {
    direct_readers_.fetch_sub(1, std::memory_order_seq_cst);
    return -1;
  }
  return own_.fd();
}

void QpChannel::EndRxSleep(bool woken) noexcept {
  direct_readers_.fetch_sub(1, std::memory_order_seq_cst);
  // One event at most: an event disarms the queue until OnCompletionEvent arms it again, so
  // a second one can only follow that; it stays readable on the channel for the next
  // sleeper (whose ppoll then returns at once) or the progress thread's one shot (epoll
  // reports it when armed). Not woken by the channel: nothing to take now, the same way.
  if (woken) TakeEvents(1);
}

void QpChannel::TakeEventsHere() noexcept {
  // From now on the caller takes the queue pair's events (EventFd): the progress thread's
  // watch stands down (OnConnWatchEvent checks claiming_ under the same lock).
  std::lock_guard<std::mutex> lock(g_registry_mu);
  claiming_.store(true, std::memory_order_seq_cst);
  own_.StandDownLocked();
}

}  // namespace slip::verbs
