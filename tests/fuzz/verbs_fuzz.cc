// libFuzzer target for the verbs private data: every REQ, REP and HELLO byte comes from a peer
// (rdma_cm private data, the first SEND on a queue pair). Each input goes through all three
// parsers, as it is and with the kind's magic and version written over its first 5 bytes (so
// that mutation explores the fields behind the header). Besides the sanitizers' checks, it
// traps when a parser breaks an invariant:
//   - an accepted message has only valid fields, and re-encodes to exactly the first kSize bytes
//     of the input;
//   - bytes past kSize never change the answer (a later version may append fields);
//   - the message parses the same from exactly its own bytes, and every shorter prefix of it is
//     kShort;
//   - a rejected message leaves the output untouched.
// Build and run: tests/fuzz/CMakeLists.txt (ctest -L fuzz); seeds: verbs_fuzz_seeds DIR.
#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/wire.h"
#include "verbs/msg_wire.h"
#include "verbs/private_data.h"

namespace slip::verbs {
namespace {

void Require(bool ok) {
  if (!ok) __builtin_trap();
}

bool EndpointValid(const wire::Endpoint& e) {
  if (e.port == 0 || (e.family != 4 && e.family != 6)) return false;
  if (e.family == 4) {
    for (int i = 4; i < 16; ++i) {
      if (e.addr[i]) return false;
    }
  }
  return true;
}

bool RingValid(uint8_t ring_log2) {
  return ring_log2 >= kMinRingLog2 && ring_log2 <= kMaxRingLog2;
}

struct ReqKind {
  using Msg = Req;
  static constexpr size_t kSize = kReqSize;
  static constexpr uint32_t kMagic = kReqMagic;
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeReq(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseReq(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) {
    return a.flags == b.flags && a.ring_log2 == b.ring_log2 && a.nonce == b.nonce &&
           a.client == b.client && a.server == b.server;
  }
  static bool Valid(const Msg& m) {
    return (m.flags & ~kFlagSendNotify) == 0 && RingValid(m.ring_log2) &&
           m.client.family == m.server.family && EndpointValid(m.client) && EndpointValid(m.server);
  }
  static Msg Sentinel() {
    Msg m;
    m.flags = 0xee;
    m.ring_log2 = 0xee;
    m.nonce = 0xeeeeeeeeeeeeeeee;
    m.client.family = m.server.family = 0xee;
    m.client.port = m.server.port = 0xeeee;
    std::memset(m.client.addr, 0xee, 16);
    std::memset(m.server.addr, 0xee, 16);
    return m;
  }
};

struct RepKind {
  using Msg = Rep;
  static constexpr size_t kSize = kRepSize;
  static constexpr uint32_t kMagic = kRepMagic;
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeRep(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseRep(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) {
    return a.flags == b.flags && a.ring_log2 == b.ring_log2 && a.nonce == b.nonce &&
           a.ring_addr == b.ring_addr && a.rkey == b.rkey;
  }
  static bool Valid(const Msg& m) {
    return (m.flags & ~(kFlagSendNotify | kFlagGroup)) == 0 && RingValid(m.ring_log2);
  }
  static Msg Sentinel() {
    Msg m;
    m.flags = 0xee;
    m.ring_log2 = 0xee;
    m.nonce = m.ring_addr = 0xeeeeeeeeeeeeeeee;
    m.rkey = 0xeeeeeeee;
    return m;
  }
};

struct HelloKind {
  using Msg = Hello;
  static constexpr size_t kSize = kHelloSize;
  static constexpr uint32_t kMagic = kHelloMagic;
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeHello(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseHello(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) {
    return a.ring_log2 == b.ring_log2 && a.nonce == b.nonce && a.ring_addr == b.ring_addr &&
           a.rkey == b.rkey;
  }
  static bool Valid(const Msg& m) { return RingValid(m.ring_log2); }
  static Msg Sentinel() {
    Msg m;
    m.ring_log2 = 0xee;
    m.nonce = m.ring_addr = 0xeeeeeeeeeeeeeeee;
    m.rkey = 0xeeeeeeee;
    return m;
  }
};

struct LinkMsgKind {
  using Msg = LinkMsg;
  static constexpr size_t kSize = kLinkSize;
  static constexpr uint32_t kMagic = kLinkMagic;
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeLink(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseLink(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) {
    return a.kind == b.kind && a.ring_log2 == b.ring_log2 && a.accepted == b.accepted &&
           a.nonce == b.nonce && a.client_port == b.client_port && a.server_port == b.server_port;
  }
  static bool Valid(const Msg& m) {
    switch (m.kind) {
      case LinkKind::kParked:
        return m.ring_log2 == 0 && !m.accepted && m.nonce == 0 && m.client_port == 0 &&
               m.server_port == 0;
      case LinkKind::kClaim:
        return RingValid(m.ring_log2) && !m.accepted && m.client_port && m.server_port;
      case LinkKind::kAnswer:
        return m.ring_log2 == 0 && m.client_port == 0 && m.server_port == 0;
      case LinkKind::kTaken:
        return m.ring_log2 == 0 && !m.accepted && m.client_port == 0 && m.server_port == 0;
    }
    return false;
  }
  static Msg Sentinel() {
    Msg m;
    m.kind = LinkKind(0xee);
    m.ring_log2 = 0xee;
    m.nonce = 0xeeeeeeeeeeeeeeee;
    m.client_port = m.server_port = 0xeeee;
    return m;
  }
};

struct RejMsgKind {
  using Msg = Rej;
  static constexpr size_t kSize = kRejSize;
  static constexpr uint32_t kMagic = kRejMagic;
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeRej(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseRej(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) { return a.code == b.code && a.port == b.port; }
  static bool Valid(const Msg& m) {
    return (m.code == RejCode::kMemberElsewhere && m.port == 0) ||
           (m.code == RejCode::kRedirect && m.port != 0);
  }
  static Msg Sentinel() {
    Msg m;
    m.code = RejCode(0xee);
    m.port = 0xeeee;
    return m;
  }
};

// Parses an exact-size heap copy of [data, data+len), so that AddressSanitizer sees any read
// past the end; a rejection must leave the output as it was.
template <typename K>
ParseResult ParseCopy(const uint8_t* data, size_t len, typename K::Msg* out) {
  const std::vector<uint8_t> copy(data, data + len);
  typename K::Msg msg = K::Sentinel();
  const ParseResult r = K::Parse(len ? copy.data() : nullptr, len, &msg);
  Require(r <= ParseResult::kBadField);
  if (r != ParseResult::kOk) Require(K::Same(msg, K::Sentinel()));
  *out = msg;
  return r;
}

template <typename K>
void Check(const uint8_t* data, size_t len) {
  typename K::Msg msg;
  const ParseResult r = ParseCopy<K>(data, len, &msg);
  // Bytes past kSize are never looked at.
  if (len > K::kSize) {
    typename K::Msg head;
    Require(ParseCopy<K>(data, K::kSize, &head) == r);
    if (r == ParseResult::kOk) Require(K::Same(head, msg));
  }
  if (len < K::kSize) Require(r != ParseResult::kOk);
  if (len < 5) Require(r == ParseResult::kShort);
  if (r != ParseResult::kOk) return;

  Require(K::Valid(msg));
  uint8_t encoded[64];
  Require(K::Encode(msg, encoded, sizeof encoded) == K::kSize);
  Require(std::memcmp(encoded, data, K::kSize) == 0);
  // Too small a buffer encodes nothing.
  Require(K::Encode(msg, encoded, K::kSize - 1) == 0);
  for (size_t n = 0; n < K::kSize; ++n) {
    typename K::Msg prefix;
    Require(ParseCopy<K>(data, n, &prefix) == ParseResult::kShort);
  }
}

// As it is, and with the kind's header written in.
template <typename K>
void CheckBoth(const uint8_t* data, size_t size) {
  Check<K>(data, size);
  if (size >= 5) {
    std::vector<uint8_t> headed(data, data + size);
    for (int i = 0; i < 4; ++i) headed[i] = uint8_t(K::kMagic >> (8 * i));
    headed[4] = kVersion;
    Check<K>(headed.data(), headed.size());
  }
}

// verbs' message comms (verbs/msg_wire.h): the handle, the REQ's and REP's private data
// and the CTS entries. An accepted one re-encodes to exactly its bytes; a rejected one
// leaves the output as it was; bytes past its size never change the answer.
void CheckMessageWire(const uint8_t* data, size_t size) {
  namespace mw = msgwire;
  const std::vector<uint8_t> copy(data, data + size);  // exact size, for ASan
  const uint8_t* in = size ? copy.data() : nullptr;
  mw::Handle h;
  std::memset(h.secret, 0xee, sizeof(h.secret));
  if (mw::ParseHandle(in, size, &h)) {
    Require(size >= mw::kHandleWireBytes);
    Require(h.address.ss_family == AF_INET || h.address.ss_family == AF_INET6);
    uint8_t out[msg::kHandleBytes] = {};
    mw::EncodeHandle(h, out);
    Require(std::memcmp(out, data, mw::kHandleWireBytes) == 0);
    mw::Handle head;
    Require(mw::ParseHandle(data, mw::kHandleWireBytes, &head));
  } else {
    for (uint8_t b : h.secret) Require(b == 0xee);
  }
  for (uint32_t magic : {mw::kMagic.request, mw::kMagic.reply}) {
    mw::ConnectData d;
    d.area.addr = 0xeeee;
    if (mw::ParseConnectData(magic, in, size, &d)) {
      Require(size >= mw::kConnectDataBytes && d.area.addr != 0);
      uint8_t out[mw::kConnectDataBytes];
      Require(mw::EncodeConnectData(magic, d, out, sizeof(out)) == sizeof(out));
      Require(std::memcmp(out, data, sizeof(out)) == 0);
      Require(mw::EncodeConnectData(magic, d, out, sizeof(out) - 1) == 0);
    } else {
      Require(d.area.addr == 0xeeee);
    }
  }
  if (size >= mw::kCtsEntryBytes) {
    mw::CtsEntry e;
    e.tag = 0x0eeeeeee;
    const uint32_t stamp = mw::CtsStamp(in);
    if (mw::ParseCts(in, stamp, &e)) {
      Require(e.group >= 1 && e.group <= msg::kMaxGroup && e.capacity <= 0x7fffffffu);
      uint8_t out[mw::kCtsEntryBytes];
      mw::EncodeCts(e, out);
      Require(std::memcmp(out, data, sizeof(out)) == 0);
      Require(!mw::ParseCts(in, stamp + 1, &e));  // another receive's entry is not this one
    } else {
      Require(e.tag == 0x0eeeeeee);
    }
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  CheckMessageWire(data, size);
  if (size >= 5) {
    // With a handle's and a REQ's header written in, so that mutation reaches the fields.
    for (uint32_t magic : {msgwire::kMagic.handle, msgwire::kMagic.request}) {
      std::vector<uint8_t> headed(data, data + size);
      for (int i = 0; i < 4; ++i) headed[size_t(i)] = uint8_t(magic >> (8 * i));
      headed[4] = msgwire::kVersion;
      CheckMessageWire(headed.data(), headed.size());
    }
  }
  CheckBoth<ReqKind>(data, size);
  CheckBoth<RepKind>(data, size);
  CheckBoth<HelloKind>(data, size);
  CheckBoth<LinkMsgKind>(data, size);
  CheckBoth<RejMsgKind>(data, size);
  static_assert(kReqSize <= kMaxReqPrivateData);
}

}  // namespace
}  // namespace slip::verbs

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  slip::verbs::FuzzOne(data, size);
  return 0;
}
