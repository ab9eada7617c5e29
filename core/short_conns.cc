#include "core/short_conns.h"

namespace slip {

ShortConnPolicy::Entry* ShortConnPolicy::FindLocked(const wire::Endpoint& dest) noexcept {
  for (Entry& e : entries_)
    if (e.last_ms != 0 && e.dest == dest) return &e;
  return nullptr;
}

bool ShortConnPolicy::Bypass(const wire::Endpoint& dest, uint64_t now_ms) noexcept {
  std::lock_guard<ForkSafeMutex> lock(mu_);
  Entry* e = FindLocked(dest);
  if (!e) return false;
  const bool paused = now_ms - e->last_ms > kIdleMs;
  e->last_ms = now_ms;
  if (paused) {  // a new phase: its connections are judged afresh
    e->plain = false;
    e->short_run = 0;
    return false;
  }
  if (!e->plain) return false;
  return ++e->connects % kProbeEvery != 0;  // (every kProbeEvery-th looks again)
}

void ShortConnPolicy::NoteClosed(const wire::Endpoint& dest, uint64_t now_ms, uint64_t life_ms,
                                 uint64_t bytes) noexcept {
  const bool short_lived = life_ms < kShortLifeMs && bytes < kShortBytes;
  std::lock_guard<ForkSafeMutex> lock(mu_);
  Entry* e = FindLocked(dest);
  if (!e) {
    if (!short_lived) return;  // (only short ones are worth remembering)
    e = &entries_[0];
    for (Entry& candidate : entries_) {
      if (candidate.last_ms < e->last_ms) e = &candidate;  // a free one (0) or the stalest
    }
    *e = Entry{};
    e->dest = dest;
  }
  e->last_ms = now_ms;
  if (!short_lived) {
    e->plain = false;
    e->short_run = 0;
    return;
  }
  if (++e->short_run >= kRun && !e->plain) {
    e->plain = true;
    e->connects = 0;
  }
}

}  // namespace slip
