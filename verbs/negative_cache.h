// Destinations that recently gave a negative answer over RDMA (no route, no listener,
// timeout), so that the next connection to them goes plain at once instead of paying the
// rdma_cm round trips again. Entries expire after SLIP_NEGATIVE_TTL_MS.
//
// Thread safety: all methods lock.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "core/stats.h"
#include "core/wire.h"

namespace slip::verbs {

class NegativeCache {
 public:
  // True (with the cached reason) if `dest` answered negatively and the entry is live.
  bool Lookup(const wire::Endpoint& dest, uint64_t now_ms, Reason* why) noexcept;
  void Insert(const wire::Endpoint& dest, Reason why, uint64_t expires_ms) noexcept;
  size_t size() noexcept;

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

}  // namespace slip::verbs
