// A queue pair's send queue as a connection's data path uses it: work requests posted under
// a spin lock, one in kSignalEvery signalled (its completion says every request before it
// is done, and frees their slots), room waited for while the caller's wait allows, and
// what completed counted. Internal to the verbs library.
//
// Thread safety: Post, PostNow, TryPost, Fence and Close take the lock; Completed and the
// counts may be called from any thread (the poller's).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

#include "verbs/qp_channel_internal.h"

namespace slip::verbs {

class SendQueue {
 public:
  // The queue pair's, `depth` requests deep. Before any posting.
  void Init(ibv_qp* qp, uint32_t depth) noexcept {
    qp_ = qp;
    depth_ = depth;
  }

  enum class Result : uint8_t {
    kPosted,
    kNoRoom,   // closed, busy (TryPost) or the wait gave up: nothing posted
    kRefused,  // the queue pair refused the post (errno): the path is broken
  };
  // Posts the `n` chained requests `wrs`, signalled when `signal` or when enough went
  // unsignalled before; while the queue has no room, calls `wait()` (with the lock held:
  // it may poll the completion queue, never post), which returns false to give up.
  template <typename Wait>
  Result Post(ibv_send_wr* wrs, int n, bool signal, Wait wait) noexcept {
    qp_channel_internal::SpinGuard guard(&busy_);
    if (closed_) return Result::kNoRoom;
    while (posted_ + uint32_t(n) - completed_.load(std::memory_order_acquire) > depth_) {
      if (!wait()) return Result::kNoRoom;
    }
    return PostLocked(wrs, n, signal);
  }
  // Posts one request at once, unsignalled, without waiting for room (the queue is known
  // to have it: a connection's first SEND).
  Result PostNow(ibv_send_wr* wr) noexcept;
  // Posts `n` requests signalled, only if the lock is free and there is room now (the
  // progress thread's probe, which serves every connection and never waits); *done_at is
  // the completed count that acknowledges them.
  Result TryPost(ibv_send_wr* wrs, int n, uint64_t* done_at) noexcept;
  // Everything posted is acknowledged once completed() reaches *done_at: posts `fence`
  // (an empty write, signalled) behind unsignalled requests so that their completion is
  // seen. False when closed or refused.
  bool Fence(ibv_send_wr* fence, uint64_t* done_at) noexcept;
  // No posting from now on (the queue pair is going away).
  void Close() noexcept;

  // A signalled request completed: everything up to `done` is done (from its wr_id).
  void Completed(uint64_t done) const noexcept {
    uint64_t prev = completed_.load(std::memory_order_relaxed);
    while (done > prev && !completed_.compare_exchange_weak(prev, done)) {
    }
  }
  uint64_t completed() const noexcept { return completed_.load(std::memory_order_acquire); }

 private:
  Result PostLocked(ibv_send_wr* wrs, int n, bool signal) noexcept;

  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  ibv_qp* qp_ = nullptr;
  uint32_t depth_ = 0;
  bool closed_ = false;      // under busy_
  uint64_t posted_ = 0;      // under busy_
  uint32_t unsignaled_ = 0;  // under busy_
  mutable std::atomic<uint64_t> completed_{0};
};

}  // namespace slip::verbs
