// Conn's own completion channel: where a blocking reader sleeps (Stream's direct sleep) and
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
#include "verbs/conn.h"
#include "verbs/conn_internal.h"

namespace slip::verbs {

using namespace conn_internal;

std::unordered_set<const void*>* conn_internal::g_watched = nullptr;
int conn_internal::g_watch_epoll = -1;

void SetConnWatchEpoll(int epoll_fd) noexcept {
  g_watch_epoll = epoll_fd;
}

ibv_comp_channel* Conn::SetUpOwnChannel() noexcept {
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
  own_.conn = this;
  ibv_comp_channel* channel = ibv_create_comp_channel(device_->context());
  if (!channel) return device_->comp_channel();  // ~OwnChannel drops the registration
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

void Conn::DropOwnChannelLocked() noexcept {
  if (own_.dropped) return;
  own_.dropped = true;
  if (own_.conn && g_watched) g_watched->erase(own_.conn);  // OnWatchEvent ignores it now
  if (!own_.channel) return;
  sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_DEL, own_.channel->fd, nullptr);
  ibv_destroy_comp_channel(own_.channel);
}

Conn::OwnChannel::~OwnChannel() {
  if (dropped) return;  // ~Conn or ReleaseRdma did it
  if (conn) {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_watched->erase(conn);
  }
  if (!channel) return;
  if (conn->orphaned_.load(std::memory_order_acquire)) {
    // A forked child: the channel and the epoll registration are the parent's.
    sys::close(channel->fd);
    return;
  }
  sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_DEL, channel->fd, nullptr);
  ibv_destroy_comp_channel(channel);
}

void Conn::OnWatchEvent(uint64_t key) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto* conn = reinterpret_cast<Conn*>(uintptr_t(key & ~uint64_t(1)));
  if (!g_watched || g_watched->count(conn) == 0) return;  // destroyed since
  // A client waiting for its claim's answer takes its events itself (they are what wakes
  // it): taken here, the answer would come without waking it.
  if (conn->claiming_.load(std::memory_order_acquire)) return;
  // The one shot fired. Cleared before taking the events: a proxy sleeper that announces
  // itself after this store arms it again (Poll), one that did before is seen below.
  conn->watched_.store(false, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  conn->TakeEvents(1 << 30);
  if (conn->WantsProgress()) conn->WatchFromProgress();
}

void Conn::WatchFromProgress() const noexcept {
  ChannelUse use(this);
  if (!use.ok() || watched_.exchange(true, std::memory_order_seq_cst)) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = uint64_t(uintptr_t(this)) | 1;
  sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_MOD, own_fd_, &ev);
}

void Conn::TakeEvents(int max) noexcept {
  if (!own_.channel || orphaned_.load(std::memory_order_relaxed)) return;
  ChannelUse use(this);
  if (!use.ok()) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  for (int i = 0; i < max && ibv_get_cq_event(own_.channel, &cq, &context) == 0; ++i)
    OnCompletionEvent();  // acks
}

int Conn::BeginRxSleep() noexcept {
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

void Conn::EndRxSleep(bool woken) noexcept {
  direct_readers_.fetch_sub(1, std::memory_order_seq_cst);
  // One event at most: an event disarms the queue until OnCompletionEvent arms it again, so
  // a second one can only follow that; it stays readable on the channel for the next
  // sleeper (whose ppoll then returns at once) or the progress thread's one shot (epoll
  // reports it when armed). Not woken by the channel: nothing to take now, the same way.
  if (woken) TakeEvents(1);
}

}  // namespace slip::verbs
