// What the script-driven fuzz targets share: the input read as a script of the peer's
// moves, and the trap that marks a broken promise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slip::fuzz {

inline void Require(bool ok) {
  if (!ok) __builtin_trap();
}

// Reads the input front to back; past its end every read is zero (the script just stops).
class Script {
 public:
  Script(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return uint16_t(U8() | U8() << 8); }
  uint32_t U32() { return uint32_t(U16()) | uint32_t(U16()) << 16; }
  uint64_t U64() { return uint64_t(U32()) | uint64_t(U32()) << 32; }
  // Up to n bytes of the input, *got of them.
  const uint8_t* Bytes(size_t n, size_t* got) {
    *got = n < size_ - pos_ ? n : size_ - pos_;
    const uint8_t* p = data_ + pos_;
    pos_ += *got;
    return p;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace slip::fuzz
