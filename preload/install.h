// Installing an accelerated connection behind the application's descriptor number.
#pragma once

#include <memory>

#include "core/channel.h"
#include "core/stats.h"
#include "core/stream.h"

namespace slip::preload {

struct SlipSocket;

// Moves the TCP socket at `fd` to a hidden descriptor (`*anchor_slot`, a number kept for
// it, when >= 0) and puts the stream's proxy end A at `fd` (keeping the descriptor's
// close-on-exec flag and the file's O_NONBLOCK), then makes `s` an accelerated socket
// owning the stream and the anchor. Allocates nothing. On success *stream is taken and
// *anchor_slot is -1 if it was used; on failure (-errno) nothing has changed at `fd`, and
// the stream and the slot are still the caller's.
int InstallStream(SlipSocket* s, int fd, std::unique_ptr<Stream>* stream, int* anchor_slot,
                  int role) noexcept;

// The same over a channel and its proxies (the Stream is built here). `anchor_slot` may be
// null. On failure nothing has changed at `fd` and the caller keeps the proxies (the
// channel is gone) and plain TCP.
int InstallAccelerated(SlipSocket* s, int fd, std::unique_ptr<Channel> channel, int proxy_a,
                       int proxy_b, int* anchor_slot, int role) noexcept;

// The connector's variant (a non-blocking connect over verbs): the proxy end `proxy_a` is
// already at `fd` and the TCP socket already hidden at `anchor`; makes `s` an accelerated
// socket owning them and `channel`. On failure (-errno) nothing was taken.
int InstallBehindProxy(SlipSocket* s, int fd, std::unique_ptr<Channel> channel, int proxy_a,
                       int proxy_b, int anchor, int role) noexcept;

}  // namespace slip::preload
