// Rendezvous names (internal to shm/): which abstract socket serves which listener.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>

namespace slip::shm {

// The name the rendezvous of the TCP listening socket `listener_inode` (its socket inode,
// as fstat and the kernel's socket lookups report it) bound to `port` publishes:
// "slipstream-v3:<port>:<inode>". One per listening socket, so that every member of an
// SO_REUSEPORT group has its own, and a client finds the one its SYN will reach by asking
// the kernel which listener that is (core/sock_diag.h).
void RendezvousName(uint16_t port, uint64_t listener_inode, sockaddr_un* out,
                    socklen_t* len) noexcept;

}  // namespace slip::shm
