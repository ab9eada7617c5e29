#include "core/negative_cache.h"

namespace slip {

bool NegativeCache::Lookup(const wire::Endpoint& dest, uint64_t now_ms, Reason* why) noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!(entries_[i].dest == dest)) continue;
    if (entries_[i].expires_ms > now_ms) {
      *why = entries_[i].why;
      return true;
    }
    entries_[i] = entries_.back();
    entries_.pop_back();
    return false;
  }
  return false;
}

void NegativeCache::Insert(const wire::Endpoint& dest, Reason why, uint64_t expires_ms) noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  size_t oldest = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].dest == dest) {
      entries_[i].why = why;
      entries_[i].expires_ms = expires_ms;
      return;
    }
    if (entries_[i].expires_ms < entries_[oldest].expires_ms) oldest = i;
  }
  if (entries_.size() >= kMaxEntries) {
    entries_[oldest] = Entry{dest, why, expires_ms};
    return;
  }
  try {
    entries_.push_back(Entry{dest, why, expires_ms});
  } catch (...) {
  }
}

size_t NegativeCache::size() noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  return entries_.size();
}

}  // namespace slip
