// The connector: a non-blocking connect() that never blocks on detection.
//
// connect() on a non-blocking socket whose offer must wait for news (verbs: the rdma_cm
// exchange) puts a filled proxy (neither readable nor writable, as a connecting TCP socket
// polls) at the application's descriptor number, hides the TCP socket, and returns
// EINPROGRESS; one service thread then steps every such connection's ClientSetup
// (core/client_setup.h) on its news: the offer, the SYN, the in-band step, many at once
// (docs/DESIGN.md, "Non-blocking connect"). Success installs the stream behind the proxy
// and drains it (EPOLLOUT, SO_ERROR 0); failure puts the TCP socket back at the number,
// with its epoll registrations, where the plain connect then completes as the application
// expects.
//
// Thread safety: every function may be called from any thread; the swap of a descriptor
// number happens under the socket's mutex, which close(), dup2() and dup3() of a
// connecting socket take too.
#pragma once

#include <sys/socket.h>

namespace slip {
class ClientSetup;
}

namespace slip::preload {

struct SlipSocket;

// Continues the connection of `s` (kTcp, non-blocking, `s->mu` held by the caller) whose
// `setup` waits in kOffer, in the background: takes the setup and returns true (the caller
// returns -1/EINPROGRESS), or false when it cannot (nothing changed at `fd`; the setup is
// still the caller's).
bool ConnectInBackground(SlipSocket* s, int fd, ClientSetup* setup) noexcept;

// Waits (bounded) until the connect of `s` in the background has settled, one way or the
// other. For calls that cannot act on a connecting socket's two files at once: dup of it,
// and changing its O_NONBLOCK (a blocking call must never sleep on the placeholder proxy).
// `s->mu` must not be held.
void WaitConnectSettled(SlipSocket* s) noexcept;

// fork() and exec: waits (bounded) until no connect is in flight, so that the child (the
// connector's thread does not exist there) or the new program inherits only settled
// sockets.
void ConnectorForkPrepare() noexcept;

// CONFIRM is in the stream but the connection cannot be installed: resets the TCP socket at
// `fd`, marks `s` plain, returns -1 with errno ECONNRESET (preload/connect.cc).
int ResetAfterConfirm(SlipSocket* s, int fd) noexcept;

}  // namespace slip::preload
