#include "tools/slip-perf/summary.h"

#include <algorithm>
#include <cmath>

namespace slipperf {

uint64_t Histogram::MiddleOf(size_t index) {
  constexpr size_t kExact = size_t{2} << kSubBits;  // indexes below are the values themselves
  if (index < kExact) return index;
  const int shift = static_cast<int>(index >> kSubBits) - 1;
  const uint64_t mantissa = index - (static_cast<size_t>(shift) << kSubBits);
  return (mantissa << shift) + ((uint64_t{1} << shift) - 1) / 2;
}

void Histogram::Merge(const Histogram& other) {
  for (size_t i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
}

double Histogram::Mean() const {
  return count_ == 0 ? 0 : static_cast<double>(sum_) / static_cast<double>(count_);
}

uint64_t Histogram::Percentile(double p) const {
  if (count_ == 0) return 0;
  const auto rank = std::clamp<uint64_t>(
      static_cast<uint64_t>(std::ceil(p / 100.0 * static_cast<double>(count_))), 1, count_);
  uint64_t seen = 0;
  for (size_t i = 0; i < kBuckets; ++i) {
    seen += counts_[i];
    if (seen >= rank) return std::clamp(MiddleOf(i), min_, max_);
  }
  return max_;
}

LatencySummary Summarize(const Histogram& ns, double scale) {
  const double us_per_ns = scale / 1000.0;
  LatencySummary s;
  s.mean_us = ns.Mean() * us_per_ns;
  s.p50_us = static_cast<double>(ns.Percentile(50)) * us_per_ns;
  s.p99_us = static_cast<double>(ns.Percentile(99)) * us_per_ns;
  s.p999_us = static_cast<double>(ns.Percentile(99.9)) * us_per_ns;
  return s;
}

}  // namespace slipperf
