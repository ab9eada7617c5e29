// The wire of verbs' message comms (verbs/msg.h): the handle a listener publishes, the
// private data of the rdma_cm exchange, and the clear-to-send entries a receiver writes
// into its sender's memory.
//
//   handle   kMagic.handle, version, the listener's rdma_cm address (family, port, address)
//            and a 32-byte random secret. The sender proves it read the handle with the
//            secret's first half (in its REQ); the listener proves it made the handle with
//            the second half (in its REP): an rdma_cm address can be listened on by anybody
//            on the fabric once its listener is gone.
//   REQ      sender -> listener: the first half of the secret, where the sender's
//            clear-to-send FIFO is (address and remote key, its own protection domain), and
//            the numbers of its extra queue pairs
//   REP      listener -> sender: the second half, where the receiver's size slots are, and
//            the numbers of as many extra queue pairs of its own
//   CTS      receiver -> sender, by RDMA WRITE into FIFO slot seq % kMaxRequests: one entry
//            per buffer of a posted receive (address, remote key, capacity, tag, the
//            group's size) stamped with seq + 1 in its last word
//   send     sender -> receiver, for a receive of one buffer: one RDMA WRITE WITH IMMEDIATE
//            of the bytes into the posted buffer, the immediate carrying the byte count
//            (kImmSingle); for a buffer of a grouped receive: an RDMA WRITE of the bytes, then
//            an RDMA WRITE WITH IMMEDIATE of the byte count into the receive's size slot, the
//            immediate naming the receive (seq) and the buffer (index). RC executes a queue
//            pair's writes in order, so the receiver sees the bytes before it sees the count,
//            and the receives' arrivals in the order they were posted.
//
// Every parser here reads bytes a peer wrote and returns false on anything out of range;
// all fields are little-endian (core/byte_codec.h), the immediate in network order.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

#include "core/msg_comm.h"
#include "core/msg_handle.h"

namespace slip::verbs::msgwire {

constexpr msg::Magics kMagic = msg::MagicsOf('V');  // "SLVM", "SLVQ", "SLVP"
constexpr uint8_t kVersion = 1;
using msg::kSecretBytes;
using msg::kSecretHalf;

using Handle = msg::AddressHandle;  // core/msg_handle.h
constexpr size_t kHandleWireBytes = msg::kAddressHandleBytes;
void EncodeHandle(const Handle& h, uint8_t out[msg::kHandleBytes]) noexcept;
bool ParseHandle(const uint8_t* in, size_t len, Handle* out) noexcept;

// Where the other end may write: a region of its memory and the key to it.
struct RemoteArea {
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

// Queue pairs per comm: the one rdma_cm connects, and up to three more on the same path
// whose numbers the exchange carries (SLIP_NCCL_QPS), over which large sends are split.
constexpr int kMaxQueuePairs = 4;

struct ConnectData {
  uint8_t proof[kSecretHalf] = {};  // the REQ's: the secret's first half; the REP's: second
  RemoteArea area;                  // the REQ's: the CTS FIFO; the REP's: the size slots
  uint8_t extra = 0;                // queue pairs besides rdma_cm's: 0..kMaxQueuePairs-1
  uint32_t extra_qpn[kMaxQueuePairs - 1] = {};  // theirs (24 bits); 0 past `extra`
};
constexpr size_t kConnectDataBytes = 4 + 1 + 1 + 2 + kSecretHalf + 8 + 4 + 4 * (kMaxQueuePairs - 1);
// 56 bytes of private data fit an rdma_cm REQ on RDMA_PS_TCP.
static_assert(kConnectDataBytes <= 56);
size_t EncodeConnectData(uint32_t magic, const ConnectData& d, uint8_t* out, size_t cap) noexcept;
bool ParseConnectData(uint32_t magic, const uint8_t* in, size_t len, ConnectData* out) noexcept;

// One buffer of a posted receive, as its sender reads it.
struct CtsEntry {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t capacity = 0;  // at most INT_MAX
  int32_t tag = 0;
  uint8_t group = 0;   // buffers in the receive: 1..kMaxGroup
  uint32_t stamp = 0;  // StampFor(the receive's seq): never 0, so fresh memory is no entry
};
constexpr size_t kCtsEntryBytes = 32;
constexpr size_t kCtsSlotBytes = kCtsEntryBytes * msg::kMaxGroup;
constexpr size_t kFifoBytes = kCtsSlotBytes * msg::kMaxRequests;
// The stamp of receive `seq`: seq + 1, skipping 0 when seq wraps.
inline uint32_t StampFor(uint32_t seq) noexcept {
  return seq % 0xffffffffu + 1;
}
void EncodeCts(const CtsEntry& e, uint8_t out[kCtsEntryBytes]) noexcept;
// The stamp is the entry's last word: a sender that sees the stamp it expects has the
// entry (RDMA places a write's bytes in order on the devices we know; the stamp of every
// buffer of the group is checked, not only the first's).
uint32_t CtsStamp(const uint8_t in[kCtsEntryBytes]) noexcept;
bool ParseCts(const uint8_t in[kCtsEntryBytes], uint32_t stamp, CtsEntry* out) noexcept;

// The immediate of a send's completing write. A receive of one buffer: kImmSingle and the
// byte count (at most INT_MAX). A buffer of a grouped receive: the receive's seq (its low
// 28 bits) and the buffer's index.
constexpr uint32_t kImmSingle = 1u << 31;
constexpr uint32_t kImmSeqMask = (1u << 28) - 1;
inline uint32_t EncodeImm(uint32_t seq, uint32_t index) noexcept {
  return ((seq & kImmSeqMask) << 3) | (index & 7u);
}
inline uint32_t ImmSeq(uint32_t imm) noexcept {
  return (imm >> 3) & kImmSeqMask;
}
inline uint32_t ImmIndex(uint32_t imm) noexcept {
  return imm & 7u;
}
static_assert(msg::kMaxGroup <= 8);

}  // namespace slip::verbs::msgwire
