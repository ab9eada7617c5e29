#include "preload/accel_list.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "core/no_destructor.h"
#include "core/rearm_list.h"
#include "preload/fd_table.h"

namespace slip::preload {

namespace {

struct AccelList {
  std::mutex mu;  // before rearm's
  std::vector<SlipSocket*> sockets;
  std::atomic<size_t> count{0};
  RearmList rearm;
};

AccelList& List() noexcept {
  static NoDestructor<AccelList> list;
  return *list;
}

void ShareAllLocked(AccelList& l) noexcept {
  for (SlipSocket* s : l.sockets) {
    if (s->stream) l.rearm.ArmAlways(s->stream.get());
  }
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
  s->stream->SetRearmList(&l.rearm);
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
  // (A stream handed back to TCP at exec stays alive and must not be armed any more.)
  if (s->stream) s->stream->SetRearmList(nullptr);
  l.count.store(l.sockets.size(), std::memory_order_relaxed);
}

void AccelListForkPrepare() noexcept {
  AccelList& l = List();
  l.mu.lock();
  l.rearm.fork_mutex().ForkPrepare();
}
void AccelListForkParent() noexcept {
  AccelList& l = List();
  l.rearm.fork_mutex().ForkParent();
  ShareAllLocked(l);
  l.mu.unlock();
}
void AccelListForkChild() noexcept {
  AccelList& l = List();
  l.rearm.fork_mutex().ForkChild();
  ShareAllLocked(l);
  l.mu.unlock();
}

bool AccelListNonEmpty() noexcept {
  return List().count.load(std::memory_order_relaxed) != 0;
}

void PrepareChangedForSleep() noexcept {
  List().rearm.PrepareChanged();
}

bool RecentReadable() noexcept {
  return List().rearm.AnyRecentReadable();
}

}  // namespace slip::preload
