// Detect and negotiate: how a connect() or accept() on a TCP socket becomes accelerated,
// or stays plain with a recorded reason. See docs/DESIGN.md, "The connection engine".
#pragma once

#include <sys/socket.h>

#include "core/short_conns.h"
#include "core/stats.h"
#include "core/wire.h"

namespace slip::preload {

struct SlipSocket;

// The interposed connect() for a tracked TCP socket. Returns like connect(2).
int SlipConnect(SlipSocket* s, int fd, const sockaddr* addr, socklen_t len) noexcept;
// The interposed accept4() for a tracked listener. Returns like accept4(2).
int SlipAccept(SlipSocket* listener, int fd, sockaddr* addr, socklen_t* len, int flags) noexcept;
// Makes a bound socket a listener and stands its transports' twins beside it, if policy
// allows.
// Returns false (and does nothing) while the socket has no port yet.
bool SlipListen(SlipSocket* s, int fd) noexcept;
// Undoes SlipListen when listen(2) itself failed.
void SlipUnlisten(SlipSocket* s) noexcept;

// Records a connection that stays plain.
// `remote` may be null: then it is read from the socket.
// (`remote`, `local`: the connection's addresses when the caller has them; asked otherwise.)
void MarkPlain(SlipSocket* s, int fd, Reason reason, int role, const sockaddr* remote = nullptr,
               const sockaddr* local = nullptr) noexcept;

// Opens the stats slot of a plain connection whose non-blocking connect has completed
// (it just moved its first bytes).
void RecordPendingPlain(SlipSocket* s, int fd) noexcept;

// The short-connection policy of this process (core/short_conns.h): a client connection
// that was accelerated tells it how it ended (`slot`: its stats), at teardown.
ShortConnPolicy& ShortConns() noexcept;
void NoteClientClosed(const wire::Endpoint& dest, const ConnSlot& slot) noexcept;

}  // namespace slip::preload
