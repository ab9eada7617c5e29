// Writes the seed corpus of fabric_fuzz into the directory given: handles (IPv4, IPv6),
// REQs and REPs at their field limits, so that mutation starts past the magic and version.
#include <netinet/in.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fabric/msg_wire.h"

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
    for (uint32_t magic : {kReqMagic, kRepMagic}) {
      Hello hello;
      hello.address_len = len;
      for (size_t i = 0; i < len; ++i) hello.address[i] = uint8_t(0x40 + i);
      for (size_t i = 0; i < sizeof(hello.proof); ++i) hello.proof[i] = uint8_t(0xa0 + i);
      hello.tag_key = magic == kRepMagic ? (len == 1 ? 1 : kMaxTagKey) : 0;
      uint8_t buf[kHelloBytes];
      if (!EncodeHello(magic, hello, buf)) return {};
      out.emplace_back(buf, buf + sizeof(buf));
    }
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
