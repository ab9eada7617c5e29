// A sweep: every test at every message size, repeated, each point reduced to its median run
// and the spread of its main figure across the repeats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/slip-perf/budget.h"
#include "tools/slip-perf/endpoints.h"
#include "tools/slip-perf/protocol.h"
#include "tools/slip-perf/report.h"

namespace slipperf {

constexpr uint32_t kDefaultLatSize = 64;
constexpr uint32_t kDefaultBwSize = 64 * 1024;

struct SweepOptions {
  std::vector<TestId> tests;
  std::vector<uint32_t> sizes;  // empty: each test's default (64 B; bw 64 KiB)
  Budget budget;                // per run
  uint32_t repeat = 1;
  uint32_t streams = 1;  // bw: links of one test
  uint32_t conns = 1;    // rr, crr: links (connections, or connecting threads)
  Verify verify = Verify::kSampled;
};

// Names the results `prefix`_kind ("tcp_lat", "shm_bw"). Throws at the first failed run,
// naming its test and size.
std::vector<Result> RunSweep(Link& control, Connector& connector, const SweepOptions& options,
                             const std::string& prefix);

// The run with the median main figure (the lower middle one for an even count), carrying
// the spread of all of them.
Result CombineRepeats(std::vector<Result> runs);

}  // namespace slipperf
