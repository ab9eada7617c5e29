#include "verbs/msg_wire.h"

#include <netinet/in.h>

#include <climits>
#include <cstring>

#include "core/byte_codec.h"

namespace slip::verbs::msgwire {

void EncodeHandle(const Handle& h, uint8_t out[msg::kHandleBytes]) noexcept {
  msg::EncodeAddressHandle(kMagic.handle, kVersion, h, out);
}

bool ParseHandle(const uint8_t* in, size_t len, Handle* out) noexcept {
  return msg::ParseAddressHandle(kMagic.handle, kVersion, in, len, out);
}

size_t EncodeConnectData(uint32_t magic, const ConnectData& d, uint8_t* out, size_t cap) noexcept {
  ByteWriter w(out, cap);
  w.U32(magic);
  w.U8(kVersion);
  w.U8(d.extra);
  w.U16(0);
  w.Bytes(d.proof, kSecretHalf);
  w.U64(d.area.addr);
  w.U32(d.area.rkey);
  for (uint32_t qpn : d.extra_qpn) w.U32(qpn);
  return w.ok() ? w.size() : 0;
}

bool ParseConnectData(uint32_t magic, const uint8_t* in, size_t len, ConnectData* out) noexcept {
  // rdma_cm pads private data with zeros to the message's size: longer is fine.
  if (in == nullptr || len < kConnectDataBytes) return false;
  ByteReader r(in, len);
  if (r.U32() != magic || r.U8() != kVersion) return false;
  ConnectData d;
  d.extra = r.U8();
  const uint16_t pad = r.U16();
  r.Bytes(d.proof, kSecretHalf);
  d.area.addr = r.U64();
  d.area.rkey = r.U32();
  for (uint32_t& qpn : d.extra_qpn) qpn = r.U32();
  // Padding and unused numbers are zero, so that a message parses from exactly one
  // encoding; a queue pair number has 24 bits.
  if (!r.ok() || d.area.addr == 0 || pad != 0 || d.extra >= kMaxQueuePairs) return false;
  for (int i = 0; i < kMaxQueuePairs - 1; ++i) {
    const bool used = i < d.extra;
    if (used != (d.extra_qpn[i] != 0) || d.extra_qpn[i] >= (1u << 24)) return false;
  }
  *out = d;
  return true;
}

void EncodeCts(const CtsEntry& e, uint8_t out[kCtsEntryBytes]) noexcept {
  ByteWriter w(out, kCtsEntryBytes);
  w.U64(e.addr);
  w.U32(e.rkey);
  w.U32(e.capacity);
  w.U32(uint32_t(e.tag));
  w.U8(e.group);
  const uint8_t pad[7] = {};
  w.Bytes(pad, sizeof(pad));
  w.U32(e.stamp);
}

uint32_t CtsStamp(const uint8_t in[kCtsEntryBytes]) noexcept {
  ByteReader r(in + kCtsEntryBytes - 4, 4);
  return r.U32();
}

bool ParseCts(const uint8_t in[kCtsEntryBytes], uint32_t stamp, CtsEntry* out) noexcept {
  ByteReader r(in, kCtsEntryBytes);
  CtsEntry e;
  e.addr = r.U64();
  e.rkey = r.U32();
  e.capacity = r.U32();
  e.tag = int32_t(r.U32());
  e.group = r.U8();
  uint8_t pad[7];
  r.Bytes(pad, sizeof(pad));
  e.stamp = r.U32();
  uint8_t any = 0;
  for (uint8_t b : pad) any |= b;
  if (!r.ok() || any != 0 || e.stamp != stamp || e.group < 1 || e.group > msg::kMaxGroup ||
      e.capacity > uint32_t(INT_MAX))
    return false;
  *out = e;
  return true;
}

}  // namespace slip::verbs::msgwire
