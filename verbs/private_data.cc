#include "verbs/private_data.h"

#include <cstring>

#include "core/byte_codec.h"

namespace slip::verbs {

namespace {

bool RingLog2Valid(uint8_t v) noexcept {
  return v >= kMinRingLog2 && v <= kMaxRingLog2;
}

// An IPv4 endpoint keeps its address in the first 4 bytes and zeros after: anything else
// is not a well-formed tuple.
bool AddressValid(uint8_t family, const uint8_t addr[16]) noexcept {
  if (family == 6) return true;
  for (int i = 4; i < 16; ++i) {
    if (addr[i]) return false;
  }
  return true;
}

ParseResult Header(ByteReader* r, size_t len, size_t need, uint32_t magic) noexcept {
  if (len < 5) return ParseResult::kShort;
  if (r->U32() != magic) return ParseResult::kBadMagic;
  if (r->U8() != kVersion) return ParseResult::kBadVersion;
  // A later version may append fields; this one reads what it knows.
  return len < need ? ParseResult::kShort : ParseResult::kOk;
}

}  // namespace

const char* ParseResultName(ParseResult r) noexcept {
  switch (r) {
    case ParseResult::kOk:
      return "ok";
    case ParseResult::kShort:
      return "short";
    case ParseResult::kBadMagic:
      return "bad magic";
    case ParseResult::kBadVersion:
      return "bad version";
    case ParseResult::kBadField:
      return "bad field";
  }
  return "?";
}

size_t EncodeReq(const Req& req, uint8_t* out, size_t cap) noexcept {
  if (cap < kReqSize || req.client.family != req.server.family) return 0;
  ByteWriter w(out, cap);
  w.U32(kReqMagic);
  w.U8(kVersion);
  w.U8(req.flags);
  w.U8(req.ring_log2);
  w.U8(req.client.family);
  w.U16(req.client.port);
  w.U16(req.server.port);
  w.U64(req.nonce);
  w.Bytes(req.client.addr, 16);
  w.Bytes(req.server.addr, 16);
  return kReqSize;
}

ParseResult ParseReq(const uint8_t* data, size_t len, Req* out) noexcept {
  if (!data) return ParseResult::kShort;
  ByteReader r(data, len);
  if (ParseResult h = Header(&r, len, kReqSize, kReqMagic); h != ParseResult::kOk) return h;
  Req req;
  req.flags = r.U8();
  req.ring_log2 = r.U8();
  uint8_t family = r.U8();
  req.client.family = req.server.family = family;
  req.client.port = r.U16();
  req.server.port = r.U16();
  req.nonce = r.U64();
  r.Bytes(req.client.addr, 16);
  r.Bytes(req.server.addr, 16);
  if ((req.flags & ~kFlagSendNotify) || !RingLog2Valid(req.ring_log2) ||
      (family != 4 && family != 6) || req.client.port == 0 || req.server.port == 0 ||
      !AddressValid(family, req.client.addr) || !AddressValid(family, req.server.addr))
    return ParseResult::kBadField;
  *out = req;
  return ParseResult::kOk;
}

size_t EncodeRep(const Rep& rep, uint8_t* out, size_t cap) noexcept {
  if (cap < kRepSize) return 0;
  ByteWriter w(out, cap);
  w.U32(kRepMagic);
  w.U8(kVersion);
  w.U8(rep.flags);
  w.U8(rep.ring_log2);
  w.U8(0);
  w.U64(rep.nonce);
  w.U64(rep.ring_addr);
  w.U32(rep.rkey);
  return kRepSize;
}

ParseResult ParseRep(const uint8_t* data, size_t len, Rep* out) noexcept {
  if (!data) return ParseResult::kShort;
  ByteReader r(data, len);
  if (ParseResult h = Header(&r, len, kRepSize, kRepMagic); h != ParseResult::kOk) return h;
  Rep rep;
  rep.flags = r.U8();
  rep.ring_log2 = r.U8();
  uint8_t pad = r.U8();
  rep.nonce = r.U64();
  rep.ring_addr = r.U64();
  rep.rkey = r.U32();
  if ((rep.flags & ~(kFlagSendNotify | kFlagGroup)) || !RingLog2Valid(rep.ring_log2) || pad != 0)
    return ParseResult::kBadField;
  *out = rep;
  return ParseResult::kOk;
}

size_t EncodeHello(const Hello& hello, uint8_t* out, size_t cap) noexcept {
  if (cap < kHelloSize) return 0;
  ByteWriter w(out, cap);
  w.U32(kHelloMagic);
  w.U8(kVersion);
  w.U8(hello.ring_log2);
  w.U16(0);
  w.U64(hello.nonce);
  w.U64(hello.ring_addr);
  w.U32(hello.rkey);
  return kHelloSize;
}

ParseResult ParseHello(const uint8_t* data, size_t len, Hello* out) noexcept {
  if (!data) return ParseResult::kShort;
  ByteReader r(data, len);
  if (ParseResult h = Header(&r, len, kHelloSize, kHelloMagic); h != ParseResult::kOk) return h;
  Hello hello;
  hello.ring_log2 = r.U8();
  uint16_t pad = r.U16();
  hello.nonce = r.U64();
  hello.ring_addr = r.U64();
  hello.rkey = r.U32();
  if (!RingLog2Valid(hello.ring_log2) || pad != 0) return ParseResult::kBadField;
  *out = hello;
  return ParseResult::kOk;
}

size_t EncodeRej(const Rej& rej, uint8_t* out, size_t cap) noexcept {
  if (cap < kRejSize) return 0;
  ByteWriter w(out, cap);
  w.U32(kRejMagic);
  w.U8(kVersion);
  w.U8(uint8_t(rej.code));
  w.U16(rej.port);
  return kRejSize;
}

ParseResult ParseRej(const uint8_t* data, size_t len, Rej* out) noexcept {
  if (!data) return ParseResult::kShort;
  ByteReader r(data, len);
  if (ParseResult h = Header(&r, len, kRejSize, kRejMagic); h != ParseResult::kOk) return h;
  const uint8_t code = r.U8();
  const uint16_t port = r.U16();
  const bool valid = (code == uint8_t(RejCode::kMemberElsewhere) && port == 0) ||
                     (code == uint8_t(RejCode::kRedirect) && port != 0);
  if (!valid) return ParseResult::kBadField;
  out->code = RejCode(code);
  out->port = port;
  return ParseResult::kOk;
}

size_t EncodeLink(const LinkMsg& msg, uint8_t* out, size_t cap) noexcept {
  if (cap < kLinkSize) return 0;
  ByteWriter w(out, cap);
  w.U32(kLinkMagic);
  w.U8(kVersion);
  w.U8(uint8_t(msg.kind));
  w.U8(msg.ring_log2);
  w.U8(msg.accepted ? 1 : 0);
  w.U64(msg.nonce);
  w.U16(msg.client_port);
  w.U16(msg.server_port);
  return kLinkSize;
}

ParseResult ParseLink(const uint8_t* data, size_t len, LinkMsg* out) noexcept {
  if (!data) return ParseResult::kShort;
  ByteReader r(data, len);
  if (ParseResult h = Header(&r, len, kLinkSize, kLinkMagic); h != ParseResult::kOk) return h;
  LinkMsg msg;
  const uint8_t kind = r.U8();
  msg.ring_log2 = r.U8();
  const uint8_t accepted = r.U8();
  msg.nonce = r.U64();
  msg.client_port = r.U16();
  msg.server_port = r.U16();
  msg.accepted = accepted == 1;
  // Each kind uses its fields; the others must be zero.
  bool valid = false;
  switch (kind) {
    case uint8_t(LinkKind::kParked):
      valid = msg.ring_log2 == 0 && accepted == 0 && msg.nonce == 0 && msg.client_port == 0 &&
              msg.server_port == 0;
      break;
    case uint8_t(LinkKind::kClaim):
      valid = RingLog2Valid(msg.ring_log2) && accepted == 0 && msg.client_port != 0 &&
              msg.server_port != 0;
      break;
    case uint8_t(LinkKind::kAnswer):
      valid = msg.ring_log2 == 0 && accepted <= 1 && msg.client_port == 0 && msg.server_port == 0;
      break;
    case uint8_t(LinkKind::kTaken):
      valid = msg.ring_log2 == 0 && accepted == 0 && msg.client_port == 0 && msg.server_port == 0;
      break;
    default:
      break;
  }
  if (!valid) return ParseResult::kBadField;
  msg.kind = LinkKind(kind);
  *out = msg;
  return ParseResult::kOk;
}

}  // namespace slip::verbs
