// How long a test runs: a duration or an iteration count, and its warm-up.
#pragma once

#include <cstdint>

#include "tools/slip-perf/clock.h"

namespace slipperf {

// Exactly one of the two is non-zero for a measured phase. Both zero is an empty phase.
struct Budget {
  uint64_t duration_ns = 0;
  uint64_t iters = 0;
};

// The warm-up run before measuring: a tenth of the budget, at most one second.
inline Budget WarmupOf(const Budget& b) {
  constexpr uint64_t kMaxWarmupNs = 1'000'000'000;
  Budget w;
  if (b.iters != 0) {
    w.iters = b.iters / 10;
  } else {
    w.duration_ns = b.duration_ns / 10 < kMaxWarmupNs ? b.duration_ns / 10 : kMaxWarmupNs;
  }
  return w;
}

// Counts the iterations of one phase and says when its budget is spent.
//   for (Phase p(budget); !p.Done(); p.Tick()) { ... }
// The threads of one test pass the same `start_ns`, so that they measure one interval.
class Phase {
 public:
  explicit Phase(const Budget& budget, uint64_t start_ns = NowNs())
      : budget_(budget), start_ns_(start_ns) {}

  // `now_ns` lets a caller that has just read the clock pass it on.
  bool Done(uint64_t now_ns = 0) const {
    if (budget_.iters != 0) return count_ >= budget_.iters;
    if (now_ns == 0) now_ns = NowNs();
    return now_ns - start_ns_ >= budget_.duration_ns;
  }
  void Tick(uint64_t n = 1) { count_ += n; }

  uint64_t count() const { return count_; }
  uint64_t start_ns() const { return start_ns_; }

 private:
  Budget budget_;
  uint64_t start_ns_;
  uint64_t count_ = 0;
};

}  // namespace slipperf
