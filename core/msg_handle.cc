#include "core/msg_handle.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>

#include <cstdio>
#include <cstring>

#include "core/byte_codec.h"

namespace slip::msg {

void EncodeAddressHandle(uint32_t magic, uint8_t version, const AddressHandle& h,
                         uint8_t out[kHandleBytes]) noexcept {
  ByteWriter w(out, kHandleBytes);
  w.U32(magic);
  w.U8(version);
  uint8_t addr[16] = {};
  uint16_t port = 0;
  if (h.address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&h.address);
    std::memcpy(addr, &in->sin_addr, 4);
    port = ntohs(in->sin_port);
    w.U8(4);
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&h.address);
    std::memcpy(addr, &in6->sin6_addr, 16);
    port = ntohs(in6->sin6_port);
    w.U8(6);
  }
  w.U16(port);
  w.Bytes(addr, sizeof(addr));
  w.Bytes(h.secret, kSecretBytes);
}

bool ParseAddressHandle(uint32_t magic, uint8_t version, const uint8_t* in, size_t len,
                        AddressHandle* out) noexcept {
  ByteReader r(in, len);
  if (r.U32() != magic || r.U8() != version) return false;
  const uint8_t family = r.U8();
  const uint16_t port = r.U16();
  uint8_t addr[16];
  r.Bytes(addr, sizeof(addr));
  AddressHandle h;
  r.Bytes(h.secret, kSecretBytes);
  if (!r.ok() || port == 0) return false;
  if (family == 4) {
    // An IPv4 handle's address bytes past the fourth are zero: nothing else parses.
    for (int i = 4; i < 16; ++i)
      if (addr[i] != 0) return false;
    auto* sin = reinterpret_cast<sockaddr_in*>(&h.address);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    std::memcpy(&sin->sin_addr, addr, 4);
  } else if (family == 6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&h.address);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    std::memcpy(&sin6->sin6_addr, addr, 16);
  } else {
    return false;
  }
  *out = h;
  return true;
}

bool SameSecret(const uint8_t* a, const uint8_t* b, size_t n) noexcept {
  uint8_t diff = 0;  // in constant time: the secret is compared with what a stranger sent
  for (size_t i = 0; i < n; ++i) diff |= uint8_t(a[i] ^ b[i]);
  return diff == 0;
}

void FillSecret(uint8_t* out, size_t n) noexcept {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out + got, n - got, 0);
    if (r > 0) got += size_t(r);  // (EINTR: again; the kernel's pool never runs dry)
  }
}

const char* AddressText(const sockaddr_storage& a, char* buf, size_t len) noexcept {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  snprintf(buf, len, "%s port %u", host, unsigned(port));
  return buf;
}

}  // namespace slip::msg
