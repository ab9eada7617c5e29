// The wire of shm's message comms (shm/msg.h): the handle a listener publishes, the HELLO a
// sender connects with, and what goes through the region's two rings.
//
//   handle   kHandleMagic, version, the host it was made on (boot id and network namespace:
//            an abstract name means nothing elsewhere), the listener's uid and pid, the
//            abstract name's token, and the listener's secret (the sender proves it read the
//            handle by sending it back: the abstract name itself is listed in
//            /proc/net/unix for anybody to see)
//   HELLO    sender -> listener on the rendezvous socket, with the region's memfd
//            (SCM_RIGHTS): the secret, the ring size, the region's nonce
//   forward ring (sender -> receiver, RegionControl::to_server): frames, each a FrameHeader
//            then its payload, padded to kFrameAlign so that no header crosses the wrap
//   reverse ring (receiver -> sender, RegionControl::to_client): clear-to-send records of
//            kCtsBytes, one per posted receive (its sequence number and each buffer's tag
//            and capacity), in the ring's first CtsWindow bytes
//
// Every parser here reads bytes a peer wrote and returns false on anything out of range.
// The handle and HELLO are little-endian fields (core/byte_codec.h); what goes through the
// rings (frame headers, CTS records) is in the host's order, both ends being one host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/msg_comm.h"

namespace slip::shm::msgwire {

constexpr uint32_t kHandleMagic = 0x4e4e4c53;  // "SLNN"
constexpr uint32_t kHelloMagic = 0x484e4c53;   // "SLNH"
constexpr uint16_t kVersion = 1;
constexpr size_t kHostIdBytes = 24;

struct HostId {
  uint8_t bytes[kHostIdBytes] = {};  // boot id (16) and network namespace inode (8)
  bool operator==(const HostId&) const = default;
  bool SameBoot(const HostId& o) const noexcept;  // the same running kernel: this host
};

// Handle flags.
// The listener also listens in the rendezvous directory (SLIP_RENDEZVOUS_DIR): a sender in
// another network namespace of this host, which cannot see its abstract name, connects
// there ("<dir>/nccl-<pid>-<token>").
constexpr uint16_t kHandleInDir = 1;

struct Handle {
  uint16_t flags = 0;  // kHandle*
  HostId host;
  uint32_t uid = 0;
  uint32_t pid = 0;
  uint64_t name_token = 0;  // the abstract name: "slipstream-nccl:<pid>:<token hex>"
  uint64_t secret = 0;
};
constexpr size_t kHandleWireBytes = 4 + 2 + 2 + kHostIdBytes + 4 + 4 + 8 + 8;
static_assert(kHandleWireBytes <= msg::kHandleBytes);
void EncodeHandle(const Handle& h, uint8_t out[msg::kHandleBytes]) noexcept;
bool ParseHandle(const uint8_t* in, size_t len, Handle* out) noexcept;

struct Hello {
  uint64_t secret = 0;
  uint64_t region_nonce = 0;
  uint32_t ring_size = 0;
};
constexpr size_t kHelloBytes = 4 + 2 + 2 + 8 + 8 + 4 + 4;
void EncodeHello(const Hello& h, uint8_t out[kHelloBytes]) noexcept;
bool ParseHello(const uint8_t* in, size_t len, Hello* out) noexcept;

// A frame: one send's bytes for buffer `index` of the receive posted as `seq`.
struct FrameHeader {
  uint32_t seq;
  uint16_t index;
  uint16_t reserved;
  uint64_t size;
};
static_assert(sizeof(FrameHeader) == 16);
constexpr uint32_t kFrameAlign = 16;
inline uint64_t FrameBytes(uint64_t payload) noexcept {
  return sizeof(FrameHeader) + ((payload + kFrameAlign - 1) & ~uint64_t(kFrameAlign - 1));
}

// A clear-to-send record: receive `seq` posted `count` buffers.
struct CtsEntry {
  int32_t tag;
  uint32_t reserved;
  uint64_t capacity;
};
struct CtsRecord {
  uint32_t seq;
  uint16_t count;
  uint16_t reserved;
  uint64_t reserved2;
  CtsEntry entries[msg::kMaxGroup];
};
constexpr size_t kCtsBytes = 256;  // a power of two: records never cross the wrap
static_assert(sizeof(CtsRecord) <= kCtsBytes);
// The records go round the first CtsWindow(ring size) bytes of the reverse ring only: a
// receiver has at most kMaxRequests receives posted, so no more records are ever
// outstanding, and the rest of that ring's pages are never touched (a comm costs its
// forward ring, not two rings: NCCL makes several comms per peer).
constexpr uint64_t CtsWindow(uint32_t ring_size) noexcept {
  return ring_size < kCtsBytes * msg::kMaxRequests ? ring_size : kCtsBytes * msg::kMaxRequests;
}
// Whether a record the receiver wrote can be used: the expected sequence number, a count
// of 1..kMaxGroup, capacities within `max_capacity`.
bool ValidCts(const CtsRecord& r, uint32_t expected_seq, uint64_t max_capacity) noexcept;

// This host's identity as a handle writes it.
HostId ThisHost() noexcept;

}  // namespace slip::shm::msgwire
