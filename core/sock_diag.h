// The kernel's own view of sockets, through NETLINK_SOCK_DIAG (what `ss` reads).
//
// A same-host rendezvous is a door into a connection: whoever answers it receives the ring
// memory. Its name is not owned by anybody (abstract AF_UNIX names have no permissions),
// so a client checks, before it registers, that the rendezvous belongs to the owner of
// the TCP listener its SYN will reach (docs/SECURITY.md). FindListener asks the kernel
// which listener that is: an exact lookup for a connection from nowhere to `dest`, the
// same lookup an incoming SYN gets (exact address before wildcard, dual-stack included),
// in the caller's network namespace.
//
// Thread safety: any thread. One netlink socket per process is kept open (above the
// hidden-descriptor floor) and used under a mutex; a fork child opens its own.
#pragma once

#include <sys/socket.h>

#include <cstdint>

namespace slip {

struct SocketInfo {
  sockaddr_storage local{};  // the listener's bound address (AF_INET or AF_INET6)
  bool v6only = false;       // AF_INET6 listeners only
  uint32_t uid = 0;          // the owner of the listening socket (its creator)
  uint64_t inode = 0;        // the listening socket's inode
  bool listening = false;
};

// The listener that a SYN to `dest` (AF_INET or AF_INET6, v4-mapped allowed) reaches.
// `source` (same family), when given, is the SYN's own source address and port: among
// SO_REUSEPORT listeners sharing the port, the kernel then picks the one that SYN will
// reach (the same hash of the 4-tuple; a group that steers by BPF or by CPU may choose
// otherwise). Without it, the lookup is for a SYN from nowhere, which picks some member.
// Returns 0, -ENOENT when nothing listens there, or another -errno (no netlink, a reply
// that does not parse: treat as unknown).
int FindListener(const sockaddr* dest, SocketInfo* out, const sockaddr* source = nullptr) noexcept;

// The connected socket whose local end is `local` and whose peer is `remote` (a client's
// socket, seen from its server: local = the client's address). Returns 0, -ENOENT, or
// another -errno; out->uid is its owner, out->inode 0 while the connection waits in its
// listener's queue (no process has accepted it yet).
int FindConnection(const sockaddr* local, const sockaddr* remote, SocketInfo* out) noexcept;

// The UDP socket of this namespace that sent a datagram from `sender` to `receiver` (the
// address it was sent to): the one a datagram from `receiver` to `sender` would reach, as
// the kernel finds it. Returns 0 (out->uid its owner), -ENOENT (none: a remote sender, or
// one that closed its socket), or another -errno. A listener uses it to tell which local
// user sent a request, whatever loopback address it sent it from.
int FindUdpSender(const sockaddr* receiver, const sockaddr* sender, SocketInfo* out) noexcept;

// The inode of the socket connected to the AF_UNIX socket `inode` (its peer), and its type
// (SOCK_STREAM, ...) when `type` is not null. Returns 0,
// -ENOENT (no such socket, or no peer), or another -errno. A server uses it to check that
// the two proxy ends a client handed over are one socketpair.
int UnixPeer(uint64_t inode, uint64_t* peer, int* type = nullptr) noexcept;

}  // namespace slip
