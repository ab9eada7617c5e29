#include "fabric/stream_wire.h"

#include "core/byte_codec.h"

namespace slip::fabric::streamwire {

namespace {

// Sends name no ring in the peer's memory, and bound the ring (their cursors' 30 bits).
bool SendsFit(const Message& m) noexcept {
  return m.note_bytes != kNoteSends ||
         (m.ring_key == 0 && m.ring_addr == 0 && m.ring_log2 <= kSendsMaxRingLog2);
}

}  // namespace

bool Encode(const Message& m, uint8_t out[kBytes]) noexcept {
  const bool refuse = m.type == Type::kRefuse;
  if (m.address_len > kMaxAddressBytes) return false;
  const bool connected = m.endpoints == Endpoints::kConnected;
  if (!refuse && m.endpoints != Endpoints::kReliableDatagram && !connected) return false;
  // (A client with connected endpoints has no address before it connects.)
  const bool needs_address = !(connected && m.type == Type::kReq);
  if (!refuse && (needs_address ? m.address_len == 0 : m.address_len != 0)) return false;
  if (!refuse && (m.ring_log2 < kMinRingLog2 || m.ring_log2 > kMaxRingLog2 || m.note_tag == 0 ||
                  m.note_tag > kMaxNoteTag || !KnownNoteForm(m.note_bytes) ||
                  (ConnectedOnlyForm(m.note_bytes) && !connected) || !SendsFit(m)))
    return false;
  ByteWriter w(out, kBytes);
  w.U32(kMagic);
  w.U8(kVersion);
  w.U8(uint8_t(m.type));
  w.U8(refuse ? 0 : m.ring_log2);
  w.U8(refuse ? 0 : m.address_len);
  w.U64(m.nonce);
  wire::PutEndpoint(&w, m.client);
  wire::PutEndpoint(&w, m.server);
  w.U64(refuse ? 0 : m.ring_key);
  w.U64(refuse ? 0 : m.ring_addr);
  w.U32(refuse ? 0 : m.note_tag);
  w.U8(refuse ? 0 : m.note_bytes);
  w.U8(refuse ? 0 : uint8_t(m.endpoints));
  w.U16(0);
  uint8_t address[kMaxAddressBytes] = {};
  if (!refuse)
    for (size_t i = 0; i < m.address_len; ++i) address[i] = m.address[i];
  w.Bytes(address, sizeof(address));
  return w.ok() && w.size() == kBytes;
}

bool Parse(const uint8_t* in, size_t len, Message* out) noexcept {
  if (in == nullptr || len != kBytes) return false;
  ByteReader r(in, len);
  if (r.U32() != kMagic || r.U8() != kVersion) return false;
  Message m;
  const uint8_t type = r.U8();
  if (type < uint8_t(Type::kReq) || type > uint8_t(Type::kRefuse)) return false;
  m.type = Type(type);
  m.ring_log2 = r.U8();
  m.address_len = r.U8();
  m.nonce = r.U64();
  if (!wire::GetEndpoint(&r, &m.client) || !wire::GetEndpoint(&r, &m.server)) return false;
  m.ring_key = r.U64();
  m.ring_addr = r.U64();
  m.note_tag = r.U32();
  m.note_bytes = r.U8();
  const uint8_t endpoints = r.U8();
  const uint32_t pad = r.U16();
  r.Bytes(m.address, sizeof(m.address));
  if (!r.ok() || pad != 0 || m.address_len > kMaxAddressBytes) return false;
  for (size_t i = m.address_len; i < kMaxAddressBytes; ++i)
    if (m.address[i] != 0) return false;
  if (m.type == Type::kRefuse) {
    if (m.ring_log2 != 0 || m.address_len != 0 || m.ring_key != 0 || m.ring_addr != 0 ||
        m.note_tag != 0 || m.note_bytes != 0 || endpoints != 0)
      return false;
    *out = m;
    return true;
  }
  if (endpoints != uint8_t(Endpoints::kReliableDatagram) &&
      endpoints != uint8_t(Endpoints::kConnected))
    return false;
  m.endpoints = Endpoints(endpoints);
  const bool needs_address = !(m.endpoints == Endpoints::kConnected && m.type == Type::kReq);
  if ((needs_address ? m.address_len == 0 : m.address_len != 0) || m.ring_log2 < kMinRingLog2 ||
      m.ring_log2 > kMaxRingLog2 || m.note_tag == 0 || m.note_tag > kMaxNoteTag ||
      !KnownNoteForm(m.note_bytes) ||
      (ConnectedOnlyForm(m.note_bytes) && m.endpoints != Endpoints::kConnected) || !SendsFit(m)) {
    return false;
  }
  *out = m;
  return true;
}

void EncodeLink(const LinkParam& p, uint8_t out[kLinkBytes]) noexcept {
  ByteWriter w(out, kLinkBytes);
  w.U32(kLinkMagic);
  w.U32(p.server_tag);
  w.U64(p.nonce);
}

bool ParseLink(const uint8_t* in, size_t len, LinkParam* out) noexcept {
  if (in == nullptr || len != kLinkBytes) return false;
  ByteReader r(in, len);
  if (r.U32() != kLinkMagic) return false;
  LinkParam p;
  p.server_tag = r.U32();
  p.nonce = r.U64();
  if (!r.ok() || p.server_tag == 0 || p.server_tag > kMaxNoteTag) return false;
  *out = p;
  return true;
}

}  // namespace slip::fabric::streamwire
