// The handle of a message listener that is reached at an IP address (verbs' rdma_cm
// listener, fabric's connection listener): magic, version, the address and port, and a
// 32-byte random secret. The sender proves that it read the handle with the secret's first
// half; the listener proves that it made the handle with the second half (an address can be
// listened on by anybody once its listener is gone). NCCL carries the handle between ranks.
//
//   offset  0  magic (u32)     4  version (u8)   5  family: 4 or 6 (u8)
//           6  port (u16)      8  address (16 bytes; an IPv4 one in the first 4, zeros after)
//          24  secret (32 bytes)                 56  zeros up to msg::kHandleBytes
//
// Little-endian (core/byte_codec.h). The parser reads bytes of another process: anything
// out of range is rejected and leaves its output untouched.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/log.h"
#include "core/msg_comm.h"

namespace slip::msg {

// The magics of a module transport's NCCL-face messages: "SL", the transport's letter, and
// M (its handle), Q (a request), P (the reply), as little-endian u32s.
struct Magics {
  uint32_t handle, request, reply;
};
constexpr Magics MagicsOf(char letter) noexcept {
  const uint32_t base = uint32_t('S') | uint32_t('L') << 8 | uint32_t(uint8_t(letter)) << 16;
  return {base | uint32_t('M') << 24, base | uint32_t('Q') << 24, base | uint32_t('P') << 24};
}

constexpr size_t kSecretBytes = 32;
constexpr size_t kSecretHalf = kSecretBytes / 2;

struct AddressHandle {
  sockaddr_storage address{};  // AF_INET or AF_INET6, with the port
  uint8_t secret[kSecretBytes] = {};
};
constexpr size_t kAddressHandleBytes = 4 + 1 + 1 + 2 + 16 + kSecretBytes;
static_assert(kAddressHandleBytes <= kHandleBytes);

void EncodeAddressHandle(uint32_t magic, uint8_t version, const AddressHandle& h,
                         uint8_t out[kHandleBytes]) noexcept;
bool ParseAddressHandle(uint32_t magic, uint8_t version, const uint8_t* in, size_t len,
                        AddressHandle* out) noexcept;

// Compares secrets in time independent of where they differ.
bool SameSecret(const uint8_t* a, const uint8_t* b, size_t n) noexcept;
// `n` random bytes (getrandom).
void FillSecret(uint8_t* out, size_t n) noexcept;
// "192.0.2.1 port 5000", for log lines.
const char* AddressText(const sockaddr_storage& a, char* buf, size_t len) noexcept;

// A new listener's handle: `h->address` (its port set) and a fresh secret, of which the
// listener keeps a copy in `secret` (its proofs are checked against it), encoded into
// `out`, with the debug line that says where `transport` listens for `device`.
inline void PublishAddressHandle(const char* transport, uint32_t magic, uint8_t version,
                                 AddressHandle* h, uint8_t secret[kSecretBytes], const char* device,
                                 uint8_t out[kHandleBytes]) noexcept {
  FillSecret(h->secret, kSecretBytes);
  std::memcpy(secret, h->secret, kSecretBytes);
  EncodeAddressHandle(magic, version, *h, out);
  char text[96];
  SLIP_LOG(kDebug, "%s: NCCL listener on %s (%s)", transport,
           AddressText(h->address, text, sizeof(text)), device);
}

}  // namespace slip::msg
