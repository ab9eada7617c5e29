// Slipstream wire format: the negotiation and control messages (CLC-style).
//
// Every message starts with a 16-byte header: magic, version, type, length and a CRC32C
// over the whole message (with the checksum field zero). All integers are little-endian.
// ParseMessage() checks every field; anything malformed is reported, never trusted:
// the caller declines and falls back to plain TCP.
//
// Flow on one host (shm):
//   client -> rendezvous (out of band, before SYN):   REGISTER (+ fds)
//   rendezvous -> client (out of band):               ACCEPT (nonce) or DECLINE (reason)
//   client -> server (in band, first bytes, only after ACCEPT): CONFIRM (nonce)
//   server -> client (in band):                       DECLINE (verbs, or a CONFIRM with
//                                                     nothing registered: reset)
//   CANCEL stays defined, unused: a withdrawal is the region's claim word (shm/shm.h)
//
// Once accelerated, either end (in band, when its transport fails):  FAILOVER (bytes it
// received); the other answers with its own, then both carry the stream on the TCP
// connection from those offsets (docs/DESIGN.md, "Failover").
//
// Urgent data (MSG_OOB) while the transport carries the stream: the sender tells where its
// urgent byte will be (URGENT), the receiver answers once it knows the mark (URGENT, ack),
// and only then is the byte published, so that no reader takes it for an ordinary one
// (docs/DESIGN.md, "Urgent data"). A receive buffer the application set (SO_RCVBUF) is told
// the same way (WINDOW), so that the peer's sender keeps no more unread than TCP would
// (docs/DESIGN.md, "Buffer sizes").
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

namespace slip {
class ByteWriter;
class ByteReader;
}  // namespace slip

namespace slip::wire {

constexpr uint32_t kMagic = 0x50494c53;  // "SLIP" in little-endian byte order
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderSize = 16;
constexpr size_t kMaxMessageSize = 256;

enum class Type : uint8_t {
  kRegister = 1,
  kCancel = 2,
  kConfirm = 3,
  kAccept = 4,
  kDecline = 5,
  kFailover = 6,
  kUrgent = 7,
  kWindow = 8,
};

// Decline reasons, carried on the wire; stable values.
enum class DeclineReason : uint32_t {
  kUnspecified = 0,
  kNonceMismatch = 1,
  kNoRegistration = 2,
  kBadRegion = 3,
  kResources = 4,
  kPolicy = 5,
  kVersion = 6,
  kBusy = 7,         // the listener holds as many registrations as it allows (from this uid)
  kDescriptors = 8,  // the listener is short of descriptors
};

// An endpoint address as carried on the wire. IPv4 and v4-mapped IPv6 both encode as
// family 4, so the two ends of one connection agree whatever socket family each uses.
struct Endpoint {
  uint8_t family = 0;  // 4 or 6
  uint16_t port = 0;   // host byte order
  uint8_t addr[16] = {};

  bool operator==(const Endpoint& o) const noexcept;
};

// Converts a socket address; returns false for anything but AF_INET/AF_INET6.
bool EndpointFromSockaddr(const sockaddr* sa, Endpoint* out) noexcept;
// The socket address of `ep` (AF_INET or AF_INET6); false for another family.
bool SockaddrFromEndpoint(const Endpoint& ep, sockaddr_storage* out) noexcept;
// An endpoint as every Slipstream message writes it (20 bytes: family, a zero byte, port,
// 16 address bytes), for transports' own messages. Get rejects what no sender writes.
constexpr size_t kEndpointBytes = 20;
void PutEndpoint(ByteWriter* w, const Endpoint& e) noexcept;
bool GetEndpoint(ByteReader* r, Endpoint* e) noexcept;

struct Register {
  Endpoint client;
  Endpoint server;
  uint64_t nonce = 0;
  uint32_t ring_size = 0;
  uint32_t fd_count = 0;
  uint64_t region_size = 0;
};

struct Cancel {
  Endpoint client;
  Endpoint server;
  uint64_t nonce = 0;
};

struct Confirm {
  uint64_t nonce = 0;
  uint32_t ring_size = 0;
};

struct Accept {
  uint64_t nonce = 0;
};

struct Decline {
  uint64_t nonce = 0;
  DeclineReason reason = DeclineReason::kUnspecified;
};

// Why a transport gave up; for the logs, stable values.
enum class FailoverCause : uint32_t {
  kPeerRequest = 0,  // an answer: the other end failed over first
  kTransportError = 1,
  kDeviceRemoved = 2,
  kHandBack = 3,  // the process is about to exec: the stream goes back to plain TCP for good
};

struct Failover {
  uint64_t received = 0;  // bytes of the stream this end received over the transport
  uint64_t sent = 0;      // bytes this end had published when it failed over
  FailoverCause cause = FailoverCause::kPeerRequest;
};

// A mark of urgent data: byte `offset` of the sender's stream is urgent and is `byte`.
// The receiver's answer (`ack`) repeats the offset once the mark is known.
struct Urgent {
  uint64_t offset = 0;
  uint8_t byte = 0;
  bool ack = false;
};

// The sender's receive buffer as its application set it (SO_RCVBUF, as getsockopt reads
// it back), 0 when the kernel chooses it.
struct Window {
  uint32_t bytes = 0;
};
constexpr uint32_t kMaxWindow = 1u << 31;  // (the kernel's own bound is INT_MAX / 2, doubled)

struct Message {
  Type type = Type::kConfirm;
  union {
    Register reg;
    Cancel cancel;
    Confirm confirm;
    Accept accept;
    Decline decline;
    Failover failover;
    Urgent urgent;
    Window window;
  };
  Message() noexcept : confirm() {}
};

enum class ParseStatus : uint8_t {
  kOk = 0,
  kNeedMore,       // a valid prefix; more bytes needed (in-band reads)
  kNotSlipstream,  // magic mismatch: these bytes belong to the application
  kBadVersion,
  kBadType,
  kBadLength,
  kBadChecksum,
  kBadField,
};
const char* ParseStatusName(ParseStatus s) noexcept;

// Parses one message from the front of [data, data+len). On kOk, *consumed is its length.
ParseStatus ParseMessage(const uint8_t* data, size_t len, Message* out, size_t* consumed) noexcept;

// Encodes `msg` into `out` (capacity `cap`); returns the length, or 0 if it does not fit.
size_t EncodeMessage(const Message& msg, uint8_t* out, size_t cap) noexcept;

uint32_t Crc32c(const uint8_t* data, size_t len, uint32_t crc = 0) noexcept;

}  // namespace slip::wire
