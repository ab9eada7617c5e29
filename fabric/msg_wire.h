// The wire of fabric's message comms (fabric/msg.h): the listener's handle and the two
// messages of the exchange on the comm's TCP connection.
//
//   handle  core/msg_handle.h with kMagic.handle: the TCP listener's address and a secret
//   REQ     sender -> listener: the secret's first half and the sender endpoint's address
//   REP     listener -> receiver's comm: the second half, the comm's tag key and the
//           receiving endpoint's address
//
//   offset 0 magic (u32)   4 version (u8)   5 address length (u8)   6 zero (u16)
//          8 proof (16 bytes)   24 tag key (u32: zero in a REQ, 1..2^31-1 in a REP)
//         28 address (kMaxAddressBytes, zeros past its length)          92 end
//
// The address is the provider's (fi_getname): opaque here, handed to fi_av_insert, which
// validates it. Every parser reads bytes a peer wrote and returns false on anything out of
// range, leaving its output untouched; little-endian (core/byte_codec.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/msg_handle.h"

namespace slip::fabric::msgwire {

constexpr msg::Magics kMagic = msg::MagicsOf('F');  // "SLFM", "SLFQ", "SLFP"
constexpr uint8_t kVersion = 1;
// Endpoint addresses: EFA's are 32 bytes, tcp's a sockaddr (16 or 28), shm's a name.
constexpr size_t kMaxAddressBytes = 64;

using Handle = msg::AddressHandle;
void EncodeHandle(const Handle& h, uint8_t out[msg::kHandleBytes]) noexcept;
bool ParseHandle(const uint8_t* in, size_t len, Handle* out) noexcept;

struct Hello {
  uint8_t proof[msg::kSecretHalf] = {};  // the REQ's: the secret's first half; the REP's: second
  uint32_t tag_key = 0;                  // the REP's: the high half of every data tag
  uint8_t address_len = 0;               // 1..kMaxAddressBytes
  uint8_t address[kMaxAddressBytes] = {};
};
constexpr size_t kHelloBytes = 4 + 1 + 1 + 2 + msg::kSecretHalf + 4 + kMaxAddressBytes;
constexpr uint32_t kMaxTagKey = 0x7fffffff;

// kMagic.request or kMagic.reply. Encode writes kHelloBytes (false: the address is empty or too
// long); Parse wants exactly kHelloBytes.
bool EncodeHello(uint32_t magic, const Hello& h, uint8_t out[kHelloBytes]) noexcept;
bool ParseHello(uint32_t magic, const uint8_t* in, size_t len, Hello* out) noexcept;

// The data tag of NCCL's `tag` on a comm of `key`, and the comm's control tag (the hello
// of the exchange's last step): the top bit, which no data tag has (keys are below 2^31).
inline uint64_t DataTag(uint32_t key, int tag) noexcept {
  return (uint64_t(key) << 32) | uint32_t(tag);
}
inline uint64_t ControlTag(uint32_t key) noexcept {
  return (uint64_t(1) << 63) | (uint64_t(key) << 32);
}

}  // namespace slip::fabric::msgwire
