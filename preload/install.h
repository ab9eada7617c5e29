// Installing an accelerated connection behind the application's descriptor number.
#pragma once

#include <memory>

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

// The connector's variant (a non-blocking connect in the background): the stream's proxy
// end A is already at `fd` (a duplicate) and the TCP socket already hidden at `anchor`;
// makes `s` an accelerated socket owning the anchor and *stream. On failure (-errno)
// nothing was taken.
int InstallBehindProxy(SlipSocket* s, int fd, std::unique_ptr<Stream>* stream, int anchor,
                       int role) noexcept;

}  // namespace slip::preload
