#include "core/wire.h"

#include <netinet/in.h>

#include <cstring>

#include "core/byte_codec.h"

namespace slip::wire {

void PutEndpoint(ByteWriter* w, const Endpoint& e) noexcept {
  w->U8(e.family);
  w->U8(0);
  w->U16(e.port);
  w->Bytes(e.addr, 16);
}

bool GetEndpoint(ByteReader* r, Endpoint* e) noexcept {
  e->family = r->U8();
  const uint8_t pad = r->U8();
  e->port = r->U16();
  r->Bytes(e->addr, 16);
  if (pad != 0 || (e->family != 4 && e->family != 6)) return false;
  if (e->family == 4) {
    for (int i = 4; i < 16; ++i)
      if (e->addr[i] != 0) return false;
  } else {
    // Senders encode v4-mapped addresses as family 4; anything else cannot match.
    static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(e->addr, kMapped, 12) == 0) return false;
  }
  return true;
}

namespace {

// Payload length of each type: fixed, so a length field that disagrees is malformed.
size_t PayloadSize(Type t) noexcept {
  constexpr size_t kAddr = kEndpointBytes;
  switch (t) {
    case Type::kRegister:
      return 2 * kAddr + 8 + 4 + 4 + 8;
    case Type::kCancel:
      return 2 * kAddr + 8;
    case Type::kConfirm:
      return 8 + 4 + 4;
    case Type::kAccept:
      return 8;
    case Type::kDecline:
      return 8 + 4;
    case Type::kFailover:
      return 8 + 8 + 4 + 4;
    case Type::kUrgent:
      return 8 + 1 + 1 + 2 + 4 + 4;  // (a length no other type has)
    case Type::kWindow:
      return 4;
  }
  return 0;
}

bool KnownType(uint8_t t) noexcept {
  return t >= 1 && t <= 8;
}

bool ValidRingSize(uint32_t size) noexcept {
  return size >= 4096 && size <= (256u << 20) && (size & (size - 1)) == 0;
}

bool ParsePayload(Type type, ByteReader* r, Message* out) noexcept {
  out->type = type;
  switch (type) {
    case Type::kRegister: {
      Register& m = out->reg;
      m = Register();
      if (!GetEndpoint(r, &m.client) || !GetEndpoint(r, &m.server)) return false;
      m.nonce = r->U64();
      m.ring_size = r->U32();
      m.fd_count = r->U32();
      m.region_size = r->U64();
      return ValidRingSize(m.ring_size) && m.fd_count > 0 && m.fd_count <= 8 &&
             m.region_size >= 2ull * m.ring_size && m.region_size <= (1ull << 30);
    }
    case Type::kCancel: {
      Cancel& m = out->cancel;
      m = Cancel();
      if (!GetEndpoint(r, &m.client) || !GetEndpoint(r, &m.server)) return false;
      m.nonce = r->U64();
      return true;
    }
    case Type::kConfirm: {
      out->confirm = Confirm();
      out->confirm.nonce = r->U64();
      out->confirm.ring_size = r->U32();
      uint32_t reserved = r->U32();
      return reserved == 0 && ValidRingSize(out->confirm.ring_size);
    }
    case Type::kAccept:
      out->accept = Accept();
      out->accept.nonce = r->U64();
      return true;
    case Type::kDecline: {
      out->decline = Decline();
      out->decline.nonce = r->U64();
      uint32_t reason = r->U32();
      if (reason > static_cast<uint32_t>(DeclineReason::kDescriptors)) return false;
      out->decline.reason = static_cast<DeclineReason>(reason);
      return true;
    }
    case Type::kFailover: {
      out->failover = Failover();
      out->failover.received = r->U64();
      out->failover.sent = r->U64();
      uint32_t cause = r->U32();
      uint32_t reserved = r->U32();
      if (cause > static_cast<uint32_t>(FailoverCause::kHandBack) || reserved != 0) return false;
      out->failover.cause = static_cast<FailoverCause>(cause);
      return true;
    }
    case Type::kUrgent: {
      out->urgent = Urgent();
      out->urgent.offset = r->U64();
      out->urgent.byte = r->U8();
      const uint8_t ack = r->U8();
      const uint16_t reserved16 = r->U16();
      const uint32_t reserved32 = r->U32();
      const uint32_t reserved32b = r->U32();
      out->urgent.ack = ack == 1;
      return ack <= 1 && reserved16 == 0 && reserved32 == 0 && reserved32b == 0 &&
             (ack == 0 || out->urgent.byte == 0);
    }
    case Type::kWindow:
      out->window = Window();
      out->window.bytes = r->U32();
      return out->window.bytes <= kMaxWindow;
  }
  return false;
}

}  // namespace

bool Endpoint::operator==(const Endpoint& o) const noexcept {
  return family == o.family && port == o.port && std::memcmp(addr, o.addr, 16) == 0;
}

bool EndpointFromSockaddr(const sockaddr* sa, Endpoint* out) noexcept {
  *out = Endpoint();
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    out->family = 4;
    out->port = ntohs(in->sin_port);
    std::memcpy(out->addr, &in->sin_addr, 4);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    out->port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      out->family = 4;
      std::memcpy(out->addr, in6->sin6_addr.s6_addr + 12, 4);
    } else {
      out->family = 6;
      std::memcpy(out->addr, in6->sin6_addr.s6_addr, 16);
    }
    return true;
  }
  return false;
}

bool SockaddrFromEndpoint(const Endpoint& ep, sockaddr_storage* out) noexcept {
  std::memset(out, 0, sizeof(*out));
  if (ep.family == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(out);
    in->sin_family = AF_INET;
    in->sin_port = htons(ep.port);
    std::memcpy(&in->sin_addr, ep.addr, 4);
    return true;
  }
  if (ep.family != 6) return false;
  auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
  in6->sin6_family = AF_INET6;
  in6->sin6_port = htons(ep.port);
  std::memcpy(&in6->sin6_addr, ep.addr, 16);
  return true;
}

uint32_t Crc32c(const uint8_t* data, size_t len, uint32_t crc) noexcept {
  // Bitwise CRC32C (Castagnoli): messages are tiny and on the control path only.
  crc = ~crc;
  for (size_t i = 0; i < len; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

const char* ParseStatusName(ParseStatus s) noexcept {
  switch (s) {
    case ParseStatus::kOk:
      return "ok";
    case ParseStatus::kNeedMore:
      return "truncated";
    case ParseStatus::kNotSlipstream:
      return "not slipstream";
    case ParseStatus::kBadVersion:
      return "bad version";
    case ParseStatus::kBadType:
      return "bad type";
    case ParseStatus::kBadLength:
      return "bad length";
    case ParseStatus::kBadChecksum:
      return "bad checksum";
    case ParseStatus::kBadField:
      return "bad field";
  }
  return "?";
}

ParseStatus ParseMessage(const uint8_t* data, size_t len, Message* out, size_t* consumed) noexcept {
  *consumed = 0;
  // Judge the magic on whatever prefix has arrived: application bytes must be recognised
  // as such as early as possible, and never be held back waiting for a full header.
  static const uint8_t kMagicBytes[4] = {uint8_t(kMagic), uint8_t(kMagic >> 8),
                                         uint8_t(kMagic >> 16), uint8_t(kMagic >> 24)};
  size_t prefix = len < 4 ? len : 4;
  // (len == 0 may come with data == nullptr, which memcmp must not be given even for 0 bytes.)
  if (prefix != 0 && std::memcmp(data, kMagicBytes, prefix) != 0)
    return ParseStatus::kNotSlipstream;
  if (len < kHeaderSize) return ParseStatus::kNeedMore;

  ByteReader hdr(data, kHeaderSize);
  hdr.U32();  // magic, checked above
  uint8_t version = hdr.U8();
  uint8_t type = hdr.U8();
  uint16_t flags = hdr.U16();
  uint32_t length = hdr.U32();
  uint32_t checksum = hdr.U32();
  if (version != kVersion) return ParseStatus::kBadVersion;
  if (!KnownType(type)) return ParseStatus::kBadType;
  if (flags != 0) return ParseStatus::kBadField;
  Type t = static_cast<Type>(type);
  if (length != kHeaderSize + PayloadSize(t)) return ParseStatus::kBadLength;
  if (len < length) return ParseStatus::kNeedMore;

  uint8_t copy[kMaxMessageSize];
  std::memcpy(copy, data, length);
  std::memset(copy + 12, 0, 4);
  if (Crc32c(copy, length) != checksum) return ParseStatus::kBadChecksum;

  ByteReader body(data + kHeaderSize, length - kHeaderSize);
  if (!ParsePayload(t, &body, out) || !body.ok() || !body.at_end()) return ParseStatus::kBadField;
  *consumed = length;
  return ParseStatus::kOk;
}

size_t EncodeMessage(const Message& msg, uint8_t* out, size_t cap) noexcept {
  size_t length = kHeaderSize + PayloadSize(msg.type);
  if (length > cap || length > kMaxMessageSize || !KnownType(static_cast<uint8_t>(msg.type)))
    return 0;
  ByteWriter w(out, cap);
  w.U32(kMagic);
  w.U8(kVersion);
  w.U8(static_cast<uint8_t>(msg.type));
  w.U16(0);
  w.U32(static_cast<uint32_t>(length));
  w.U32(0);  // checksum, filled below
  switch (msg.type) {
    case Type::kRegister:
      PutEndpoint(&w, msg.reg.client);
      PutEndpoint(&w, msg.reg.server);
      w.U64(msg.reg.nonce);
      w.U32(msg.reg.ring_size);
      w.U32(msg.reg.fd_count);
      w.U64(msg.reg.region_size);
      break;
    case Type::kCancel:
      PutEndpoint(&w, msg.cancel.client);
      PutEndpoint(&w, msg.cancel.server);
      w.U64(msg.cancel.nonce);
      break;
    case Type::kConfirm:
      w.U64(msg.confirm.nonce);
      w.U32(msg.confirm.ring_size);
      w.U32(0);
      break;
    case Type::kAccept:
      w.U64(msg.accept.nonce);
      break;
    case Type::kDecline:
      w.U64(msg.decline.nonce);
      w.U32(static_cast<uint32_t>(msg.decline.reason));
      break;
    case Type::kFailover:
      w.U64(msg.failover.received);
      w.U64(msg.failover.sent);
      w.U32(static_cast<uint32_t>(msg.failover.cause));
      w.U32(0);
      break;
    case Type::kUrgent:
      w.U64(msg.urgent.offset);
      w.U8(msg.urgent.ack ? 0 : msg.urgent.byte);
      w.U8(msg.urgent.ack ? 1 : 0);
      w.U16(0);
      w.U32(0);
      w.U32(0);
      break;
    case Type::kWindow:
      w.U32(msg.window.bytes);
      break;
  }
  if (!w.ok() || w.size() != length) return 0;
  uint32_t crc = Crc32c(out, length);
  out[12] = uint8_t(crc);
  out[13] = uint8_t(crc >> 8);
  out[14] = uint8_t(crc >> 16);
  out[15] = uint8_t(crc >> 24);
  return length;
}

}  // namespace slip::wire
