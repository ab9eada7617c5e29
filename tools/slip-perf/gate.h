// Lines up the threads of one test between its phases (warm-up, measuring, finishing), so
// that every link measures over the same interval. A thread that fails breaks the gate:
// whoever waits there or arrives later gets GateBroken, so that no thread waits forever for
// one that is gone.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>

namespace slipperf {

struct GateBroken : std::runtime_error {
  GateBroken() : std::runtime_error("another thread of the test failed") {}
};

class Gate {
 public:
  // `on_open(n)` runs in the last thread to arrive, before the n-th opening (0, 1, ...)
  // releases anyone: the place to read the clock that starts or ends a phase.
  Gate(size_t parties, std::function<void(uint64_t)> on_open)
      : parties_(parties), on_open_(std::move(on_open)) {}

  // Waits until all parties have arrived. Throws GateBroken.
  void Arrive();
  void Break() noexcept;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const size_t parties_;
  const std::function<void(uint64_t)> on_open_;
  size_t arrived_ = 0;
  uint64_t openings_ = 0;
  bool broken_ = false;
};

}  // namespace slipperf
