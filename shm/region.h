// Layout of the shared region of one shm connection (internal to shm/).
//
//   page 0:  RegionHeader, then one DirectionControl per direction
//   then:    the client-to-server ring, then the server-to-client ring (ring_size each)
//
// Invariants: `produced` is written only by the direction's sender and `consumed` only by
// its receiver, each with release ordering after the bytes it covers; they sit on separate
// cache lines. `eof` is set after the sender's last publish, `reader_closed` when the
// receiver is gone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/proxy.h"

namespace slip::shm {

constexpr uint32_t kRegionMagic = 0x4d485350;  // "PSHM"
constexpr size_t kControlPage = 4096;

struct RegionHeader {
  uint32_t magic;
  uint32_t ring_size;
  uint64_t nonce;
  // Whether the rings carry the connection (shm::Claim, shm.h): set once, by compare and
  // exchange from kOpen, by whichever end decides first. Zero (kOpen) in a fresh region.
  std::atomic<uint32_t> claim;
  // The listener's word to the client (kListener*), stored before it takes the claim. The
  // client reads it only after it saw kTaken, and only to choose how it registers its next
  // connections there: a wrong value costs acceleration, never a byte.
  std::atomic<uint32_t> listener_flags;
};

// The listening socket has no SO_REUSEPORT: every SYN to its address reaches it, whatever
// the source port, so a client need not bind a port before registering (it registers with
// its socket instead of its 4-tuple: docs/DESIGN.md, "Registering without a port").
constexpr uint32_t kListenerSolo = 1;
// The listening socket is shared by forked workers: whichever accepts a connection reads its
// registration in that accept() and gives up soon after, so a client that sees its
// connection accepted and not taken need not wait long (the one that read its registration
// may be a sibling: docs/DESIGN.md, "Servers that share a port").
constexpr uint32_t kListenerShared = 2;

struct DirectionControl {
  alignas(64) std::atomic<uint64_t> produced;
  std::atomic<uint32_t> eof;
  alignas(64) std::atomic<uint64_t> consumed;
  std::atomic<uint32_t> reader_closed;
  alignas(64) WakeState wake;
};

struct alignas(64) RegionControl {
  RegionHeader header;
  DirectionControl to_server;
  DirectionControl to_client;
};
static_assert(sizeof(RegionControl) <= kControlPage, "control block must fit its page");
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "cursors must be lock-free across processes");
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "the claim must be lock-free across processes");

// The ring sizes a region may have (SLIP_RING_SIZE's range): a power of two from 4 KiB to
// 256 MiB. Anything else in a registration is refused.
inline bool ValidRingSize(uint32_t ring_size) noexcept {
  return ring_size >= 4096 && ring_size <= (256u << 20) && (ring_size & (ring_size - 1)) == 0;
}

inline size_t RegionSize(uint32_t ring_size) noexcept {
  return kControlPage + 2 * size_t(ring_size);
}

}  // namespace slip::shm
