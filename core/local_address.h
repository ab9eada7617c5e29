// Whether a destination is this host: loopback, or an address of one of its interfaces
// (what decides that a connection may be carried by same-host transports, and that one
// over an RDMA device has no path: rdma_cm has no loopback device).
#pragma once

#include <sys/socket.h>

#include "core/wire.h"

namespace slip {

bool IsLoopback(const wire::Endpoint& ep) noexcept;
// A socket's own address and its peer's, as the wire writes them; false when the kernel
// has none to give (unconnected, closed) or the family is not IPv4/IPv6.
bool LocalEndpoint(int fd, wire::Endpoint* ep) noexcept;
bool PeerEndpoint(int fd, wire::Endpoint* ep) noexcept;
// Loopback or an address of a local interface (the list is cached for a few seconds).
bool IsLocalDestination(const sockaddr* addr) noexcept;

}  // namespace slip
