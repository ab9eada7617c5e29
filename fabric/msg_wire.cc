#include "fabric/msg_wire.h"

#include "core/byte_codec.h"

namespace slip::fabric::msgwire {

void EncodeHandle(const Handle& h, uint8_t out[msg::kHandleBytes]) noexcept {
  msg::EncodeAddressHandle(kMagic.handle, kVersion, h, out);
}

bool ParseHandle(const uint8_t* in, size_t len, Handle* out) noexcept {
  return msg::ParseAddressHandle(kMagic.handle, kVersion, in, len, out);
}

bool EncodeHello(uint32_t magic, const Hello& h, uint8_t out[kHelloBytes]) noexcept {
  if (h.address_len == 0 || h.address_len > kMaxAddressBytes) return false;
  ByteWriter w(out, kHelloBytes);
  w.U32(magic);
  w.U8(kVersion);
  w.U8(h.address_len);
  w.U16(0);
  w.Bytes(h.proof, sizeof(h.proof));
  w.U32(h.tag_key);
  uint8_t address[kMaxAddressBytes] = {};
  for (size_t i = 0; i < h.address_len; ++i) address[i] = h.address[i];
  w.Bytes(address, sizeof(address));
  return w.ok() && w.size() == kHelloBytes;
}

bool ParseHello(uint32_t magic, const uint8_t* in, size_t len, Hello* out) noexcept {
  if (in == nullptr || len != kHelloBytes) return false;
  ByteReader r(in, len);
  if (r.U32() != magic || r.U8() != kVersion) return false;
  Hello h;
  h.address_len = r.U8();
  const uint16_t pad = r.U16();
  r.Bytes(h.proof, sizeof(h.proof));
  h.tag_key = r.U32();
  r.Bytes(h.address, sizeof(h.address));
  if (!r.ok() || pad != 0 || h.address_len == 0 || h.address_len > kMaxAddressBytes) return false;
  // One encoding per message: zeros past the address, a key only in a REP, never 0 there.
  for (size_t i = h.address_len; i < kMaxAddressBytes; ++i)
    if (h.address[i] != 0) return false;
  const bool rep = magic == kMagic.reply;
  if (rep ? (h.tag_key == 0 || h.tag_key > kMaxTagKey) : h.tag_key != 0) return false;
  *out = h;
  return true;
}

}  // namespace slip::fabric::msgwire
