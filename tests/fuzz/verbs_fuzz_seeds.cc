// Writes the seed corpus of verbs_fuzz into the directory given: valid REQs (IPv4 and IPv6),
// REPs, HELLOs, link messages and a REJECT's data at their field limits, so that mutation starts
// past the magic and version.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/wire.h"
#include "verbs/msg_wire.h"
#include "verbs/private_data.h"

namespace {

using slip::wire::Endpoint;
using namespace slip::verbs;

Endpoint Make(uint8_t family, uint16_t port, uint8_t fill, size_t used) {
  Endpoint e;
  e.family = family;
  e.port = port;
  for (size_t i = 0; i < used; ++i) e.addr[i] = uint8_t(fill + i);
  return e;
}

std::vector<std::vector<uint8_t>> Seeds() {
  std::vector<std::vector<uint8_t>> out;
  // A sample that fails to encode leaves an empty seed, which main() reports.
  auto add = [&](size_t len, const uint8_t* buf) { out.emplace_back(buf, buf + len); };
  uint8_t buf[64];
  for (uint8_t family : {uint8_t(4), uint8_t(6)}) {
    const size_t used = family == 4 ? 4 : 16;
    for (uint8_t ring : {kMinRingLog2, uint8_t(16), kMaxRingLog2}) {
      Req req;
      req.flags = ring == 16 ? kFlagSendNotify : 0;
      req.ring_log2 = ring;
      req.nonce = 0x0102030405060708ull * ring;
      req.client = Make(family, ring == kMinRingLog2 ? 1 : 40000, 10, used);
      req.server = Make(family, ring == kMaxRingLog2 ? 65535 : 443, 0xc0, used);
      add(EncodeReq(req, buf, sizeof buf), buf);
    }
  }
  for (uint8_t ring : {kMinRingLog2, uint8_t(20), kMaxRingLog2}) {
    Rep rep;
    rep.flags = ring == 20 ? kFlagSendNotify : ring == kMaxRingLog2 ? kFlagGroup : 0;
    rep.ring_log2 = ring;
    rep.nonce = ~0ull / ring;
    rep.ring_addr = 0x00007f0000000000ull + (1ull << ring);
    rep.rkey = 0x1000u * ring;
    add(EncodeRep(rep, buf, sizeof buf), buf);
    Hello hello;
    hello.ring_log2 = ring;
    hello.nonce = rep.nonce;
    hello.ring_addr = rep.ring_addr + 0x100000;
    hello.rkey = rep.rkey + 1;
    add(EncodeHello(hello, buf, sizeof buf), buf);
    LinkMsg claim;
    claim.kind = LinkKind::kClaim;
    claim.ring_log2 = ring;
    claim.nonce = rep.nonce;
    claim.client_port = uint16_t(40000 + ring);
    claim.server_port = 443;
    add(EncodeLink(claim, buf, sizeof buf), buf);
    LinkMsg answer;
    answer.kind = LinkKind::kAnswer;
    answer.accepted = ring != 20;
    answer.nonce = rep.nonce;
    add(EncodeLink(answer, buf, sizeof buf), buf);
  }
  add(EncodeLink(LinkMsg{}, buf, sizeof buf), buf);  // kParked
  LinkMsg taken;
  taken.kind = LinkKind::kTaken;
  taken.nonce = 0x0102030405060708ull;
  add(EncodeLink(taken, buf, sizeof buf), buf);
  add(EncodeRej(Rej{}, buf, sizeof buf), buf);
  Rej redirect;
  redirect.code = RejCode::kRedirect;
  redirect.port = 18515;
  add(EncodeRej(redirect, buf, sizeof buf), buf);
  // verbs' message comms: handles (IPv4, IPv6), a REQ's and a REP's data, CTS entries.
  namespace mw = msgwire;
  for (int family : {AF_INET, AF_INET6}) {
    mw::Handle h;
    h.address.ss_family = sa_family_t(family);
    if (family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&h.address);
      in->sin_port = htons(18515);
      in->sin_addr.s_addr = htonl(0x0a4d0001);
    } else {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&h.address);
      in6->sin6_port = htons(65535);
      in6->sin6_addr.s6_addr[0] = 0xfd;
    }
    for (size_t i = 0; i < sizeof(h.secret); ++i) h.secret[i] = uint8_t(i * 7 + 1);
    uint8_t handle[slip::msg::kHandleBytes] = {};
    mw::EncodeHandle(h, handle);
    add(mw::kHandleWireBytes, handle);
  }
  for (uint32_t magic : {mw::kMagic.request, mw::kMagic.reply}) {
    mw::ConnectData d;
    for (size_t i = 0; i < sizeof(d.proof); ++i) d.proof[i] = uint8_t(0xa0 + i);
    d.area = {0x00007f1234560000ull, 0x1234};
    d.extra = magic == mw::kMagic.request ? 3 : 1;
    for (int i = 0; i < d.extra; ++i) d.extra_qpn[i] = 0x100 + uint32_t(i);
    add(mw::EncodeConnectData(magic, d, buf, sizeof buf), buf);
  }
  for (uint8_t group : {uint8_t(1), uint8_t(8)}) {
    mw::CtsEntry e;
    e.addr = 0x00007f0000001000ull;
    e.rkey = 0x4321;
    e.capacity = group == 1 ? 0 : 0x7fffffffu;
    e.tag = group == 1 ? -1 : 7;
    e.group = group;
    e.stamp = mw::StampFor(group == 1 ? 0 : 0xfffffffeu);
    mw::EncodeCts(e, buf);
    add(mw::kCtsEntryBytes, buf);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  int index = 0;
  for (const std::vector<uint8_t>& seed : Seeds()) {
    const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(index++);
    if (seed.empty()) {
      std::fprintf(stderr, "%s: a sample did not encode\n", path.c_str());
      return 1;
    }
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(seed.data(), 1, seed.size(), f) != seed.size() ||
        std::fclose(f) != 0) {
      std::perror(path.c_str());
      return 1;
    }
  }
  return 0;
}
