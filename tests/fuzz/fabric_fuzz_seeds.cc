// Writes the seed corpus of fabric_fuzz into the directory given: handles (IPv4, IPv6),
// REQs and REPs at their field limits, so that mutation starts past the magic and version.
#include <netinet/in.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fabric/msg_wire.h"
#include "fabric/stream_wire.h"

namespace {

using namespace slip::fabric::msgwire;

std::vector<std::vector<uint8_t>> Seeds() {
  std::vector<std::vector<uint8_t>> out;
  for (int family : {AF_INET, AF_INET6}) {
    Handle h;
    h.address.ss_family = sa_family_t(family);
    reinterpret_cast<sockaddr_in*>(&h.address)->sin_port = htons(40000);
    for (size_t i = 0; i < sizeof(h.secret); ++i) h.secret[i] = uint8_t(i * 13 + 1);
    uint8_t buf[slip::msg::kHandleBytes] = {};
    EncodeHandle(h, buf);
    out.emplace_back(buf, buf + sizeof(buf));
  }
  for (uint8_t len : {uint8_t(1), uint8_t(16), uint8_t(kMaxAddressBytes)}) {
    for (uint32_t magic : {kMagic.request, kMagic.reply}) {
      Hello hello;
      hello.address_len = len;
      for (size_t i = 0; i < len; ++i) hello.address[i] = uint8_t(0x40 + i);
      for (size_t i = 0; i < sizeof(hello.proof); ++i) hello.proof[i] = uint8_t(0xa0 + i);
      hello.tag_key = magic == kMagic.reply ? (len == 1 ? 1 : kMaxTagKey) : 0;
      uint8_t buf[kHelloBytes];
      if (!EncodeHello(magic, hello, buf)) return {};
      out.emplace_back(buf, buf + sizeof(buf));
    }
  }
  // The shim's datagrams: a REQ and a REP at both ends of their ranges, and a REFUSE.
  namespace sw = slip::fabric::streamwire;
  for (sw::Type type : {sw::Type::kReq, sw::Type::kRep, sw::Type::kRefuse}) {
    for (bool high : {false, true}) {
      sw::Message m;
      m.type = type;
      m.nonce = 0x0123456789abcdefull;
      m.client.family = 4;
      m.client.port = 40000;
      m.client.addr[0] = 10;
      m.server.family = high ? 6 : 4;
      m.server.port = 5201;
      m.server.addr[0] = high ? 0xfd : 10;
      if (type != sw::Type::kRefuse) {
        m.ring_log2 = high ? sw::kMaxRingLog2 : sw::kMinRingLog2;
        m.address_len = high ? uint8_t(sw::kMaxAddressBytes) : 1;
        for (size_t i = 0; i < m.address_len; ++i) m.address[i] = uint8_t(0x50 + i);
        m.ring_key = 0xfeedfacecafebeefull;
        m.ring_addr = high ? 0x7f0000001000ull : 0;
        m.note_tag = high ? sw::kMaxNoteTag : 1;
      }
      uint8_t buf[sw::kBytes];
      if (!sw::Encode(m, buf)) return {};
      out.emplace_back(buf, buf + sizeof(buf));
      // The same with connected endpoints (a REQ without an address), and their cursor
      // notes (a form only they may name).
      if (type == sw::Type::kRefuse) continue;
      m.endpoints = sw::Endpoints::kConnected;
      if (type == sw::Type::kReq) {
        m.address_len = 0;
        std::memset(m.address, 0, sizeof(m.address));
      }
      if (!sw::Encode(m, buf)) return {};
      out.emplace_back(buf, buf + sizeof(buf));
      m.note_bytes = sw::kNoteLinkCursor;
      if (!sw::Encode(m, buf)) return {};
      out.emplace_back(buf, buf + sizeof(buf));
      // Sends (no RMA): no ring key or address, rings up to kSendsMaxRingLog2.
      m.note_bytes = sw::kNoteSends;
      m.ring_key = 0;
      m.ring_addr = 0;
      if (m.ring_log2 > sw::kSendsMaxRingLog2) m.ring_log2 = sw::kSendsMaxRingLog2;
      if (!sw::Encode(m, buf)) return {};
      out.emplace_back(buf, buf + sizeof(buf));
    }
  }
  // A client's connection data.
  for (uint32_t tag : {1u, sw::kMaxNoteTag}) {
    uint8_t buf[sw::kLinkBytes];
    sw::EncodeLink(sw::LinkParam{tag, 0x0123456789abcdefull}, buf);
    out.emplace_back(buf, buf + sizeof(buf));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const auto seeds = Seeds();
  if (seeds.empty()) return 1;
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(i);
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(seeds[i].data(), 1, seeds[i].size(), f) != seeds[i].size()) return 1;
    fclose(f);
  }
  return 0;
}
