// Handing an accelerated connection back to its TCP socket for good, while the process goes
// on: for exec (preload/exec.h), and for a socket option only the kernel's TCP can honour
// (docs/DESIGN.md, "What only the kernel's TCP does").
#pragma once

#include <cstddef>

#include "core/stats.h"

namespace slip::preload {

struct SlipSocket;

// One of the program's numbers for a connection, and whether it is close-on-exec.
struct ProgramNumber {
  int fd;
  bool cloexec;
};

// Under `s->mu`, `s` accelerated and this process its only holder: the stream goes back to
// its TCP anchor at the byte the program read up to (Stream::HandBack), and each of
// `numbers` then refers to the TCP socket, with the program's epoll registrations, its
// O_NONBLOCK, and the stats saying `why`. False when the channel could not (peer gone, no
// answer in time): nothing is changed at the numbers, and the connection is unusable
// (the caller resets it).
bool HandBackToTcp(SlipSocket* s, const ProgramNumber* numbers, size_t count, Reason why) noexcept;

// One end of a socket pair whose other end was closed with a byte unread: reads fail with
// ECONNRESET (then EOF), writes with EPIPE. -1 when none can be made.
int MakeResetSocket() noexcept;
// The hand-back failed: the peer sees a reset (bytes may be missing), and each of
// `numbers` gets a reset socket and leaves the table.
void ResetConnection(SlipSocket* s, const ProgramNumber* numbers, size_t count) noexcept;

// Whether setsockopt(level, name, val) asks for what only the kernel's TCP does with the
// bytes it sends or receives: MSG_ZEROCOPY completions (SO_ZEROCOPY on) or an upper-layer
// protocol (TCP_ULP: kernel TLS, which encrypts what is written and decrypts what is
// read). On an accelerated connection the bytes would pass by it.
bool KernelOnlyOption(int level, int name, const void* val, unsigned len) noexcept;

// The program sets a KernelOnlyOption on `s`: `lazily` (SO_ZEROCOPY) marks it, so that
// its connection goes back to TCP at the first MSG_ZEROCOPY send; otherwise (and at that
// send) an accelerated connection is handed back now (reason kernel_feature). 0, or -1 with errno
// (EOPNOTSUPP: another process holds the connection too, or the hand-back failed and the
// connection was reset).
int PrepareForKernelOption(SlipSocket* s, int fd, bool lazily = false) noexcept;

}  // namespace slip::preload
