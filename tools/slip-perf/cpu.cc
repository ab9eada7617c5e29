#include "tools/slip-perf/cpu.h"

#include <sched.h>
#include <sys/resource.h>

#include <cerrno>
#include <string>
#include <system_error>

#include "tools/slip-perf/clock.h"

namespace slipperf {
namespace {

uint64_t Ns(const timeval& tv) {
  return static_cast<uint64_t>(tv.tv_sec) * 1'000'000'000 +
         static_cast<uint64_t>(tv.tv_usec) * 1000;
}

}  // namespace

CpuSample SampleCpu() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return {Ns(ru.ru_utime) + Ns(ru.ru_stime), NowNs()};
}

double CpuPercent(uint64_t cpu_ns, uint64_t wall_ns) {
  return wall_ns == 0 ? 0 : 100.0 * static_cast<double>(cpu_ns) / static_cast<double>(wall_ns);
}

void PinToCpu(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "cannot run on CPU " + std::to_string(cpu));
  }
}

}  // namespace slipperf
