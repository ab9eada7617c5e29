#include "tools/slip-perf/gate.h"

namespace slipperf {

void Gate::Arrive() {
  std::unique_lock<std::mutex> lock(mu_);
  if (broken_) throw GateBroken();
  if (++arrived_ == parties_) {
    on_open_(openings_);
    arrived_ = 0;
    ++openings_;
    cv_.notify_all();
    return;
  }
  const uint64_t opening = openings_;
  cv_.wait(lock, [&] { return broken_ || openings_ != opening; });
  if (openings_ == opening) throw GateBroken();
}

void Gate::Break() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  broken_ = true;
  cv_.notify_all();
}

}  // namespace slipperf
