#include "verbs/own_channel.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/epoll.h>

#include <mutex>
#include <new>
#include <unordered_set>

#include "core/own_fds.h"
#include "core/sys.h"
#include "verbs/qp_channel_internal.h"

namespace slip::verbs {

namespace {

int g_epoll = -1;
// The owners whose channels are listed (registry locked).
std::unordered_set<const void*>* g_listed = nullptr;

}  // namespace

void OwnChannel::SetEpoll(int epoll_fd) noexcept {
  g_epoll = epoll_fd;
}

bool OwnChannel::ListedLocked(const void* owner) noexcept {
  return g_listed && g_listed->count(owner) != 0;
}

ibv_comp_channel* OwnChannel::Open(ibv_context* context, const void* owner) noexcept {
  if (g_epoll < 0) return nullptr;
  {
    std::lock_guard<std::mutex> lock(qp_channel_internal::g_registry_mu);
    if (!g_listed) g_listed = new (std::nothrow) std::unordered_set<const void*>();
    if (!g_listed) return nullptr;
    try {
      g_listed->insert(owner);
    } catch (...) {
      return nullptr;
    }
  }
  owner_ = owner;  // (listed: CloseLocked unlists it, whatever follows)
  ibv_comp_channel* channel = ibv_create_comp_channel(context);
  if (!channel) return nullptr;
  // Above the floor, or not at all: a connection (a kept request of a remote peer's above
  // all) never takes a descriptor number the application would get. The kernel finds the
  // channel by its number when the queue is created, after this.
  const int high = sys::DupAbove(channel->fd, sys::HiddenFdFloor());
  ForgetOwnFd(high);  // (rdma-core closes it: sys::MoveLibraryFdHigh says why)
  if (high < 0) {
    ibv_destroy_comp_channel(channel);
    return nullptr;
  }
  sys::close(channel->fd);
  channel->fd = high;
  sys::fcntl(channel->fd, F_SETFL, sys::fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
  channel_ = channel;
  fd_ = channel->fd;
  return channel;
}

bool OwnChannel::Watch() noexcept {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = KeyOf(owner_);
  watched_.store(true, std::memory_order_relaxed);
  return sys::epoll_ctl(g_epoll, EPOLL_CTL_ADD, fd_, &ev) == 0;
}

OwnChannel::Use::Use(const OwnChannel* channel) noexcept : channel_(channel) {
  // Counted, then checked (Retire sets, then waits for the count): one of the two sees
  // the other.
  channel->users_.fetch_add(1, std::memory_order_seq_cst);
  ok_ = channel->channel_ && !channel->retired_.load(std::memory_order_seq_cst);
}

void OwnChannel::Retire() noexcept {
  retired_.store(true, std::memory_order_seq_cst);
  while (users_.load(std::memory_order_seq_cst) != 0) sched_yield();
}

void OwnChannel::Rearm() const noexcept {
  Use use(this);
  if (!use.ok() || watched_.exchange(true, std::memory_order_seq_cst)) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = KeyOf(owner_);
  sys::epoll_ctl(g_epoll, EPOLL_CTL_MOD, fd_, &ev);
}

void OwnChannel::StandDownLocked() noexcept {
  if (!channel_ || closed_ || !watched_.exchange(false)) return;
  epoll_event ev{};
  ev.events = EPOLLONESHOT;
  ev.data.u64 = KeyOf(owner_);
  sys::epoll_ctl(g_epoll, EPOLL_CTL_MOD, fd_, &ev);
}

void OwnChannel::CloseLocked(bool orphan) noexcept {
  if (closed_) return;
  closed_ = true;
  if (owner_ && g_listed) g_listed->erase(owner_);  // the progress thread ignores it now
  if (!channel_) return;
  if (orphan) {
    sys::close(channel_->fd);
    return;
  }
  sys::epoll_ctl(g_epoll, EPOLL_CTL_DEL, channel_->fd, nullptr);
  ibv_destroy_comp_channel(channel_);
}

}  // namespace slip::verbs
