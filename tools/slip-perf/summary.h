// Latency statistics: a log-linear histogram of times (constant memory however long the
// test runs) and the summary taken from it.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace slipperf {

// Latency in microseconds.
struct LatencySummary {
  double mean_us = 0;
  double p50_us = 0;
  double p99_us = 0;
  double p999_us = 0;
};

// Nanosecond values: exact below 256 ns, above that in buckets 1/128 of a power of two wide,
// so a percentile is off by less than 0.4% (it reports the middle of its bucket, kept
// within the exact minimum and maximum). The mean is exact.
class Histogram {
 public:
  void Add(uint64_t ns) {
    ++counts_[IndexOf(ns)];
    ++count_;
    sum_ += ns;
    if (ns < min_) min_ = ns;
    if (ns > max_) max_ = ns;
  }

  // Adds every value of `other` (the histograms of a test's threads become one).
  void Merge(const Histogram& other);

  uint64_t count() const { return count_; }
  double Mean() const;
  // Nearest-rank percentile, 0 < p <= 100. 0 when empty.
  uint64_t Percentile(double p) const;

 private:
  static constexpr int kSubBits = 7;
  static constexpr size_t kBuckets = (64 - kSubBits + 1) << kSubBits;

  static size_t IndexOf(uint64_t v) {
    const int top = v == 0 ? 0 : 63 - std::countl_zero(v);
    const int shift = top > kSubBits ? top - kSubBits : 0;
    return (static_cast<size_t>(shift) << kSubBits) + (v >> shift);
  }
  static uint64_t MiddleOf(size_t index);

  std::array<uint64_t, kBuckets> counts_{};
  uint64_t count_ = 0;
  uint64_t sum_ = 0;  // 2^64 ns is 584 years
  uint64_t min_ = UINT64_MAX;
  uint64_t max_ = 0;
};

// Summary of the recorded times, each multiplied by `scale` (0.5: one-way latency from
// round trips).
LatencySummary Summarize(const Histogram& ns, double scale);

}  // namespace slipperf
