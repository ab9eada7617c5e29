// The process's accelerated sockets, for the one job that needs them all: before any
// thread sleeps in epoll_wait/poll/select, every proxy's readiness must be true in the
// kernel (a proxy is readable iff its ring holds bytes), because a sleeper may be waiting
// on any of them, possibly through nested epoll sets.
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

// Makes every accelerated proxy's kernel readiness true and arms wake-ups.
void PrepareAllForSleep() noexcept;
// Spins up to `spin_us` until some accelerated ring has something to read (or the
// budget is spent); returns true if one has.
bool SpinForAnyReadable(uint32_t spin_us) noexcept;
// True if there is at least one accelerated socket (cheap pre-check).
bool AccelListNonEmpty() noexcept;

// fork(): the list lock is taken around fork so that the child never inherits it held.
void AccelListForkPrepare() noexcept;
void AccelListForkParent() noexcept;
void AccelListForkChild() noexcept;

}  // namespace slip::preload
