// Destinations that recently gave a transport a negative answer, so that the next
// connection to them goes plain at once instead of asking again: verbs (no route, no
// listener, timeout: the rdma_cm round trips; entries live SLIP_NEGATIVE_TTL_MS) and shm
// (a listener without a rendezvous: the kernel lookup and the refused connect(2)).
//
// Thread safety: all methods lock.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "core/stats.h"
#include "core/wire.h"

namespace slip {

class NegativeCache {
 public:
  // True (with the cached reason) if `dest` answered negatively and the entry is live.
  bool Lookup(const wire::Endpoint& dest, uint64_t now_ms, Reason* why) noexcept;
  void Insert(const wire::Endpoint& dest, Reason why, uint64_t expires_ms) noexcept;
  size_t size() noexcept;

  // fork(): the lock is held across fork so that the child never inherits it held.
  void ForkPrepare() noexcept { mu_.lock(); }
  void ForkParent() noexcept { mu_.unlock(); }
  void ForkChild() noexcept { mu_.unlock(); }

 private:
  struct Entry {
    wire::Endpoint dest;
    Reason why;
    uint64_t expires_ms;
  };
  static constexpr size_t kMaxEntries = 4096;  // beyond it the oldest entries go first

  std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace slip
