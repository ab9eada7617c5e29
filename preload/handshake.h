// Detect and negotiate: how a connect() or accept() on a TCP socket becomes accelerated,
// or stays plain with a recorded reason. See docs/DESIGN.md, "Connection lifecycle".
#pragma once

#include <sys/socket.h>

#include "core/stats.h"

namespace slip::preload {

struct SlipSocket;

// The interposed connect() for a tracked TCP socket. Returns like connect(2).
int SlipConnect(SlipSocket* s, int fd, const sockaddr* addr, socklen_t len) noexcept;
// The interposed accept4() for a tracked listener. Returns like accept4(2).
int SlipAccept(SlipSocket* listener, int fd, sockaddr* addr, socklen_t* len, int flags) noexcept;
// Publishes the shm rendezvous of a listener, if policy allows.
void SlipListen(SlipSocket* s, int fd) noexcept;

// Records a connection that stays plain.
// `remote` may be null: then it is read from the socket.
void MarkPlain(SlipSocket* s, int fd, Reason reason, int role,
               const sockaddr* remote = nullptr) noexcept;

// Loopback or an address of a local interface.
bool IsLocalDestination(const sockaddr* addr) noexcept;

}  // namespace slip::preload
