// QpChannel's own completion channel: where a blocking reader sleeps (Stream's direct sleep) and
// what the progress thread watches, one shot, while somebody waits through the proxy, by
// the rules of docs/DESIGN.md ("A connection's own completion queue").
#include <fcntl.h>
#include <sys/epoll.h>

#include <cerrno>
#include <mutex>
#include <new>
#include <unordered_set>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/qp_channel.h"
#include "verbs/qp_channel_internal.h"

namespace slip::verbs {

using namespace qp_channel_internal;

std::unordered_set<const void*>* qp_channel_internal::g_watched = nullptr;
int qp_channel_internal::g_watch_epoll = -1;

void SetConnWatchEpoll(int epoll_fd) noexcept {
  g_watch_epoll = epoll_fd;
}

ibv_comp_channel* QpChannel::SetUpOwnChannel() noexcept {
  if (g_watch_epoll < 0) return device_->comp_channel();
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    if (!g_watched) g_watched = new (std::nothrow) std::unordered_set<const void*>();
    if (!g_watched) return device_->comp_channel();
    try {
      g_watched->insert(this);
    } catch (...) {
      return device_->comp_channel();
    }
  }
  own_.owner = this;
  ibv_comp_channel* channel = ibv_create_comp_channel(device_->context());
  if (!channel) return device_->comp_channel();  // (Teardown drops the registration)
  // Above the floor, or not at all: a connection (a pending request of a remote peer's
  // above all) never takes a descriptor number the application would get. The kernel
  // finds the channel by its number when the queue is created, after this.
  const int high = sys::DupAbove(channel->fd, sys::HiddenFdFloor());
  ForgetOwnFd(high);  // (rdma-core closes it: sys::MoveLibraryFdHigh says why)
  if (high < 0) {
    ibv_destroy_comp_channel(channel);
    return device_->comp_channel();  // the device's shared one serves it instead
  }
  sys::close(channel->fd);
  channel->fd = high;
  sys::fcntl(channel->fd, F_SETFL, sys::fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
  own_.channel = channel;
  own_fd_ = channel->fd;
  return channel;
}

void QpChannel::DropOwnChannelLocked() noexcept {
  if (own_.dropped) return;
  own_.dropped = true;
  if (own_.owner && g_watched) g_watched->erase(own_.owner);  // OnWatchEvent ignores it now
  if (!own_.channel) return;
  sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_DEL, own_.channel->fd, nullptr);
  ibv_destroy_comp_channel(own_.channel);
}

void QpChannel::OnWatchEvent(uint64_t key) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto* channel = reinterpret_cast<QpChannel*>(uintptr_t(key & ~uint64_t(1)));
  if (!g_watched || g_watched->count(channel) == 0) return;  // destroyed since
  // A client waiting for its claim's answer takes its events itself (they are what wakes
  // it): taken here, the answer would come without waking it.
  if (channel->claiming_.load(std::memory_order_acquire)) return;
  // The one shot fired. Cleared before taking the events: a proxy sleeper that announces
  // itself after this store arms it again (Poll), one that did before is seen below.
  channel->watched_.store(false, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  channel->TakeEvents(1 << 30);
  if (channel->WantsProgress()) channel->WatchFromProgress();
}

void QpChannel::WatchFromProgress() const noexcept {
  ChannelUse use(this);
  if (!use.ok() || watched_.exchange(true, std::memory_order_seq_cst)) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = uint64_t(uintptr_t(this)) | 1;
  sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_MOD, own_fd_, &ev);
}

void QpChannel::TakeEvents(int max) noexcept {
  if (!own_.channel || orphaned_.load(std::memory_order_relaxed)) return;
  ChannelUse use(this);
  if (!use.ok()) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  for (int i = 0; i < max && ibv_get_cq_event(own_.channel, &cq, &context) == 0; ++i)
    OnCompletionEvent();  // acks
}

int QpChannel::BeginRxSleep() noexcept {
  if (!own_.channel || proxy_b_.load() < 0 || orphaned_.load(std::memory_order_relaxed)) return -1;
  // After failover the news come from the anchor, through the control thread and the proxy.
  if (!on_transport()) return -1;
  direct_readers_.fetch_add(1, std::memory_order_seq_cst);
  // Announced, then checked: ReleaseRdma sets the flag, then looks for us (and wakes us).
  if (rdma_released_.load(std::memory_order_seq_cst)) {
    direct_readers_.fetch_sub(1, std::memory_order_seq_cst);
    return -1;
  }
  return own_fd_;
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
  // watch stands down (OnWatchEvent checks claiming_ under the same lock).
  std::lock_guard<std::mutex> lock(g_registry_mu);
  claiming_.store(true, std::memory_order_seq_cst);
  if (own_.channel && !own_.dropped && watched_.exchange(false)) {
    epoll_event ev{};
    ev.events = EPOLLONESHOT;
    ev.data.u64 = uint64_t(uintptr_t(this)) | 1;
    sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_MOD, own_fd_, &ev);
  }
}

}  // namespace slip::verbs
