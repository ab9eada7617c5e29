// Rendezvous names: which abstract socket serves which listener (shm/rendezvous_name.h).
#include "shm/rendezvous_name.h"

#include <cstddef>
#include <cstdio>
#include <cstring>

namespace slip::shm {

// "v3": a registration is answered when the process that accepts its connection takes it
// (the server claims the region, then says ACCEPT), and nothing of ours ever goes in band.
// A v2 peer (which answered at once and waited for a CONFIRM) finds no name of ours.
void RendezvousName(uint16_t port, uint64_t listener_inode, sockaddr_un* out,
                    socklen_t* len) noexcept {
  std::memset(out, 0, sizeof(*out));
  out->sun_family = AF_UNIX;
  // Abstract name: leading NUL, no terminator.
  const int n = std::snprintf(out->sun_path + 1, sizeof(out->sun_path) - 1, "slipstream-v3:%u:%llu",
                              unsigned(port), static_cast<unsigned long long>(listener_inode));
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
}

}  // namespace slip::shm
