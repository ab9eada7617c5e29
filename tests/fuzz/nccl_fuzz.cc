// libFuzzer target for what the other end of an NCCL comm over shm controls (shm/msg.h):
// the handle and HELLO bytes (msg_wire.h), and the region as the peer writes it: its
// cursors, its clear-to-send records, its frame headers and payload.
//
// Each input is a script. Its first byte picks the victim: a receiver (a real recv comm,
// whose posted buffers the fuzzer sizes) or a sender (a real send comm, whose sends the
// fuzzer shapes). The fuzzer then plays the peer: it writes bytes into the ring the victim
// reads and moves the cursors the peer owns to any value, between the victim's own calls
// (Recv/Send, Test). Besides the sanitizers' checks (no read or write outside the ring or
// the posted buffers, whatever the peer wrote) it traps when the victim breaks a promise:
// a receive completes with no more bytes per buffer than that buffer's capacity, and a
// request that failed is not reported done.
// Build and run: tests/fuzz/CMakeLists.txt (ctest -L fuzz); seeds: nccl_fuzz_seeds DIR.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/msg_comm.h"
#include "shm/msg_internal.h"
#include "shm/msg_wire.h"
#include "shm/region.h"
#include "tests/fuzz/fuzz_script.h"

namespace slip::shm {
namespace {

constexpr uint32_t kRing = 4096;

using fuzz::Require;
using fuzz::Script;

// The peer's hand in the region: bytes into a ring at its own cursor, and the cursors.
struct Peer {
  RegionControl* control;
  uint8_t* ring;  // the ring the victim reads
  uint64_t cursor = 0;

  void Write(Script* in, DirectionControl* d) {
    size_t n = 0;
    const uint8_t* bytes = in->Bytes(in->U8() * 4u, &n);
    for (size_t i = 0; i < n; ++i) ring[(cursor + i) % kRing] = bytes[i];
    cursor += n;
    d->produced.store(cursor, std::memory_order_release);
  }
};

void FuzzReceiver(Script* in, void* region, int sock) {
  auto comm = MakeRecvComm(region, kRing, sock);
  if (!comm) return;
  auto* control = static_cast<RegionControl*>(region);
  Peer peer{control, static_cast<uint8_t*>(region) + kControlPage};
  struct Posted {
    msg::Request* req;
    int n;
    size_t caps[msg::kMaxGroup];
  };
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<Posted> posted;
  while (!in->done()) {
    switch (in->U8() % 6) {
      case 0: {  // the victim posts a receive
        const int n = 1 + in->U8() % msg::kMaxGroup;
        Posted p{nullptr, n, {}};
        void* data[msg::kMaxGroup];
        int tags[msg::kMaxGroup];
        for (int i = 0; i < n; ++i) {
          p.caps[i] = in->U16() % 9000;
          buffers.emplace_back(p.caps[i]);
          data[i] = buffers.back().data();
          tags[i] = in->U8();
        }
        if (comm->Recv(n, data, p.caps, tags, nullptr, &p.req) == msg::Status::kOk && p.req)
          posted.push_back(p);
        break;
      }
      case 1:  // the peer writes frames (or anything) and publishes
      case 2:
        peer.Write(in, &control->to_server);
        break;
      case 3:  // the peer sets its cursor to anything
        control->to_server.produced.store(in->U64(), std::memory_order_release);
        break;
      case 4:  // the peer moves its credit of our clear-to-send records
        control->to_client.consumed.store(in->U64(), std::memory_order_release);
        break;
      case 5: {  // the victim tests its oldest receive
        if (posted.empty()) break;
        bool done = false;
        size_t sizes[msg::kMaxGroup];
        int count = 0;
        const msg::Status st = msg::Test(posted.front().req, &done, sizes, &count);
        if (st != msg::Status::kOk) {
          Require(!done);
          return;  // the comm failed: nothing more will be asked of it
        }
        if (done) {
          Require(count == posted.front().n);
          for (int i = 0; i < count; ++i) Require(sizes[i] <= posted.front().caps[i]);
          posted.erase(posted.begin());
        }
        break;
      }
    }
  }
}

void FuzzSender(Script* in, void* region, int sock) {
  auto comm = MakeSendComm(region, kRing, sock);
  if (!comm) return;
  auto* control = static_cast<RegionControl*>(region);
  Peer peer{control, static_cast<uint8_t*>(region) + kControlPage + kRing};
  std::vector<uint8_t> payload(20000, 0x5a);
  std::vector<msg::Request*> sends;
  while (!in->done()) {
    switch (in->U8() % 5) {
      case 0: {  // the victim sends
        msg::Request* req = nullptr;
        const size_t size = in->U16() % payload.size();
        if (comm->Send(payload.data(), size, in->U8(), nullptr, &req) == msg::Status::kOk && req)
          sends.push_back(req);
        break;
      }
      case 1:  // the peer writes clear-to-send records (or anything)
        peer.Write(in, &control->to_client);
        break;
      case 2:
        control->to_client.produced.store(in->U64(), std::memory_order_release);
        break;
      case 3:  // the peer credits anything
        control->to_server.consumed.store(in->U64(), std::memory_order_release);
        break;
      case 4: {
        if (sends.empty()) break;
        bool done = false;
        size_t sizes[msg::kMaxGroup];
        int count = 0;
        const msg::Status st = msg::Test(sends.front(), &done, sizes, &count);
        if (st != msg::Status::kOk) {
          Require(!done);
          return;
        }
        if (done) sends.erase(sends.begin());
        break;
      }
    }
  }
}

}  // namespace
}  // namespace slip::shm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slip::shm;
  if (size < 1) return 0;
  // The handshake's parsers first, on the raw input.
  msgwire::Handle handle;
  msgwire::ParseHandle(data, size, &handle);
  msgwire::Hello hello;
  msgwire::ParseHello(data, size, &hello);

  Script in(data, size);
  const bool receiver = in.U8() % 2 == 0;
  void* region =
      mmap(nullptr, RegionSize(kRing), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return 0;
  new (region) RegionControl();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    munmap(region, RegionSize(kRing));
    return 0;
  }
  // The comm takes the mapping and sv[0]; sv[1] is the live peer's end.
  if (receiver)
    FuzzReceiver(&in, region, sv[0]);
  else
    FuzzSender(&in, region, sv[0]);
  close(sv[1]);
  return 0;
}
