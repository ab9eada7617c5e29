// Descriptors that transport-library code makes in a process under the shim: libfabric,
// its providers and the fabric module (preload/transports.h, TransportLibraryCall). They
// are Slipstream's, not the application's, so they live where the shim's own do: at or
// above the hidden-descriptor floor, close-on-exec (docs/SECURITY.md, "Descriptors").
// libfabric opens its sockets, socket pairs and epoll sets at the lowest free numbers, and
// a peer that makes it open them (a flood of requests, of connections to its listener)
// would otherwise take the numbers the application's own accept() and open() need.
//
// Where no number above the floor is free the call fails with EMFILE, as it would at the
// limit: the library's set-up fails, and the connection that needed it stays plain.
#pragma once

namespace slip::preload {

// `fd` (>= 0), made by transport-library code, at a number at or above the floor: the
// number, or -1 with errno EMFILE (fd closed).
int HideTransportFd(int fd) noexcept;
// The same for both ends of a pair (socketpair, pipe): 0, or -1 with errno EMFILE (both
// closed).
int HideTransportPair(int fds[2]) noexcept;

}  // namespace slip::preload
