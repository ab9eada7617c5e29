// Installing an accelerated connection behind the application's descriptor number.
#pragma once

#include <memory>

#include "core/channel.h"
#include "core/stats.h"

namespace slip::preload {

struct SlipSocket;

// Moves the TCP socket at `fd` to a hidden descriptor and puts the proxy end `proxy_a` at
// `fd` (keeping the descriptor's close-on-exec flag and the file's O_NONBLOCK), then makes
// `s` an accelerated socket owning `channel`, the proxies and the anchor.
// On failure nothing has changed at `fd` and the caller keeps plain TCP.
int InstallAccelerated(SlipSocket* s, int fd, std::unique_ptr<Channel> channel, int proxy_a,
                       int proxy_b, int role) noexcept;

// The connector's variant (a non-blocking connect over verbs): the proxy end `proxy_a` is
// already at `fd` and the TCP socket already hidden at `anchor`; makes `s` an accelerated
// socket owning them and `channel`. On failure (-errno) nothing was taken.
int InstallBehindProxy(SlipSocket* s, int fd, std::unique_ptr<Channel> channel, int proxy_a,
                       int proxy_b, int anchor, int role) noexcept;

}  // namespace slip::preload
