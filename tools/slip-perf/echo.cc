#include "tools/slip-perf/echo.h"

#include <stdexcept>
#include <string>

#include "tools/slip-perf/clock.h"

namespace slipperf {

uint64_t Echo::Exchange(Link& link) {
  SendAll(link, pattern_.At(offset_), size_);
  if (!RecvAll(link, reply_.data(), size_)) {
    throw std::runtime_error("server closed the connection instead of echoing");
  }
  const uint64_t now = NowNs();
  if (!pattern_.Matches(offset_, reply_.data(), size_)) {
    throw std::runtime_error("echo differs from the message at stream offset " +
                             std::to_string(offset_));
  }
  offset_ += size_;
  return now;
}

void TimedWorker::Warmup(const Budget& budget) {
  Phase warmup(budget);
  for (; !warmup.Done(); warmup.Tick()) Once();
  tally_.warmup_iters = warmup.count();
}

void TimedWorker::Measure(const Budget& budget, uint64_t start_ns) {
  Phase measure(budget, start_ns);
  uint64_t now = start_ns;
  for (; !measure.Done(now); measure.Tick()) {
    const uint64_t begun = NowNs();
    now = Once();
    tally_.ns.Add(now - begun);
  }
  tally_.iters = measure.count();
  tally_.bytes = measure.count() * size_;
  tally_.end_ns = now;
}

}  // namespace slipperf
