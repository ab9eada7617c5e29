// The content of a test stream: pseudo-random bytes, seeded per test, that depend on the
// stream offset. The pattern repeats with a period of kPeriod bytes (a prime, so it never
// lines up with power-of-two rings or write sizes), which lets both ends use one
// precomputed buffer: the bytes at stream offset `o` are At(o)[0 .. len), with no per-write
// generation cost. A lost, duplicated, reordered or corrupted byte shows as a mismatch,
// except for a shift by an exact multiple of the period.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace slipperf {

class Pattern {
 public:
  static constexpr size_t kPeriod = 8191;

  // Valid for spans of at most `max_len` bytes.
  Pattern(uint64_t seed, size_t max_len);

  const uint8_t* At(uint64_t offset) const { return bytes_.data() + offset % kPeriod; }

  bool Matches(uint64_t offset, const void* data, size_t len) const {
    return std::memcmp(At(offset), data, len) == 0;
  }

  // A cheap check for bulk data: the first and last 8 bytes of the span and 8 bytes at every
  // stream offset that is a multiple of 256 (one cache line in four), costing about a tenth
  // of a memcpy of the span. Any shift of the stream (a lost, duplicated or reordered span,
  // stale bytes from an earlier lap of a ring) longer than 256 bytes is caught, shorter ones
  // when they cover a sample; a damaged byte between samples is not. Spans of up to 256
  // bytes are compared in full.
  bool MatchesSampled(uint64_t offset, const void* data, size_t len) const;

  // Index of the first byte of `data` that differs from the pattern, or `len`.
  size_t FirstMismatch(uint64_t offset, const void* data, size_t len) const;

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace slipperf
