// The rendezvous of the shim's streams over libfabric: two UDP datagrams on the TCP
// listener's port number, before the client's SYN (docs/DESIGN.md "Detection across hosts
// (fabric)").
//
//   REQ  client -> listener   the TCP 4-tuple it is about to connect, a nonce, its RDM
//                             endpoint's address (none with connected endpoints) and its
//                             receive ring (key, address, size) and the tag that its notes
//                             to us carry, their form and the endpoints' type
//   REP  listener -> client   the same for the listener's side (with connected endpoints:
//                             the address its connection listener takes fi_connect on):
//                             kept pending under the 4-tuple until accept(), settled by the
//                             in-band CONFIRM
//   REFUSE listener -> client the listener will not carry it (busy, the ring too large):
//                             plain TCP, at once
//
// Fixed size, little-endian; one encoding per message (zeros where nothing is written), so
// that a parser accepts exactly what Encode writes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/wire.h"

namespace slip::fabric::streamwire {

constexpr uint32_t kMagic = 0x53464c53;  // "SLFS"
constexpr uint8_t kVersion = 1;
constexpr size_t kMaxAddressBytes = 64;
constexpr size_t kBytes = 4 + 4 + 8 + 2 * wire::kEndpointBytes + 8 + 8 + 8 + kMaxAddressBytes;

enum class Type : uint8_t { kReq = 1, kRep = 2, kRefuse = 3 };

// The endpoints both ends use (fabric/options.h, SLIP_FABRIC_ENDPOINT).
enum class Endpoints : uint8_t {
  kReliableDatagram = 1,  // one FI_EP_RDM endpoint per process; the address is its name
  kConnected = 2,         // one FI_EP_MSG endpoint per connection; the REP's address is the
                          // listener's (a sockaddr), the REQ's is empty
};

// The notes' forms (Message::note_bytes): the cursor in 8 bytes of CQ data; a cursor word
// and a 4-byte doorbell; over connected endpoints, a 30-bit cursor in 4 bytes of CQ data
// on RMA writes, or on sends into the peer's posted receives (no RMA: the bytes come in
// messages of at most kSendBytes, which the receiver copies into its ring; the ring key
// and address are 0, rings at most 2^kSendsMaxRingLog2 bytes).
constexpr uint8_t kNoteCursor8 = 8;
constexpr uint8_t kNoteWords = 4;
constexpr uint8_t kNoteLinkCursor = 30;
constexpr uint8_t kNoteSends = 31;
constexpr uint32_t kSendBytes = 65536;
constexpr uint8_t kSendsMaxRingLog2 = 28;
constexpr bool KnownNoteForm(uint8_t form) noexcept {
  return form == kNoteCursor8 || form == kNoteWords || form == kNoteLinkCursor ||
         form == kNoteSends;
}
// A cursor without a tag is only safe where nobody else can write: connected endpoints.
constexpr bool ConnectedOnlyForm(uint8_t form) noexcept {
  return form == kNoteLinkCursor || form == kNoteSends;
}

// The smallest and largest rings a message may name (core's SLIP_RING_SIZE bounds).
constexpr uint8_t kMinRingLog2 = 12;
constexpr uint8_t kMaxRingLog2 = 30;
constexpr uint32_t kMaxNoteTag = (1u << 24) - 1;

// ring_log2 for a ring of `size` bytes (a power of two).
constexpr uint8_t RingLog2(uint32_t size) noexcept {
  uint8_t n = 0;
  while ((uint64_t(1) << n) < size) ++n;
  return n;
}

struct Message {
  Type type = Type::kReq;
  uint8_t ring_log2 = 0;    // the sender's receive ring is 1 << ring_log2 bytes (0 in REFUSE)
  uint8_t address_len = 0;  // the sender's endpoint address (0 in REFUSE)
  uint64_t nonce = 0;       // the client's; the REP and REFUSE repeat it
  wire::Endpoint client;    // the TCP 4-tuple
  wire::Endpoint server;
  uint64_t ring_key = 0;   // the receive ring's registration key
  uint64_t ring_addr = 0;  // its address as RMA names it (virtual, or 0: offsets)
  uint32_t note_tag = 0;   // what the peer's notes to the sender must carry to reach its
                           // connection (fabric/stream_note.h): 1 .. kMaxNoteTag
  uint8_t note_bytes = 8;  // the notes' form both ends must use (fabric/stream_note.h):
                           // kNoteCursor8, kNoteWords, kNoteLinkCursor or kNoteSends;
                           // 0 in REFUSE
  Endpoints endpoints = Endpoints::kReliableDatagram;  // (kReliableDatagram in REFUSE)
  uint8_t address[kMaxAddressBytes] = {};
};

// False when `m` cannot be written (an address too long, a ring out of bounds).
bool Encode(const Message& m, uint8_t out[kBytes]) noexcept;
// False for anything Encode would not have written; *out is untouched then.
bool Parse(const uint8_t* in, size_t len, Message* out) noexcept;

// What a client's fi_connect carries to the listener's connection listener (its
// connection-request data): the listener's connection it is for (the REP's note tag) and
// the REQ's nonce. The listener accepts it only for a connection of that tag that waits
// for its endpoint, with that nonce, from the REQ's client address.
constexpr uint32_t kLinkMagic = 0x53464c43;  // "SLFC"
constexpr size_t kLinkBytes = 4 + 4 + 8;
struct LinkParam {
  uint32_t server_tag = 0;  // 1 .. kMaxNoteTag
  uint64_t nonce = 0;
};
void EncodeLink(const LinkParam& p, uint8_t out[kLinkBytes]) noexcept;
// False for anything EncodeLink would not have written; *out is untouched then.
bool ParseLink(const uint8_t* in, size_t len, LinkParam* out) noexcept;

}  // namespace slip::fabric::streamwire
