// The control thread: one per process, started with the first accelerated connection.
//
// It watches the hidden TCP anchors of accelerated connections, which stay silent while
// data flows on the transport. Readable means an in-band control message (ACCEPT or
// DECLINE after the client's CONFIRM); EOF or an error means the peer process is gone,
// so every sleeper on that connection is woken to see EOF or EPIPE. It never touches the
// data path. It also keeps listeners' rendezvous queues short between accepts.
#pragma once

namespace slip::preload {

struct SlipSocket;

// Starts the thread if needed; false if it cannot run. Without it nobody would notice a
// peer's death, so no connection may be accelerated then.
bool ControlReady() noexcept;
// Starts watching an accelerated socket's anchor (starts the thread if needed).
void ControlWatch(SlipSocket* s) noexcept;
// Stops watching (called before the socket is torn down).
void ControlUnwatch(SlipSocket* s) noexcept;
// Returns once the thread is not handling a batch of events that began before the call:
// after ControlUnwatch, the caller then owns the anchor's bytes alone.
void ControlQuiesce() noexcept;
// After fork, in the child: the thread is gone; forget it (a new one starts on demand).
void ControlResetAfterFork() noexcept;

}  // namespace slip::preload
