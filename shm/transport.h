// The shm transport's public header: what a face may call. Everything else under shm/ is
// the transport's own (shm/shm.h is its overview and internal interface).
//
// shm carries connections between processes of one host over rings in a memfd region the
// two share, found through a rendezvous each listening socket publishes. It needs no
// device and no library beyond libc, and is linked into each face.
#pragma once

#include <cstdint>
#include <memory>

#include "core/channel.h"
#include "core/transport_entries.h"

namespace slip::shm {

// The shim's transport (core/transport.h): streams under TCP connections of one host.
Transport* TheTransport() noexcept;
// The NCCL face's (core/msg_provider.h): message comms between processes of one host.
msg::Provider* MessageProvider() noexcept;

// --- the transport alone, without a rendezvous (slip-perf's native shm) ---
// What a client hands its server, by a channel of the caller's choosing: the region and
// the descriptors that the shim's REGISTER carries (the region's memfd, the server's proxy
// pair, the client's proxy B), copies the caller sends and then closes.
struct NativeRegion {
  uint32_t ring_size = 0;
  uint64_t nonce = 0;
  uint64_t region_size = 0;
  int fds[4] = {-1, -1, -1, -1};
};
// Client: a region with rings of `ring_size`, and its end's channel over it (*proxy_a,
// *proxy_b: its proxy pair, the caller's). nullptr with *error (-errno) when it cannot,
// and then *region holds no descriptor.
std::unique_ptr<Channel> OpenNative(uint32_t ring_size, NativeRegion* region, int* proxy_a,
                                    int* proxy_b, int* error) noexcept;
// Server: the channel over a client's region, which is checked as a listener checks a
// registration (its descriptors are taken). nullptr with *reason (a
// wire::DeclineReason's value) when it is unusable.
std::unique_ptr<Channel> AcceptNative(const NativeRegion& region, int* proxy_a, int* proxy_b,
                                      int* reason) noexcept;

}  // namespace slip::shm
