// StreamFabric's retired rings: a receive ring whose connection is done with it stays
// registered (and mapped) while its peer's last writes may still be on their way
// (StreamFabric::Retire), and the progress thread lets go of it later.
#include <algorithm>

#include "core/sys.h"
#include "fabric/stream_fabric.h"

namespace slip::fabric {

namespace {

// How long a retired receive ring stays registered after its connection let go of it.
constexpr uint64_t kRetireMs = 2000;

}  // namespace

void StreamFabric::Retire(MrPtr rx, MrPtr tx, RingMemory memory, size_t bytes,
                          bool unproven) noexcept {
  const uint64_t until = sys::MonotonicMs() + kRetireMs;
  bool over = false;
  {
    std::lock_guard<std::mutex> lock(retired_mu_);
    std::vector<Retired>& list = unproven ? unproven_ : retired_;
    try {
      list.push_back(Retired{std::move(memory), std::move(rx), std::move(tx), until, bytes});
    } catch (...) {
      // No room to remember it: it stays registered and mapped for good (never freed
      // under a peer that may still write it).
      (void)rx.release();
      (void)tx.release();
      memory.Leak();
      return;
    }
    if (unproven) {
      unproven_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    } else {
      retired_bytes_ += bytes;
      over = retired_bytes_ > kRetiredMax;
    }
    uint64_t expected = 0;
    next_expiry_ms_.compare_exchange_strong(expected, until);
  }
  if (over) ReleaseRetired(sys::MonotonicMs(), /*force=*/true);
}

template <typename Take>
void StreamFabric::TakeFrontLocked(std::vector<Retired>* from, std::vector<Retired>* done,
                                   Take take) noexcept {
  // (In the order they retired: the oldest first.)
  size_t n = 0;
  while (n < from->size() && take((*from)[n])) ++n;
  try {
    done->reserve(done->size() + n);
  } catch (...) {
    return;  // (a later round)
  }
  for (size_t i = 0; i < n; ++i) done->push_back(std::move((*from)[i]));
  from->erase(from->begin(), from->begin() + ptrdiff_t(n));
}

void StreamFabric::ReleaseRetired(uint64_t now_ms, bool force) noexcept {
  const uint64_t next = next_expiry_ms_.load(std::memory_order_relaxed);
  if (!force && (next == 0 || now_ms < next)) return;
  std::vector<Retired> done;
  {
    std::lock_guard<std::mutex> lock(retired_mu_);
    TakeFrontLocked(&retired_, &done, [&](const Retired& r) {
      if (r.until_ms > now_ms && !(force && retired_bytes_ > kRetiredMax)) return false;
      retired_bytes_ -= r.bytes;
      return true;
    });
    TakeFrontLocked(&unproven_, &done, [&](const Retired& r) {
      if (r.until_ms > now_ms) return false;
      unproven_bytes_.fetch_sub(r.bytes, std::memory_order_relaxed);
      return true;
    });
    uint64_t first = 0;
    if (!retired_.empty()) first = retired_.front().until_ms;
    if (!unproven_.empty() && (first == 0 || unproven_.front().until_ms < first))
      first = unproven_.front().until_ms;
    next_expiry_ms_.store(first, std::memory_order_relaxed);
  }
  // (Each registration goes before its memory: Retired's members are destroyed in reverse.)
}

void StreamFabric::ReleaseUnproven(size_t keep) noexcept {
  if (unproven_bytes_.load(std::memory_order_relaxed) <= keep) return;
  std::vector<Retired> done;
  std::lock_guard<std::mutex> lock(retired_mu_);
  TakeFrontLocked(&unproven_, &done, [&](const Retired& r) {
    if (unproven_bytes_.load(std::memory_order_relaxed) <= keep) return false;
    unproven_bytes_.fetch_sub(r.bytes, std::memory_order_relaxed);
    return true;
  });
  // (next_expiry_ms_ may now be early: the next release finds nothing due, and fixes it.)
}

}  // namespace slip::fabric
