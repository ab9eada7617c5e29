// libFuzzer target for what an shm peer controls: the shared region (header, cursors,
// end-of-stream and wake words, ring bytes) and the registration that hands it over.
//
// Each input is a script. The fuzzer plays the peer process: it holds the region's memory
// (its own mapping) and writes there what a real peer would (bytes and cursors) or anything
// at all; between its writes the victim end, a real server (or client) Stream over a real
// shm channel, sends, receives, peeks, shuts down and polls, never blocking. Besides the
// sanitizers' checks (no read or write outside the ring, whatever the cursors say) it
// traps when the victim breaks a promise whatever the peer wrote: a receive returns at
// most what was asked and at most a ring; a send at most what was asked; no count reports
// more than a ring readable or unconsumed.
// The first bytes also shape a registration (ring and region sizes, header fields) given
// to AcceptRegistration, which must refuse what does not fit and never crash.
// Build and run: tests/fuzz/CMakeLists.txt (ctest -L fuzz); seeds: shm_fuzz_seeds DIR.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/stream.h"
#include "core/wire.h"
#include "shm/region.h"
#include "shm/shm.h"
#include "tests/fuzz/fuzz_script.h"

namespace slip::shm {
namespace {

constexpr uint32_t kRing = 4096;

using fuzz::Require;
using fuzz::Script;

// Duplicates of what REGISTER would carry, so that the offer keeps its own.
bool Carried(const Offer& offer, int fds[4]) {
  const int from[4] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b};
  for (int i = 0; i < 4; ++i) {
    fds[i] = fcntl(from[i], F_DUPFD_CLOEXEC, 0);
    if (fds[i] < 0) {
      for (int j = 0; j < i; ++j) close(fds[j]);
      return false;
    }
  }
  return true;
}

// A registration whose message and header the script bends: AcceptRegistration must refuse
// whatever does not fit, leaking nothing.
void FuzzRegistration(Script* in) {
  Offer offer;
  if (PrepareOffer(kRing, &offer) != 0) return;
  wire::Register msg;
  msg.nonce = offer.nonce;
  msg.ring_size = kRing;
  msg.region_size = RegionSize(kRing);
  msg.fd_count = 4;
  const uint8_t bend = in->U8();
  if (bend & 1) msg.ring_size = in->U32();
  if (bend & 2) msg.region_size = in->U64();
  if (bend & 4) msg.fd_count = in->U8();
  if (bend & 8) msg.nonce ^= in->U64();
  auto* header = static_cast<RegionHeader*>(offer.region);
  if (bend & 16) header->magic ^= in->U32();
  if (bend & 32) header->ring_size = in->U32();
  if (bend & 64) header->nonce ^= in->U64();
  int fds[4];
  if (!Carried(offer, fds)) return;
  if (bend & 128) std::swap(fds[in->U8() % 4], fds[in->U8() % 4]);
  int a = -1, b = -1;
  wire::DeclineReason reason;
  std::unique_ptr<Channel> channel = AcceptRegistration(msg, fds, -1, &a, &b, nullptr, &reason);
  if (channel) {
    Require(channel->ring_size() == kRing);  // only what was validated
    close(a);
    close(b);
  }
}

void FuzzTraffic(Script* in) {
  Offer offer;
  if (PrepareOffer(kRing, &offer) != 0) return;
  int fds[4];
  if (!Carried(offer, fds)) return;
  wire::Register msg;
  msg.nonce = offer.nonce;
  msg.ring_size = kRing;
  msg.region_size = RegionSize(kRing);
  msg.fd_count = 4;
  // The peer's own mapping of the region (the offer's goes to the victim when it is the
  // client).
  auto* region = static_cast<uint8_t*>(
      mmap(nullptr, msg.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, offer.memfd, 0));
  if (region == MAP_FAILED) {
    for (int fd : fds) close(fd);
    return;
  }
  const bool victim_is_client = in->U8() & 1;
  int a = -1, b = -1;
  std::unique_ptr<Channel> channel;
  if (victim_is_client) {
    for (int fd : fds) close(fd);
    channel = MakeClientChannel(&offer, -1, {}, {}, &a, &b);
  } else {
    wire::DeclineReason reason;
    channel = AcceptRegistration(msg, fds, -1, &a, &b, nullptr, &reason);
  }
  if (!channel) {
    munmap(region, msg.region_size);
    return;
  }
  StreamOptions options;
  options.spin_us = 0;
  Stream victim(std::move(channel), a, b, options);

  auto* control = reinterpret_cast<RegionControl*>(region);
  // The peer's side: it writes the victim's receive direction and reads its send one.
  DirectionControl* to_victim = victim_is_client ? &control->to_client : &control->to_server;
  DirectionControl* from_victim = victim_is_client ? &control->to_server : &control->to_client;
  uint8_t* victim_rx = region + kControlPage + (victim_is_client ? kRing : 0);
  uint64_t peer_produced = 0;

  uint8_t buf[3 * kRing];
  for (int steps = 0; !in->done() && steps < 256; ++steps) {
    switch (in->U8() % 10) {
      case 0: {  // the victim sends
        const size_t len = in->U16() % sizeof(buf);
        iovec iov{buf, len};
        const ssize_t n = victim.Send(&iov, 1, MSG_NOSIGNAL | MSG_DONTWAIT, true);
        Require(n <= ssize_t(len));
        break;
      }
      case 1:
      case 2: {  // the victim receives (or peeks)
        const size_t len = in->U16() % sizeof(buf);
        iovec iov{buf, len};
        const ssize_t n = victim.Recv(&iov, 1, in->U8() & 1 ? MSG_PEEK : 0, true);
        Require(n <= ssize_t(len) && n <= ssize_t(kRing));
        break;
      }
      case 3: {  // a well-behaved publish: bytes, then the cursor
        size_t got;
        const uint8_t* bytes = in->Bytes(in->U16() % kRing, &got);
        for (size_t i = 0; i < got; ++i) victim_rx[(peer_produced + i) % kRing] = bytes[i];
        const uint64_t consumed = to_victim->consumed.load(std::memory_order_relaxed);
        const uint64_t room = kRing - (peer_produced - consumed);
        peer_produced += got < room ? got : room;
        to_victim->produced.store(peer_produced, std::memory_order_release);
        break;
      }
      case 4:  // any credit at all
        from_victim->consumed.store(in->U64(), std::memory_order_release);
        break;
      case 5:  // any cursor at all
        to_victim->produced.store(in->U64(), std::memory_order_release);
        break;
      case 6: {  // anything anywhere in the control page
        const size_t at = in->U16() % kControlPage;
        size_t got;
        const uint8_t* bytes = in->Bytes(in->U8() % 32, &got);
        if (at + got > kControlPage) got = kControlPage - at;
        std::memcpy(region + at, bytes, got);
        break;
      }
      case 7:  // the end-of-stream and closed words
        to_victim->eof.store(in->U8() & 1, std::memory_order_release);
        from_victim->reader_closed.store(in->U8() & 1, std::memory_order_release);
        break;
      case 8: {  // readiness and counts
        const uint32_t ready = victim.Ready(EPOLLIN | EPOLLOUT | EPOLLRDHUP);
        (void)ready;
        Require(victim.ReadableBytes() <= kRing);
        Require(victim.UnconsumedBytes() <= kRing);
        victim.PrepareToSleep(in->U8() & 1 ? EPOLLIN : EPOLLOUT);
        break;
      }
      case 9:
        if (in->U8() & 1) {
          victim.ShutdownWrite();
        } else {
          victim.ShutdownRead();
        }
        break;
    }
  }
  munmap(region, msg.region_size);
}

}  // namespace
}  // namespace slip::shm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  slip::shm::Script in(data, size);
  if (in.U8() & 1) {
    slip::shm::FuzzRegistration(&in);
  } else {
    slip::shm::FuzzTraffic(&in);
  }
  return 0;
}
