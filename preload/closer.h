// The closer: verbs connections are torn down off the application's thread.
//
// Closing a verbs connection costs far more than a TCP close: the orderly end goes out on
// the queue pair and is waited for (bounded), then rdma_cm disconnects and destroys the id,
// which waits for the progress thread (13.6 ms per connection in the Soft-RoCE guest). A
// TCP close returns at once and the kernel finishes in the background; so does this: the
// last close hands the stream and its anchor to one thread, which destroys the stream and
// only then closes the anchor (the peer must see the orderly end on the queue pair before
// the anchor's FIN tells it the process is gone). At exit the queue is drained (bounded).
#pragma once

#include <memory>

#include "core/stream.h"

namespace slip::preload {

// Takes the stream and the anchor (closed once the stream is gone). Does both here and now
// when the thread cannot start or the queue cannot grow.
void CloseLater(std::unique_ptr<Stream> stream, int anchor_fd) noexcept;

// Waits up to `timeout_ms` until everything handed over is closed.
void DrainCloser(int timeout_ms) noexcept;

// fork(): the queue is the parent's business (verbs connections do not cross fork).
void CloserForkPrepare() noexcept;
void CloserForkParent() noexcept;
void CloserForkChild() noexcept;

}  // namespace slip::preload
