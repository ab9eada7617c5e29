// Rendezvous through a shared directory (internal to shm/): how a client finds a listener
// in another network namespace of this host (another pod), where the listener's abstract
// name cannot be seen. docs/DESIGN.md, "Pods: a rendezvous directory".
//
// A listener publishes, beside its abstract name, one path name per address other
// namespaces reach it at, in SLIP_RENDEZVOUS_DIR. The kernel cannot tell a client there
// which socket listens (it is in another namespace), so trust and proof come from
// elsewhere: the directory is trusted only as StrictModes trusts one (RendezvousDirectory),
// its owner decides who may publish in it (TrustedEntry), and the
// client hands its TCP socket over with the registration, which proves to the listener,
// once the connection is accepted, that the registration is the connection's own
// (ProvesConnection).
#pragma once

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>

#include <cstddef>

#include "core/trusted_path.h"
#include "core/wire.h"

namespace slip::shm {

// The most names one listener publishes (a wildcard listener: one per address).
constexpr size_t kMaxDirNames = 8;
// The longest entry name: "slip3-" + an IPv6 address + "-" + a port, and its NUL.
constexpr size_t kDirEntryNameMax = 64;

// SLIP_RENDEZVOUS_DIR for one lookup or publication: opened and checked as a trusted
// directory (core/trusted_path.h: root's or ours at every component, writable by nobody
// else but a sticky directory of root's), names in it then reached only through its
// descriptor. The process keeps the first one it trusts (an fstat per use checks that its
// descriptor still names it); another path, or a kept one that is gone, is opened for the
// one use. Any thread.
class RendezvousDir {
 public:
  // False when the directory is not trusted (said once, at warn, with the reason).
  bool Open(const char* path) noexcept;
  const TrustedDir& get() const noexcept { return kept_ ? *kept_ : own_; }

 private:
  const TrustedDir* kept_ = nullptr;  // the process's (never freed)
  TrustedDir own_;
};

// "slip3-<address>-<port>", the entry of a listener reached at `server`. False for an
// endpoint of no known family.
bool DirEntryName(const wire::Endpoint& server, char* out, size_t len) noexcept;

// Whether an entry of `dir`, `st` as fstatat saw it without following links, may be the
// rendezvous of a listener whose socket is held by `peer` (SO_PEERCRED): a socket (never
// a link) made by the peer's uid, and that uid this process's own or the directory
// owner's (root or ours). In a sticky directory anybody may make names, so the entry's
// owner is what ties it to the process that answers.
bool TrustedEntry(const TrustedDir& dir, const struct stat& st, uid_t peer) noexcept;

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
