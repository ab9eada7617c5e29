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
//
// The program's own calls on a descriptor of ours (one it never opened: found by walking
// /proc/self/fd, or guessed) find it as the kernel finds a number that is not open:
// fstat here, close, close_range, closefrom, dup*, fcntl, ioctl, epoll_ctl and the socket
// calls in preload/socket_calls.cc and preload/wait_calls.cc.
#pragma once

namespace slip::preload {

// `fd` (>= 0), made by transport-library code, at a number at or above the floor: the
// number, or -1 with errno EMFILE (fd closed).
int HideTransportFd(int fd) noexcept;
// The same for both ends of a pair (socketpair, pipe): 0, or -1 with errno EMFILE (both
// closed).
int HideTransportPair(int fds[2]) noexcept;

// Whether `fd` is one of Slipstream's own descriptors (core/own_fds.h) that the call made
// from `caller` must find not open: true, with errno EBADF, for the program's calls; never
// for the shim's own code, a module's, or a transport library's (they are about ours).
bool NotTheProgramsFd(int fd, const void* caller) noexcept;

}  // namespace slip::preload
