#include "tools/slip-perf/pattern.h"

namespace slipperf {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

Pattern::Pattern(uint64_t seed, size_t max_len) : bytes_(max_len + kPeriod) {
  uint64_t state = seed;
  for (size_t i = 0; i < kPeriod; i += 8) {
    const uint64_t word = SplitMix64(&state);
    for (size_t j = 0; j < 8 && i + j < kPeriod; ++j)
      bytes_[i + j] = static_cast<uint8_t>(word >> (8 * j));
  }
  for (size_t i = kPeriod; i < bytes_.size(); ++i) bytes_[i] = bytes_[i - kPeriod];
}

bool Pattern::MatchesSampled(uint64_t offset, const void* data, size_t len) const {
  constexpr size_t kStride = 256;
  constexpr size_t kWord = 8;
  if (len <= kStride) return Matches(offset, data, len);
  const uint8_t* expected = At(offset);
  const auto* got = static_cast<const uint8_t*>(data);
  auto word_matches = [&](size_t i) {
    uint64_t a, b;
    std::memcpy(&a, got + i, kWord);
    std::memcpy(&b, expected + i, kWord);
    return a == b;
  };
  if (!word_matches(0) || !word_matches(len - kWord)) return false;
  bool ok = true;
  for (size_t i = (kStride - offset % kStride) % kStride; i + kWord <= len; i += kStride) {
    ok &= word_matches(i);
  }
  return ok;
}

size_t Pattern::FirstMismatch(uint64_t offset, const void* data, size_t len) const {
  const uint8_t* expected = At(offset);
  const auto* got = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < len; ++i) {
    if (got[i] != expected[i]) return i;
  }
  return len;
}

}  // namespace slipperf
