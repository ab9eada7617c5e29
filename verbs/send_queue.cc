#include "verbs/send_queue.h"

#include <cerrno>

namespace slip::verbs {

using qp_channel_internal::kSignalEvery;
using qp_channel_internal::SpinGuard;

SendQueue::Result SendQueue::PostLocked(ibv_send_wr* wrs, int n, bool signal) noexcept {
  unsignaled_ += uint32_t(n);
  if (unsignaled_ >= kSignalEvery || signal) {
    wrs[n - 1].send_flags |= IBV_SEND_SIGNALED;
    wrs[n - 1].wr_id = posted_ + uint64_t(n);
    unsignaled_ = 0;
  }
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_, wrs, &bad);
  if (rc != 0) {
    errno = rc;
    return Result::kRefused;
  }
  posted_ += uint64_t(n);
  return Result::kPosted;
}

SendQueue::Result SendQueue::PostNow(ibv_send_wr* wr) noexcept {
  SpinGuard guard(&busy_);
  if (closed_) return Result::kNoRoom;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_, wr, &bad); rc != 0) {
    errno = rc;
    return Result::kRefused;
  }
  ++posted_;
  ++unsignaled_;
  return Result::kPosted;
}

SendQueue::Result SendQueue::TryPost(ibv_send_wr* wrs, int n, uint64_t* done_at) noexcept {
  if (busy_.test_and_set(std::memory_order_acquire)) return Result::kNoRoom;
  Result result = Result::kNoRoom;
  if (!closed_ && posted_ + uint32_t(n) - completed_.load(std::memory_order_acquire) <= depth_) {
    result = PostLocked(wrs, n, /*signal=*/true);
    if (result == Result::kPosted) *done_at = posted_;
  }
  busy_.clear(std::memory_order_release);
  return result;
}

bool SendQueue::Fence(ibv_send_wr* fence, uint64_t* done_at) noexcept {
  SpinGuard guard(&busy_);
  if (closed_) return false;
  *done_at = posted_;
  if (completed_.load(std::memory_order_acquire) >= posted_ || unsignaled_ == 0) return true;
  // Unsignalled requests complete silently: a signalled one behind them tells when they
  // are all acknowledged.
  fence->wr_id = posted_ + 1;
  fence->send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_, fence, &bad) != 0) return false;
  ++posted_;
  unsignaled_ = 0;
  *done_at = posted_;
  return true;
}

void SendQueue::Close() noexcept {
  SpinGuard guard(&busy_);
  closed_ = true;
}

}  // namespace slip::verbs
