// Valid wire messages of every type, boundary values included: the fixtures of the wire unit
// tests and the seed corpus of the wire fuzzer.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/wire.h"

namespace slip::wire::samples {

inline Endpoint V4(std::array<uint8_t, 4> addr, uint16_t port) {
  Endpoint e;
  e.family = 4;
  e.port = port;
  for (size_t i = 0; i < addr.size(); ++i) e.addr[i] = addr[i];
  return e;
}

inline Endpoint V6(std::array<uint8_t, 16> addr, uint16_t port) {
  Endpoint e;
  e.family = 6;
  e.port = port;
  for (size_t i = 0; i < addr.size(); ++i) e.addr[i] = addr[i];
  return e;
}

inline Message MakeRegister(Endpoint client, Endpoint server, uint64_t nonce, uint32_t ring_size,
                            uint32_t fd_count, uint64_t region_size) {
  Message m;
  m.type = Type::kRegister;
  m.reg = Register{.client = client,
                   .server = server,
                   .nonce = nonce,
                   .ring_size = ring_size,
                   .fd_count = fd_count,
                   .region_size = region_size};
  return m;
}

inline Message MakeCancel(Endpoint client, Endpoint server, uint64_t nonce) {
  Message m;
  m.type = Type::kCancel;
  m.cancel = Cancel{.client = client, .server = server, .nonce = nonce};
  return m;
}

inline Message MakeConfirm(uint64_t nonce, uint32_t ring_size) {
  Message m;
  m.type = Type::kConfirm;
  m.confirm = Confirm{.nonce = nonce, .ring_size = ring_size};
  return m;
}

inline Message MakeAccept(uint64_t nonce) {
  Message m;
  m.type = Type::kAccept;
  m.accept = Accept{.nonce = nonce};
  return m;
}

inline Message MakeDecline(uint64_t nonce, DeclineReason reason) {
  Message m;
  m.type = Type::kDecline;
  m.decline = Decline{.nonce = nonce, .reason = reason};
  return m;
}

inline Message MakeFailover(uint64_t received, uint64_t sent, FailoverCause cause) {
  Message m;
  m.type = Type::kFailover;
  m.failover = Failover{.received = received, .sent = sent, .cause = cause};
  return m;
}

inline Message MakeUrgent(uint64_t offset, uint8_t byte, bool ack) {
  Message m;
  m.type = Type::kUrgent;
  m.urgent = Urgent{.offset = offset, .byte = ack ? uint8_t(0) : byte, .ack = ack};
  return m;
}

inline Message MakeWindow(uint32_t bytes) {
  Message m;
  m.type = Type::kWindow;
  m.window = Window{.bytes = bytes};
  return m;
}

constexpr std::array<uint8_t, 16> kV6Addr = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0,
                                             0,    0,    0,    0,    0, 0, 0, 0x2a};
constexpr uint64_t kNonce = 0x0123456789abcdefull;

// A typical valid message of each type.
inline Message Typical(Type type) {
  const Endpoint client = V4({127, 0, 0, 1}, 40000);
  const Endpoint server = V4({127, 0, 0, 1}, 8080);
  switch (type) {
    case Type::kRegister:
      return MakeRegister(client, server, kNonce, 1u << 16, 2, 1u << 18);
    case Type::kCancel:
      return MakeCancel(client, server, kNonce);
    case Type::kConfirm:
      return MakeConfirm(kNonce, 1u << 16);
    case Type::kAccept:
      return MakeAccept(kNonce);
    case Type::kDecline:
      return MakeDecline(kNonce, DeclineReason::kNonceMismatch);
    case Type::kFailover:
      return MakeFailover(1u << 20, 3u << 20, FailoverCause::kTransportError);
    case Type::kUrgent:
      return MakeUrgent(5u << 20, 0xff, false);
    case Type::kWindow:
      return MakeWindow(8192);
  }
  return Message();
}

// Valid messages of every type: typical ones, then every field at its limits.
inline std::vector<Message> All() {
  std::vector<Message> all;
  for (Type t : {Type::kRegister, Type::kCancel, Type::kConfirm, Type::kAccept, Type::kDecline,
                 Type::kFailover, Type::kUrgent, Type::kWindow})
    all.push_back(Typical(t));
  const Endpoint v6_client = V6(kV6Addr, 0);
  const Endpoint v6_server = V6(kV6Addr, 65535);
  const Endpoint v4_client = V4({255, 255, 255, 255}, 65535);
  const Endpoint v4_server = V4({0, 0, 0, 0}, 0);
  all.push_back(MakeRegister(v6_client, v6_server, ~0ull, 256u << 20, 8, 1ull << 30));
  all.push_back(MakeRegister(v4_client, v4_server, 0, 4096, 1, 8192));
  all.push_back(MakeCancel(v6_client, v4_server, 0));
  all.push_back(MakeCancel(v4_client, v6_server, ~0ull));
  all.push_back(MakeConfirm(0, 4096));
  all.push_back(MakeConfirm(~0ull, 256u << 20));
  all.push_back(MakeAccept(0));
  all.push_back(MakeAccept(~0ull));
  for (uint32_t r = 0; r <= static_cast<uint32_t>(DeclineReason::kVersion); ++r)
    all.push_back(MakeDecline(r, static_cast<DeclineReason>(r)));
  for (uint32_t c = 0; c <= static_cast<uint32_t>(FailoverCause::kDeviceRemoved); ++c)
    all.push_back(MakeFailover(c == 0 ? 0 : ~0ull >> c, ~0ull, static_cast<FailoverCause>(c)));
  all.push_back(MakeUrgent(0, 0, false));
  all.push_back(MakeUrgent(~0ull, 0, true));
  all.push_back(MakeWindow(0));
  all.push_back(MakeWindow(kMaxWindow));
  return all;
}

}  // namespace slip::wire::samples
