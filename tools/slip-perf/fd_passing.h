// Descriptors over a Unix stream socket (SCM_RIGHTS), with a fixed-size message: how the
// native tests hand a shared-memory connection to the other process, as the shim does over
// its rendezvous.
#pragma once

#include <cstddef>

namespace slipperf {

constexpr int kMaxPassedFds = 4;

// Sends `len` bytes and `count` descriptors (at most kMaxPassedFds). Throws on error.
void SendWithFds(int sock, const void* data, size_t len, const int* fds, int count);

// Reads exactly `len` bytes and the descriptors sent with them (close-on-exec) into `fds`.
// Returns the number of descriptors, or -1 at end of stream before the first byte. Throws
// on error.
int RecvWithFds(int sock, void* data, size_t len, int* fds);

}  // namespace slipperf
