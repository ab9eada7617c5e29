// A completion channel of one connection's own (docs/DESIGN.md "A connection's own
// completion queue"): where a blocking reader sleeps, and what the progress thread
// watches, one shot, while somebody waits through the proxy. Its descriptor sits above the
// hidden floor. The progress thread may hold an event of a connection that is being
// destroyed, so it finds the connection among the listed ones first (ListedLocked).
// Internal to the verbs library.
//
// Thread safety: the calls named Locked hold the connection registry's mutex
// (verbs/qp_channel_internal.h); the others may be called from any thread.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

namespace slip::verbs {

class OwnChannel {
 public:
  // The progress thread's epoll set, where every channel is watched (before any Open).
  static void SetEpoll(int epoll_fd) noexcept;
  // The epoll key of `owner`'s channel: its address with bit 0 set.
  static uint64_t KeyOf(const void* owner) noexcept { return uint64_t(uintptr_t(owner)) | 1; }
  static bool IsKey(uint64_t key) noexcept { return (key & 1) != 0; }
  // Is `owner`'s channel listed (its connection alive)? Registry locked.
  static bool ListedLocked(const void* owner) noexcept;

  // Makes the channel of `owner` on `context` and lists it. nullptr when there is none (no
  // epoll set, no memory, no descriptor above the floor): the device's shared channel
  // serves the connection instead.
  ibv_comp_channel* Open(ibv_context* context, const void* owner) noexcept;
  // Into the epoll set with its one shot armed: the first event goes to the progress
  // thread. False with errno.
  bool Watch() noexcept;
  // Whoever uses the channel outside the registry's mutex (takes its events, arms its
  // shot) holds a Use; Retire waits for those that got in before it.
  class Use {
   public:
    explicit Use(const OwnChannel* channel) noexcept;
    ~Use() { channel_->users_.fetch_sub(1, std::memory_order_seq_cst); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    bool ok() const noexcept { return ok_; }

   private:
    const OwnChannel* channel_;
    bool ok_;
  };
  // No Use from now on: returns once the current ones let go (the queues may go then).
  void Retire() noexcept;

  // The one shot again, unless it is armed (somebody waits through the proxy).
  void Rearm() const noexcept;
  // The progress thread's shot fired: it takes the events, and Rearms while wanted.
  void Fired() const noexcept { watched_.store(false, std::memory_order_seq_cst); }
  bool armed() const noexcept { return watched_.load(std::memory_order_relaxed); }
  // The progress thread's shot stands down (registry locked): the caller takes the events.
  void StandDownLocked() noexcept;
  // Goes (registry locked): unlisted, out of the epoll set, destroyed. An orphan's (a fork
  // child's: the objects are the parent's) only closes its descriptor.
  void CloseLocked(bool orphan) noexcept;

  ibv_comp_channel* get() const noexcept { return channel_; }
  int fd() const noexcept { return fd_; }

 private:
  ibv_comp_channel* channel_ = nullptr;       // set once at Open, never changed
  const void* owner_ = nullptr;               // listed
  int fd_ = -1;                               // its descriptor (a number, still valid as one)
  bool closed_ = false;                       // registry locked
  mutable std::atomic<bool> watched_{false};  // the progress thread's one shot is armed
  std::atomic<bool> retired_{false};
  mutable std::atomic<int> users_{0};
};

}  // namespace slip::verbs
