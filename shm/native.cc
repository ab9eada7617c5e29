// The transport alone, without a rendezvous (shm/transport.h): what slip-perf measures as
// native shm. The region and the proxies are made and checked as for a connection of the
// shim's; only the rendezvous socket and the claim are left out.
#include <fcntl.h>

#include <cerrno>

#include "core/sys.h"
#include "core/wire.h"
#include "shm/shm.h"
#include "shm/transport.h"

namespace slip::shm {

std::unique_ptr<Channel> OpenNative(uint32_t ring_size, NativeRegion* region, int* proxy_a,
                                    int* proxy_b, int* error) noexcept {
  Offer offer;
  *error = PrepareOffer(ring_size, &offer);
  if (*error != 0) return nullptr;
  const int mine[4] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b};
  *region = NativeRegion{};
  auto drop_copies = [region]() noexcept {
    for (int& fd : region->fds) {
      if (fd >= 0) sys::close(fd);
      fd = -1;
    }
  };
  for (int i = 0; i < 4; ++i) {
    region->fds[i] = sys::fcntl(mine[i], F_DUPFD_CLOEXEC, 0);
    if (region->fds[i] < 0) {
      *error = -errno;
      drop_copies();
      return nullptr;
    }
  }
  region->ring_size = offer.ring_size;
  region->nonce = offer.nonce;
  region->region_size = offer.region_size;
  // (The copies first: building the channel closes the offer's memfd.)
  auto channel = MakeClientChannel(&offer, /*rendezvous=*/-1, {}, {}, proxy_a, proxy_b);
  if (!channel) {
    *error = -ENOMEM;
    drop_copies();  // (the offer's own go with it)
  }
  return channel;
}

std::unique_ptr<Channel> AcceptNative(const NativeRegion& region, int* proxy_a, int* proxy_b,
                                      int* reason) noexcept {
  wire::Register reg;
  reg.ring_size = region.ring_size;
  reg.nonce = region.nonce;
  reg.region_size = region.region_size;
  reg.fd_count = 4;
  int fds[4] = {region.fds[0], region.fds[1], region.fds[2], region.fds[3]};
  wire::DeclineReason why = wire::DeclineReason::kUnspecified;
  // (No claim: whoever handed the region over stands for the proof.)
  auto channel = AcceptRegistration(reg, fds, /*anchor=*/-1, proxy_a, proxy_b, nullptr, &why);
  *reason = int(why);
  return channel;
}

}  // namespace slip::shm
