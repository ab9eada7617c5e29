// shm's message face (core/msg_comm.h): NCCL's comms between processes of one host, over
// the same memfd regions as the shim's connections (shm/region.h, shm/region_file.h).
//
// A listener is an abstract AF_UNIX SOCK_SEQPACKET socket; its handle (shm/msg_wire.h)
// names it and carries a secret. A sender connects (never blocking: AF_UNIX connects at
// once or says EAGAIN), checks that the socket is held by the handle's process and by its
// own uid, makes the region and sends HELLO with the secret and the memfd. The listener
// accepts only its own uid and its own secret, and maps the region only after checking it
// (region_file.h). The rendezvous socket stays open for the comm's life: its end is how
// either side learns the other is gone (a process that dies cannot say so in the region).
//
// Data (one comm, one direction): the receiver posts receives as clear-to-send records in
// the reverse ring; the sender matches its sends to them in order (a send waits, kAgain,
// until the receive it is for is posted) and writes frames into the forward ring, in
// chunks the receiver copies out while the sender writes the next (the receiver credits
// as it copies). Bytes arrive in order, within a message and across messages.
//
// Everything in the region and on the socket comes from another process: the handle and
// HELLO are parsed once (msg_wire.h), the ring size and nonce are checked against the
// region once and kept, every cursor the peer moves is range-checked before it is used,
// and every CTS record and frame header is copied out and checked before it is obeyed. A
// violation fails the comm (kRemote, one log line); it never reads or writes outside the
// buffers the caller posted.
#pragma once

#include <cstdint>

#include "core/msg_comm.h"

namespace slip::shm {

// The process's shm message transport. `ring_size` (ValidRingSize, shm/region.h) sizes
// the forward ring of the comms it connects from now on.
msg::Transport* MessageTransport() noexcept;
void SetMessageRingSize(uint32_t ring_size) noexcept;
// SLIP_RENDEZVOUS_DIR (absolute; set once, before the first Listen): listeners also listen
// there, so that senders in other network namespaces of this host (pods) reach them.
void SetMessageRendezvousDir(const char* dir) noexcept;

}  // namespace slip::shm
