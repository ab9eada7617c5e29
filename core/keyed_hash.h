// SipHash-2-4 (Aumasson and Bernstein) over a few bytes, under a key drawn at start: the
// hash that places a peer's 4-tuple or address in the listener's tables. The peer chooses
// those bytes (its ports, and on loopback its address), so a hash it could predict would
// let it pile every entry into one chain and turn each lookup into a scan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace slip {

class KeyedHash {
 public:
  void SetKey(uint64_t k0, uint64_t k1) noexcept {
    k0_ = k0;
    k1_ = k1;
  }

  uint64_t operator()(const void* data, size_t len) const noexcept {
    uint64_t v0 = k0_ ^ 0x736f6d6570736575ull, v1 = k1_ ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0_ ^ 0x6c7967656e657261ull, v3 = k1_ ^ 0x7465646279746573ull;
    const auto* in = static_cast<const uint8_t*>(data);
    const size_t whole = len & ~size_t(7);
    for (size_t i = 0; i < whole; i += 8) {
      uint64_t m;
      std::memcpy(&m, in + i, 8);
      v3 ^= m;
      Rounds(2, &v0, &v1, &v2, &v3);
      v0 ^= m;
    }
    uint64_t last = uint64_t(len) << 56;
    for (size_t i = whole; i < len; ++i) last |= uint64_t(in[i]) << (8 * (i - whole));
    v3 ^= last;
    Rounds(2, &v0, &v1, &v2, &v3);
    v0 ^= last;
    v2 ^= 0xff;
    Rounds(4, &v0, &v1, &v2, &v3);
    return v0 ^ v1 ^ v2 ^ v3;
  }

 private:
  static uint64_t Rotl(uint64_t x, int b) noexcept { return (x << b) | (x >> (64 - b)); }
  static void Rounds(int n, uint64_t* v0, uint64_t* v1, uint64_t* v2, uint64_t* v3) noexcept {
    for (int i = 0; i < n; ++i) {
      *v0 += *v1;
      *v1 = Rotl(*v1, 13);
      *v1 ^= *v0;
      *v0 = Rotl(*v0, 32);
      *v2 += *v3;
      *v3 = Rotl(*v3, 16);
      *v3 ^= *v2;
      *v0 += *v3;
      *v3 = Rotl(*v3, 21);
      *v3 ^= *v0;
      *v2 += *v1;
      *v1 = Rotl(*v1, 17);
      *v1 ^= *v2;
      *v2 = Rotl(*v2, 32);
    }
  }

  uint64_t k0_ = 0, k1_ = 0;
};

}  // namespace slip
