#include "preload/closer.h"

#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <new>
#include <utility>

#include "core/log.h"
#include "core/no_destructor.h"
#include "core/sys.h"

namespace slip::preload {

namespace {

struct Item {
  std::unique_ptr<Stream> stream;
  int anchor_fd;
};

struct CloserState {
  std::mutex mu;
  std::condition_variable work;  // the thread waits for items
  std::condition_variable idle;  // DrainCloser waits for an empty queue
  std::list<Item> queue;         // (a std::deque would allocate when the state is built)
  bool busy = false;             // the thread is closing one
  bool started = false;          // the thread runs
};

CloserState& State() noexcept {
  static NoDestructor<CloserState> state;  // used at exit
  return *state;
}

void CloseNow(Item* item) noexcept {
  item->stream.reset();
  if (item->anchor_fd >= 0) sys::close(item->anchor_fd);
}

void* CloserMain(void*) {
  CloserState& st = State();
  std::unique_lock<std::mutex> lock(st.mu);
  for (;;) {
    st.work.wait(lock, [&] { return !st.queue.empty(); });
    Item item = std::move(st.queue.front());
    st.queue.pop_front();
    st.busy = true;
    lock.unlock();
    CloseNow(&item);
    lock.lock();
    st.busy = false;
    if (st.queue.empty()) st.idle.notify_all();
  }
}

bool StartLocked(CloserState& st) noexcept {
  if (st.started) return true;
  if (int rc = sys::StartServiceThread(CloserMain, nullptr, "slipstream-close"); rc != 0) {
    SLIP_LOG(kWarn, "cannot start the closer thread (error %d); closing in place", rc);
    return false;
  }
  st.started = true;
  return true;
}

}  // namespace

void CloseLater(std::unique_ptr<Stream> stream, int anchor_fd) noexcept {
  Item item{std::move(stream), anchor_fd};
  CloserState& st = State();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (StartLocked(st)) {
      try {
        st.queue.push_back(std::move(item));
        st.work.notify_one();
        return;
      } catch (...) {
        // No memory for the queue: close here.
      }
    }
  }
  CloseNow(&item);
}

void DrainCloser(int timeout_ms) noexcept {
  CloserState& st = State();
  std::unique_lock<std::mutex> lock(st.mu);
  st.idle.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                   [&] { return st.queue.empty() && !st.busy; });
}

void CloserForkPrepare() noexcept {
  State().mu.lock();
}

void CloserForkParent() noexcept {
  State().mu.unlock();
}

void CloserForkChild() noexcept {
  // The single-threaded child: no closer thread, and the queued connections are the
  // parent's (a verbs connection never crosses fork). Forget them without touching them:
  // the old state is overwritten, not destroyed (its queue's memory stays behind; its
  // condition variables may count the parent's waiting thread). The forking thread holds
  // the lock (CloserForkPrepare) and lets it go first, as the other fork handlers do.
  State().mu.unlock();
  new (&State()) CloserState();
}

}  // namespace slip::preload
