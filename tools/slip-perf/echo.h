// What lat, rr and crr share: one request and its echo (`size` bytes of the link's stream
// pattern out, the same bytes back, compared after the clock was read), and a worker whose
// iterations are timed one by one.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/slip-perf/link.h"
#include "tools/slip-perf/pattern.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {

class Echo {
 public:
  Echo(uint64_t seed, uint32_t size) : pattern_(seed, size), reply_(size), size_(size) {}

  // Returns the time the echo was complete (before checking it). Throws when the server
  // closed or the echo differs.
  uint64_t Exchange(Link& link);

 private:
  Pattern pattern_;
  std::vector<uint8_t> reply_;
  uint32_t size_;
  uint64_t offset_ = 0;
};

// Times each iteration (a round trip, a transaction) into the tally's histogram.
class TimedWorker : public ClientWorker {
 public:
  explicit TimedWorker(uint32_t size) : size_(size) {}
  void Warmup(const Budget& budget) final;
  void Measure(const Budget& budget, uint64_t start_ns) final;

 protected:
  // One iteration; returns the time it ended.
  virtual uint64_t Once() = 0;

 private:
  uint32_t size_;
};

}  // namespace slipperf
