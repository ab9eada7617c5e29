// Rendezvous names (internal to shm/): which abstract socket serves which listener.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

namespace slip::shm {

// The name a listener bound to `local` publishes. Returns false for unsupported families.
// Wildcards are told apart the way the kernel does: "*4" (0.0.0.0), "*6" (:: v6-only),
// "*" (:: dual-stack).
bool RendezvousNameFor(const sockaddr* local, bool v6only, sockaddr_un* out,
                       socklen_t* len) noexcept;

// The names a client connecting to `dest` tries, most specific first, in the order the
// kernel prefers listeners. Returns how many (0 for unsupported families).
int RendezvousNamesFor(const sockaddr* dest, sockaddr_un out[3], socklen_t lens[3]) noexcept;

}  // namespace slip::shm
