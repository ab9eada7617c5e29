// The memory of a connection's rings: an anonymous mapping of its own, page aligned and
// zero-filled, whose cost is its size in address space, given back whole when it goes.
// (From the allocator, 2 MiB blocks freed by a flood of unanswered requests stayed in the
// progress thread's arena: a server's address space grew by gigabytes and stayed so.)
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace slip::fabric {

class RingMemory {
 public:
  RingMemory() noexcept = default;
  // `bytes` (a multiple of the page size) mapped, or an empty RingMemory.
  static RingMemory Map(size_t bytes) noexcept {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    RingMemory m;
    if (p != MAP_FAILED) {
      m.base_ = static_cast<uint8_t*>(p);
      m.bytes_ = bytes;
    }
    return m;
  }
  ~RingMemory() { Unmap(); }
  RingMemory(RingMemory&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  RingMemory& operator=(RingMemory&& o) noexcept {
    if (this != &o) {
      Unmap();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  RingMemory(const RingMemory&) = delete;
  RingMemory& operator=(const RingMemory&) = delete;

  uint8_t* get() const noexcept { return base_; }
  size_t size() const noexcept { return bytes_; }
  explicit operator bool() const noexcept { return base_ != nullptr; }
  // Never unmapped (a fork child's, or memory a registration may still reach).
  void Leak() noexcept {
    base_ = nullptr;
    bytes_ = 0;
  }

 private:
  void Unmap() noexcept {
    if (base_) munmap(base_, bytes_);
  }
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace slip::fabric
