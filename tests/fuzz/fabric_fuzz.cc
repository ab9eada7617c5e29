// libFuzzer target for what the other end of a fabric connection controls before it exists:
// the NCCL face's handle and the REQ and REP on a comm's TCP connection (fabric/msg_wire.h),
// and the shim's REQ, REP and REFUSE datagrams (fabric/stream_wire.h), which anybody who can
// send UDP to a listener's port writes, and the connection data of a client's fi_connect. Each
// input goes through every parser, as it is and with the kind's magic and version written over its
// first 5 bytes (so that mutation explores the fields behind the header). Besides the sanitizers'
// checks it traps when a parser breaks an invariant:
//   - an accepted message has only valid fields and re-encodes to exactly its input;
//   - a rejected one leaves the output untouched.
// Build and run: tests/fuzz/CMakeLists.txt (ctest -L fuzz); seeds: fabric_fuzz_seeds DIR.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fabric/msg_wire.h"
#include "fabric/stream_wire.h"

namespace slip::fabric::msgwire {
namespace {

void Require(bool ok) {
  if (!ok) __builtin_trap();
}

void FuzzHello(uint32_t magic, const uint8_t* data, size_t size) {
  Hello sentinel;
  std::memset(&sentinel, 0xee, sizeof(sentinel));
  Hello h = sentinel;
  if (!ParseHello(magic, data, size, &h)) {
    Require(std::memcmp(&h, &sentinel, sizeof(h)) == 0);
    return;
  }
  Require(size == kHelloBytes);
  Require(h.address_len >= 1 && h.address_len <= kMaxAddressBytes);
  Require(magic == kMagic.reply ? h.tag_key >= 1 && h.tag_key <= kMaxTagKey : h.tag_key == 0);
  uint8_t again[kHelloBytes];
  Require(EncodeHello(magic, h, again));
  Require(std::memcmp(again, data, kHelloBytes) == 0);
}

void FuzzHandle(const uint8_t* data, size_t size) {
  Handle sentinel;
  std::memset(&sentinel, 0xee, sizeof(sentinel));
  Handle h = sentinel;
  if (!ParseHandle(data, size, &h)) {
    Require(std::memcmp(&h, &sentinel, sizeof(h)) == 0);
    return;
  }
  Require(h.address.ss_family == AF_INET || h.address.ss_family == AF_INET6);
  uint8_t again[msg::kHandleBytes] = {};
  EncodeHandle(h, again);
  Require(size >= msg::kAddressHandleBytes);
  Require(std::memcmp(again, data, msg::kAddressHandleBytes) == 0);
}

void FuzzStreamMessage(const uint8_t* data, size_t size) {
  using namespace streamwire;
  Message sentinel;
  std::memset(&sentinel, 0xee, sizeof(sentinel));
  Message m = sentinel;
  if (!Parse(data, size, &m)) {
    Require(std::memcmp(&m, &sentinel, sizeof(m)) == 0);
    return;
  }
  Require(size == kBytes);
  if (m.type == Type::kRefuse) {
    Require(m.address_len == 0 && m.ring_log2 == 0 && m.note_tag == 0);
  } else {
    const bool connected_req = m.endpoints == Endpoints::kConnected && m.type == Type::kReq;
    Require(connected_req ? m.address_len == 0
                          : m.address_len >= 1 && m.address_len <= kMaxAddressBytes);
    Require(m.ring_log2 >= kMinRingLog2 && m.ring_log2 <= kMaxRingLog2);
    Require(m.note_tag >= 1 && m.note_tag <= kMaxNoteTag);
  }
  uint8_t again[kBytes];
  Require(Encode(m, again));
  Require(std::memcmp(again, data, kBytes) == 0);
}

// A client's connection data at the listener's connection listener (any host that
// reaches it writes it).
void FuzzLinkParam(const uint8_t* data, size_t size) {
  using namespace streamwire;
  const LinkParam sentinel{0xeeeeeeee, 0xeeeeeeeeeeeeeeeeull};
  LinkParam p = sentinel;
  if (!ParseLink(data, size, &p)) {
    Require(p.server_tag == sentinel.server_tag && p.nonce == sentinel.nonce);
    return;
  }
  Require(size == kLinkBytes && p.server_tag >= 1 && p.server_tag <= kMaxNoteTag);
  uint8_t again[kLinkBytes];
  EncodeLink(p, again);
  Require(std::memcmp(again, data, kLinkBytes) == 0);
}

void FuzzAll(const uint8_t* data, size_t size) {
  FuzzStreamMessage(data, size);
  FuzzLinkParam(data, size);
  FuzzHandle(data, size);
  FuzzHello(kMagic.request, data, size);
  FuzzHello(kMagic.reply, data, size);
}

}  // namespace
}  // namespace slip::fabric::msgwire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slip::fabric::msgwire;
  FuzzAll(data, size);
  // With each kind's header written over the first bytes.
  std::vector<uint8_t> copy(data, data + size);
  if (copy.size() >= 5) {
    for (uint32_t magic :
         {kMagic.handle, kMagic.request, kMagic.reply, slip::fabric::streamwire::kMagic,
          slip::fabric::streamwire::kLinkMagic}) {
      for (int i = 0; i < 4; ++i) copy[size_t(i)] = uint8_t(magic >> (8 * i));
      copy[4] =
          magic == slip::fabric::streamwire::kMagic ? slip::fabric::streamwire::kVersion : kVersion;
      FuzzAll(copy.data(), copy.size());
    }
  }
  return 0;
}
