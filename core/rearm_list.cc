#include "core/rearm_list.h"

#include <sys/epoll.h>

#include <atomic>

#include "core/stream.h"

namespace slip {

void RearmList::Join(Stream* s) noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  if (IsMemberLocked(s)) return;
  ++members_;
  s->rearm_.store(this, std::memory_order_release);
  s->rearm_always_ = !s->channel()->ShowsArrivalsWithoutAsk();
  LinkLocked(s);  // at once: whatever armed it before (if anything) is not known here
}

void RearmList::Leave(Stream* s) noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  if (!IsMemberLocked(s)) return;
  if (s->rearm_listed_.load(std::memory_order_relaxed)) UnlinkLocked(s);
  s->rearm_always_ = false;
  --members_;
  s->rearm_.store(nullptr, std::memory_order_release);
  for (size_t i = 0; i < recent_count_; ++i) {
    if (recent_[i] != s) continue;
    recent_[i] = recent_[--recent_count_];  // (armed once per preparation: listed once)
    break;
  }
}

void RearmList::MarkChanged(Stream* s) noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  if (!IsMemberLocked(s) || s->rearm_listed_.load(std::memory_order_relaxed)) return;
  LinkLocked(s);
}

void RearmList::ArmAlways(Stream* s) noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  if (!IsMemberLocked(s)) return;
  s->rearm_always_ = true;
  if (s->rearm_listed_.load(std::memory_order_relaxed)) return;
  LinkLocked(s);
}

bool RearmList::IsMemberLocked(const Stream* s) const noexcept {
  return s->rearm_.load(std::memory_order_relaxed) == this;
}

void RearmList::LinkLocked(Stream* s) noexcept {
  s->rearm_listed_.store(true, std::memory_order_relaxed);
  s->rearm_prev_ = nullptr;
  s->rearm_next_ = head_;
  if (head_) head_->rearm_prev_ = s;
  head_ = s;
}

void RearmList::UnlinkLocked(Stream* s) noexcept {
  if (s->rearm_prev_) {
    s->rearm_prev_->rearm_next_ = s->rearm_next_;
  } else {
    head_ = s->rearm_next_;
  }
  if (s->rearm_next_) s->rearm_next_->rearm_prev_ = s->rearm_prev_;
  s->rearm_prev_ = s->rearm_next_ = nullptr;
  s->rearm_listed_.store(false, std::memory_order_relaxed);
}

size_t RearmList::PrepareChanged() noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  size_t prepared = 0;
  recent_count_ = 0;
  for (Stream* s = head_; s;) {
    Stream* next = s->rearm_next_;
    // Off the list before it is armed: a receive that takes its tokens after this point
    // (and finds no ask pending) lists it again for the next sleep.
    if (!s->rearm_always_) UnlinkLocked(s);
    // Ordered before the ask that arming stores: a receive that takes the token a publish
    // wrote for that ask sees the stream unlisted (Stream::Recv reads the flag unlocked).
    std::atomic_thread_fence(std::memory_order_release);
    s->PrepareToSleep(EPOLLIN);
    if (recent_count_ < kRecent) recent_[recent_count_++] = s;
    ++prepared;
    s = next;
  }
  return prepared;
}

bool RearmList::AnyRecentReadable() noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  for (size_t i = 0; i < recent_count_; ++i) {
    Stream* s = recent_[i];
    if (s->Ready(EPOLLIN) & EPOLLIN) {
      // Its token may still be on the way from the publisher: arming writes one if none is
      // queued, so that the kernel call that follows sees it at once.
      s->PrepareToSleep(EPOLLIN);
      return true;
    }
  }
  return false;
}

size_t RearmList::members() const noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  return members_;
}

}  // namespace slip
