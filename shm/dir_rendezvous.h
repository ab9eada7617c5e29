// Rendezvous through a shared directory (internal to shm/): how a client finds a listener
// in another network namespace of this host (another pod), where the listener's abstract
// name cannot be seen. docs/DESIGN.md, "Pods: a rendezvous directory".
//
// A listener publishes, beside its abstract name, one path name per address other
// namespaces reach it at, in SLIP_RENDEZVOUS_DIR. The kernel cannot tell a client there
// which socket listens (it is in another namespace), so trust and proof come from
// elsewhere: the directory's owner decides who may publish in it (TrustedInDir), and the
// client hands its TCP socket over with the registration, which proves to the listener,
// once the connection is accepted, that the registration is the connection's own
// (ProvesConnection).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <cstddef>

#include "core/wire.h"

namespace slip::shm {

// The most names one listener publishes (a wildcard listener: one per address).
constexpr size_t kMaxDirNames = 8;

// "<dir>/slip3-<address>-<port>" for a listener reached at `server`. False when it does
// not fit a sockaddr_un.
bool DirRendezvousName(const char* dir, const wire::Endpoint& server, sockaddr_un* out,
                       socklen_t* len) noexcept;

// The endpoints at which other namespaces reach a listener bound to `local`: `local`
// itself, or for a wildcard every address of this namespace's interfaces but loopback and
// link-local ones (IPv4 ones too for a dual-stack IPv6 listener). None for loopback.
// Returns how many were written to `out` (at most `max`).
size_t ReachableEndpoints(const wire::Endpoint& local, bool v6only, wire::Endpoint* out,
                          size_t max) noexcept;

// Whether a rendezvous in the directory, held by `peer`, may receive this process's
// registrations: it is this process's own uid or the directory's owner's.
inline bool TrustedInDir(uid_t peer, uid_t self, uid_t dir_owner) noexcept {
  return peer == self || peer == dir_owner;
}

// The source address (port 0) the kernel picks for a connection to `dest`. False when
// there is no route.
bool SourceToward(const sockaddr* dest, sockaddr_storage* out) noexcept;

// What the client's handed-over TCP socket says about its connection.
enum class ClientSocket {
  kNotIt,       // not a TCP socket of this 4-tuple (or unreadable): no proof
  kConnecting,  // of this 4-tuple, its handshake not complete (or not begun)
  kConnected,   // of this 4-tuple, the server's SYN-ACK came back (any state since)
};
// `sock` is a TCP socket whose local end is `client` and whose peer is `server`: only the
// process that made the connection holds one whose handshake completed.
ClientSocket LookAtClientSocket(int sock, const wire::Endpoint& client,
                                const wire::Endpoint& server) noexcept;

}  // namespace slip::shm
