// Destinations that recently gave a transport a negative answer, so that the next
// connection to them goes plain at once instead of asking again: verbs (no route, no
// listener, timeout: the rdma_cm round trips; entries live SLIP_NEGATIVE_TTL_MS) and shm
// (a listener without a rendezvous: the kernel lookup and the refused connect(2)).
//
// Thread safety: all methods lock.
#pragma once

#include <cstdint>
#include <vector>

#include "core/fork_safe_mutex.h"
#include "core/stats.h"
#include "core/wire.h"

namespace slip {

class NegativeCache {
 public:
  // True (with the cached reason) if `dest` answered negatively and the entry is live.
  bool Lookup(const wire::Endpoint& dest, uint64_t now_ms, Reason* why) noexcept;
  void Insert(const wire::Endpoint& dest, Reason why, uint64_t expires_ms) noexcept;
  size_t size() noexcept;
  // For the fork handlers (core/fork_safe_mutex.h).
  ForkSafeMutex& fork_mutex() noexcept { return mu_; }

 private:
  struct Entry {
    wire::Endpoint dest;
    Reason why;
    uint64_t expires_ms;
  };
  static constexpr size_t kMaxEntries = 4096;  // beyond it the oldest entries go first

  ForkSafeMutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace slip
