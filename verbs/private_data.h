// The bytes verbs puts on the wire outside the rings: rdma_cm private data (REQ and REP),
// the client's HELLO (first SEND on a new queue pair), the link messages of queue pair
// reuse and the SEND-based notifications used where RDMA WRITE WITH IMMEDIATE is missing
// (iWARP).
//
// All integers little-endian; every parser checks length, magic, version and every field
// before anything is trusted. The REQ must fit the 56 bytes rdma_cm allows for
// RDMA_PS_TCP, which is why the client's ring travels in the HELLO instead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/wire.h"

namespace slip::verbs {

constexpr uint32_t kReqMagic = 0x51524c53;    // "SLRQ"
constexpr uint32_t kRepMagic = 0x50524c53;    // "SLRP"
constexpr uint32_t kHelloMagic = 0x4c484c53;  // "SLHL"
constexpr uint32_t kLinkMagic = 0x4b4c4c53;   // "SLLK"
constexpr uint32_t kRejMagic = 0x4a524c53;    // "SLRJ"
constexpr uint8_t kVersion = 1;
constexpr uint8_t kMinRingLog2 = 12;  // 4 KiB
constexpr uint8_t kMaxRingLog2 = 28;  // 256 MiB

constexpr size_t kReqSize = 52;
constexpr size_t kRepSize = 28;
constexpr size_t kHelloSize = 28;
constexpr size_t kLinkSize = 20;
constexpr size_t kRejSize = 8;
constexpr size_t kMaxReqPrivateData = 56;  // rdma_cm, RDMA_PS_TCP

// Flags in REQ and REP.
constexpr uint8_t kFlagSendNotify = 1;  // this side cannot use WRITE WITH IMMEDIATE
// REP only: the listener shares its port (SO_REUSEPORT), so the SYN may reach a process
// that knows nothing of the request. The client sends its CONFIRM only after the accepting
// process said TAKEN on the queue pair (docs/DESIGN.md "Servers that share a port").
constexpr uint8_t kFlagGroup = 2;

struct Req {
  uint8_t flags = 0;
  uint8_t ring_log2 = 0;  // both rings' size, the client's proposal
  uint64_t nonce = 0;
  wire::Endpoint client;  // the TCP 4-tuple the client will connect
  wire::Endpoint server;
};

struct Rep {
  uint8_t flags = 0;
  uint8_t ring_log2 = 0;   // echo: the server built rings of this size
  uint64_t nonce = 0;      // echo of the REQ's
  uint64_t ring_addr = 0;  // the server's receive ring; its credit word follows the ring
  uint32_t rkey = 0;
};

// Private data of a REJECT that is not a "no": the REQ was well formed, but the member of
// the listener's SO_REUSEPORT group that its SYN will reach is not served here. Either
// that member's process listens on rdma_cm at a port of its own (kRedirect: ask there,
// once), or nobody serves it (kMemberElsewhere: a plain member; that connection goes
// plain). Either way the destination is not remembered as a plain one.
enum class RejCode : uint8_t { kMemberElsewhere = 1, kRedirect = 2 };
struct Rej {
  RejCode code = RejCode::kMemberElsewhere;
  uint16_t port = 0;  // kRedirect: the member's rdma_cm port (nonzero); else 0
};

struct Hello {
  uint8_t ring_log2 = 0;
  uint64_t nonce = 0;
  uint64_t ring_addr = 0;  // the client's receive ring; its credit word follows the ring
  uint32_t rkey = 0;
};

// Reuse of a queue pair (docs/DESIGN.md "Reusing queue pairs"): SENDs on a queue pair whose
// stream has ended at both ends.
enum class LinkKind : uint8_t {
  kParked = 1,  // my stream is over, my queue pair waits for the next connection
  kClaim = 2,   // client: the next connection has this 4-tuple's ports and nonce
  kAnswer = 3,  // listener: the claim is pending (accepted) or refused
  kTaken = 4,   // listener of a group (kFlagGroup): this process accepted the connection
};
struct LinkMsg {
  LinkKind kind = LinkKind::kParked;
  uint8_t ring_log2 = 0;     // kClaim: both rings' size (the parked rings')
  bool accepted = false;     // kAnswer
  uint64_t nonce = 0;        // kClaim, kAnswer and kTaken (echo)
  uint16_t client_port = 0;  // kClaim: the addresses are the queue pair's own
  uint16_t server_port = 0;
};

enum class ParseResult : uint8_t { kOk = 0, kShort, kBadMagic, kBadVersion, kBadField };
const char* ParseResultName(ParseResult r) noexcept;

size_t EncodeReq(const Req& req, uint8_t* out, size_t cap) noexcept;
ParseResult ParseReq(const uint8_t* data, size_t len, Req* out) noexcept;
size_t EncodeRep(const Rep& rep, uint8_t* out, size_t cap) noexcept;
ParseResult ParseRep(const uint8_t* data, size_t len, Rep* out) noexcept;
size_t EncodeHello(const Hello& hello, uint8_t* out, size_t cap) noexcept;
ParseResult ParseHello(const uint8_t* data, size_t len, Hello* out) noexcept;
size_t EncodeRej(const Rej& rej, uint8_t* out, size_t cap) noexcept;
// (rdma_cm hands a REJECT's private data over padded to the transport's size.)
ParseResult ParseRej(const uint8_t* data, size_t len, Rej* out) noexcept;
size_t EncodeLink(const LinkMsg& msg, uint8_t* out, size_t cap) noexcept;
ParseResult ParseLink(const uint8_t* data, size_t len, LinkMsg* out) noexcept;

// Notifications: 32 bits, as an immediate or as a 4-byte SEND. The top two bits say what
// happened; the rest carries the low 30 bits of a 64-bit cursor (rings are at most 2^28
// bytes, so a cursor never moves 2^30 between two notifications). kEof and kClosed carry
// no cursor: kClosed's value says whether the closing end keeps its queue pair for reuse
// (kClosedLingers) or disconnects.
enum class Note : uint8_t { kData = 0, kCredit = 1, kEof = 2, kClosed = 3 };
constexpr uint32_t kNoteValueMask = (1u << 30) - 1;
constexpr uint32_t kClosedLingers = 1;
constexpr uint32_t EncodeNote(Note note, uint64_t cursor) noexcept {
  return (uint32_t(note) << 30) | uint32_t(cursor & kNoteValueMask);
}
constexpr Note NoteKind(uint32_t note) noexcept {
  return Note(note >> 30);
}
// Extends a note's 30-bit cursor to 64 bits, given the last value seen (cursors only grow).
constexpr uint64_t NoteCursor(uint32_t note, uint64_t last) noexcept {
  return last + ((note - uint32_t(last)) & kNoteValueMask);
}

}  // namespace slip::verbs
