// Fixed-size big-endian messages: fields written one after another, read back in order.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace slipperf {

template <size_t N>
class Writer {
 public:
  template <typename T>
  Writer& Put(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) {
      bytes_[pos_++] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * (sizeof(T) - 1 - i)));
    }
    return *this;
  }
  const std::array<uint8_t, N>& bytes() const { return bytes_; }

 private:
  std::array<uint8_t, N> bytes_{};
  size_t pos_ = 0;
};

template <size_t N>
class Reader {
 public:
  explicit Reader(const std::array<uint8_t, N>& bytes) : bytes_(bytes) {}
  template <typename T>
  T Get() {
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v = (v << 8) | bytes_[pos_++];
    return static_cast<T>(v);
  }

 private:
  const std::array<uint8_t, N>& bytes_;
  size_t pos_ = 0;
};

}  // namespace slipperf
