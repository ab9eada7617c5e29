// Monotonic time in nanoseconds (vDSO clock_gettime, no system call).
#pragma once

#include <chrono>
#include <cstdint>

namespace slipperf {

inline uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace slipperf
