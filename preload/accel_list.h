// The process's accelerated sockets, and the readiness of their proxies: before any thread
// sleeps in epoll_wait/poll/select, every proxy whose ring holds bytes must be readable in
// the kernel, because a sleeper may be waiting on any of them, possibly through nested
// epoll sets. The streams stay armed between waits; only those a receive left unarmed
// are armed again (core/rearm_list.h), so a wait costs the connections that were read,
// not all of them.
#pragma once

#include <cstdint>

namespace slip::preload {

struct SlipSocket;

// False when the list cannot grow (no memory): the socket must not be accelerated. Each
// add keeps room for the next ones, so that an install rarely allocates.
bool AccelListAdd(SlipSocket* s) noexcept;
// Makes room ahead (a listener before it publishes, a client before it registers), so that
// the add that follows a CONFIRM does not allocate. False without memory.
bool AccelListReserve() noexcept;
void AccelListRemove(SlipSocket* s) noexcept;

// Arms the streams that may not be armed (read since the last wait, new, or shared with
// another process): afterwards every proxy whose ring holds bytes is readable.
void PrepareChangedForSleep() noexcept;
// True if a connection that was busy lately has bytes to read now (its proxy then shows
// them): the cheap look of a spin before a sleep.
bool RecentReadable() noexcept;
// True if there is at least one accelerated socket (cheap pre-check).
bool AccelListNonEmpty() noexcept;

// fork(): the list locks are taken around fork so that the child never inherits them held.
// In both processes every connection is shared from then on, and armed before every wait.
void AccelListForkPrepare() noexcept;
void AccelListForkParent() noexcept;
void AccelListForkChild() noexcept;

}  // namespace slip::preload
