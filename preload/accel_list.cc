#include "preload/accel_list.h"

#include <sched.h>
#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <mutex>
#include <vector>

#include "core/no_destructor.h"
#include "preload/fd_table.h"

namespace slip::preload {

namespace {

struct AccelList {
  std::mutex mu;
  std::vector<SlipSocket*> sockets;
  std::atomic<size_t> count{0};
};

AccelList& List() noexcept {
  static NoDestructor<AccelList> list;
  return *list;
}

uint64_t NowNs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace

bool AccelListAdd(SlipSocket* s) noexcept {
  AccelList& l = List();
  std::lock_guard<std::mutex> lock(l.mu);
  try {
    l.sockets.push_back(s);
  } catch (...) {
    return false;
  }
  l.count.store(l.sockets.size(), std::memory_order_relaxed);
  try {
    if (l.sockets.capacity() - l.sockets.size() < 16) l.sockets.reserve(l.sockets.size() * 2 + 16);
  } catch (...) {
  }
  return true;
}

bool AccelListReserve() noexcept {
  AccelList& l = List();
  std::lock_guard<std::mutex> lock(l.mu);
  try {
    if (l.sockets.capacity() - l.sockets.size() < 16) l.sockets.reserve(l.sockets.size() * 2 + 16);
  } catch (...) {
    return false;
  }
  return true;
}

void AccelListRemove(SlipSocket* s) noexcept {
  AccelList& l = List();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = std::find(l.sockets.begin(), l.sockets.end(), s);
  if (it == l.sockets.end()) return;
  *it = l.sockets.back();
  l.sockets.pop_back();
  l.count.store(l.sockets.size(), std::memory_order_relaxed);
}

void AccelListForkPrepare() noexcept {
  List().mu.lock();
}
void AccelListForkParent() noexcept {
  List().mu.unlock();
}
void AccelListForkChild() noexcept {
  List().mu.unlock();
}

bool AccelListNonEmpty() noexcept {
  return List().count.load(std::memory_order_relaxed) != 0;
}

void PrepareAllForSleep() noexcept {
  AccelList& l = List();
  // Membership changes take the same lock before a socket is torn down, so every
  // stream seen here stays valid while the lock is held.
  std::lock_guard<std::mutex> lock(l.mu);
  for (SlipSocket* s : l.sockets) {
    if (s->stream) s->stream->PrepareToSleep(EPOLLIN);
  }
}

bool SpinForAnyReadable(uint32_t spin_us) noexcept {
  AccelList& l = List();
  const uint64_t deadline = NowNs() + uint64_t(spin_us) * 1000;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(l.mu);
      for (SlipSocket* s : l.sockets) {
        if (s->stream && (s->stream->Ready(EPOLLIN) & EPOLLIN)) return true;
      }
    }
    if (NowNs() >= deadline) return false;
    sched_yield();  // let a peer on this CPU run (see Stream::SpinUntil)
  }
}

}  // namespace slip::preload
