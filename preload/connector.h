// The connector: a non-blocking connect() over verbs that never blocks on detection.
//
// connect() on a non-blocking socket whose destination is a verbs candidate puts a filled
// proxy (neither readable nor writable, as a connecting TCP socket polls) at the
// application's descriptor number, hides the TCP socket, and returns EINPROGRESS; one
// service thread then runs every such connection's rdma_cm resolve, REQ/REP, the SYN and
// CONFIRM, many at once (docs/DESIGN.md, "Non-blocking connect over verbs"). Success
// installs the stream behind the proxy and drains it (EPOLLOUT, SO_ERROR 0); failure puts
// the TCP socket back at the number, with its epoll registrations, where the plain connect
// then completes as the application expects.
//
// Thread safety: every function may be called from any thread; the swap of a descriptor
// number happens under the socket's mutex, which close(), dup2() and dup3() of a
// connecting socket take too.
#pragma once

#include <sys/socket.h>

#include <cstdint>

#include "core/stats.h"
#include "core/wire.h"

namespace slip::verbs {
class Module;
}

namespace slip::preload {

struct SlipSocket;

// Starts the connection of `s` (kTcp, non-blocking, `s->mu` held by the caller) in the
// background. Returns Reason::kNone when it did (the caller returns -1/EINPROGRESS), or
// why verbs is not tried: then nothing changed and the caller connects plainly.
Reason ConnectInBackground(SlipSocket* s, int fd, const sockaddr* addr, socklen_t len) noexcept;

// Waits (bounded) until the connect of `s` in the background has settled, one way or the
// other. For calls that cannot act on a connecting socket's two files at once: dup of it,
// and changing its O_NONBLOCK (a blocking call must never sleep on the placeholder proxy).
// `s->mu` must not be held.
void WaitConnectSettled(SlipSocket* s) noexcept;

// fork() and exec: waits (bounded) until no connect is in flight, so that the child (the
// connector's thread does not exist there) or the new program inherits only settled
// sockets.
void ConnectorForkPrepare() noexcept;

// Shared with the blocking path (preload/connect.cc).
// The checks before any rdma_cm work; nullptr with *why when verbs is not tried.
verbs::Module* VerbsCandidate(SlipSocket* s, int fd, const sockaddr* addr, Reason* why) noexcept;
// Binds the TCP socket to the RDMA route's source address; *client is then its endpoint.
bool BindToRdmaSource(SlipSocket* s, int fd, const sockaddr_storage& source,
                      wire::Endpoint* client) noexcept;
int SendConfirm(int fd, uint64_t nonce, uint32_t ring_size) noexcept;
// CONFIRM is in the stream but the connection cannot be installed: resets the TCP socket at
// `fd`, marks `s` plain, returns -1 with errno ECONNRESET.
int ResetAfterConfirm(SlipSocket* s, int fd) noexcept;

}  // namespace slip::preload
