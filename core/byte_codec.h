// Little-endian fields in a byte buffer, without alignment assumptions: what every wire
// format of ours (core/wire.h, verbs/private_data.h, shm/msg_wire.h) reads and writes with.
//
// Both cursors are bounded: a write past `cap` or a read past `len` does nothing (a read
// yields zeros) and clears ok(), so that a parser can read every field and check once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace slip {

class ByteWriter {
 public:
  ByteWriter(uint8_t* out, size_t cap) noexcept : out_(out), cap_(cap) {}
  void U8(uint8_t v) noexcept { Bytes(&v, 1); }
  void U16(uint16_t v) noexcept {
    const uint8_t b[2] = {uint8_t(v), uint8_t(v >> 8)};
    Bytes(b, 2);
  }
  void U32(uint32_t v) noexcept {
    const uint8_t b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
    Bytes(b, 4);
  }
  void U64(uint64_t v) noexcept {
    U32(uint32_t(v));
    U32(uint32_t(v >> 32));
  }
  void Bytes(const void* p, size_t n) noexcept {
    if (pos_ + n > cap_) {
      ok_ = false;
      return;
    }
    std::memcpy(out_ + pos_, p, n);
    pos_ += n;
  }
  size_t size() const noexcept { return pos_; }
  bool ok() const noexcept { return ok_; }

 private:
  uint8_t* out_;
  size_t cap_;
  size_t pos_ = 0;
  bool ok_ = true;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* in, size_t len) noexcept : in_(in), len_(len) {}
  uint8_t U8() noexcept {
    uint8_t v = 0;
    Bytes(&v, 1);
    return v;
  }
  uint16_t U16() noexcept {
    uint8_t b[2] = {};
    Bytes(b, 2);
    return uint16_t(b[0] | (b[1] << 8));
  }
  uint32_t U32() noexcept {
    uint8_t b[4] = {};
    Bytes(b, 4);
    return uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
  }
  uint64_t U64() noexcept {
    const uint64_t lo = U32();
    return lo | uint64_t(U32()) << 32;
  }
  void Bytes(void* p, size_t n) noexcept {
    if (pos_ + n > len_) {
      ok_ = false;
      std::memset(p, 0, n);
      return;
    }
    std::memcpy(p, in_ + pos_, n);
    pos_ += n;
  }
  bool ok() const noexcept { return ok_; }
  bool at_end() const noexcept { return pos_ == len_; }

 private:
  const uint8_t* in_;
  size_t len_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace slip
