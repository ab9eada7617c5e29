// CPU use of this process over an interval: user + system time of all its threads (the
// preloaded library's own threads included: they are part of what the program costs),
// as a percentage of one core.
#pragma once

#include <cstdint>

namespace slipperf {

struct CpuSample {
  uint64_t cpu_ns = 0;
  uint64_t wall_ns = 0;
};

CpuSample SampleCpu();

// 100 = one core busy for the whole interval; above 100 with several busy threads.
double CpuPercent(uint64_t cpu_ns, uint64_t wall_ns);
inline double CpuPercent(const CpuSample& from, const CpuSample& to) {
  return CpuPercent(to.cpu_ns - from.cpu_ns, to.wall_ns - from.wall_ns);
}

// Restricts the calling process (and the threads it starts later) to one CPU; -1 leaves
// it as it is. Throws when the CPU cannot be used.
void PinToCpu(int cpu);

}  // namespace slipperf
