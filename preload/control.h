// The control thread: one per process, started with the first Slipstream connection or
// listener.
//
// It watches the hidden TCP anchors of accelerated connections, which stay silent while
// data flows on the transport. Readable means an in-band control message (a FAILOVER, a
// DECLINE) or, for a server connection still held, its client's CONFIRM; EOF or an error
// means the peer process is gone, so every sleeper on that connection is woken to see EOF
// or EPIPE. It settles connections that were installed before both ends agreed to use
// the transport (ChannelControl::Settle; docs/DESIGN.md, "Settling a connection"), at their
// news or their deadline, and reads and answers the rendezvous of the listeners this
// process accepts on, so that registrations are answered without waiting for accept().
// It never touches the data path.
#pragma once

#include <cstdint>

namespace slip::preload {

struct SlipSocket;

// Starts the thread if needed; false if it cannot run. Without it nobody would notice a
// peer's death, so no connection may be accelerated and no rendezvous published then.
bool ControlReady() noexcept;
// Starts watching an accelerated socket's anchor (starts the thread if needed).
void ControlWatch(SlipSocket* s) noexcept;
// Stops watching (called before the socket is torn down).
void ControlUnwatch(SlipSocket* s) noexcept;
// An accelerated socket (watched) whose channel is not settled yet: settles it now if its
// news is already there, and otherwise the thread settles it from then on.
void ControlSettle(SlipSocket* s) noexcept;
// A listener this process accepts on: its twins' work is done as it arrives (shm: the
// rendezvous' registrations read and answered), once per process; a fork child that
// accepts registers its own.
void ControlWatchTwins(SlipSocket* listener) noexcept;
// Returns once the thread is not handling a batch of events that began before the call:
// after ControlUnwatch, the caller then owns the anchor's bytes alone.
void ControlQuiesce() noexcept;
// fork and exec: waits, at most `bound_ms`, until no connection of this process is
// unsettled (a child has no control thread to settle them; a new program no rings).
// Returns false if some still are.
bool ControlWaitSettled(uint64_t bound_ms) noexcept;
// After fork, in the child: the thread is gone; forget it (a new one starts on demand).
void ControlResetAfterFork() noexcept;

}  // namespace slip::preload
