// fabric's message face (core/msg_comm.h): NCCL's comms over libfabric reliable datagram
// (FI_EP_RDM) endpoints, served from the fabric module (libslipstream-fabric.so) that a
// face loads at run time. docs/DESIGN.md, "The NCCL face", over libfabric.
//
// One Transport per libfabric domain of the chosen provider (SLIP_FABRIC_PROVIDER, else
// fi_getinfo's best match that has tagged messages in order): an EFA device, a verbs
// device under ofi_rxm, an interface under tcp;ofi_rxm, or shm.
//
// Connection: an RDM endpoint has no connection to learn its peer by, so each comm keeps
// a TCP connection beside it: the listener is a TCP listener at the domain's IP address
// (the host's loopback for shm), its handle (core/msg_handle.h) that address and a secret;
// the sender connects to it and the two exchange their endpoints' addresses over it
// (fabric/msg_wire.h), each proving its half of the secret. The TCP connection then stays
// up as the comm's liveness: the kernel ends it when either process dies, which RDM
// cannot tell. Nothing blocks: connect and accept go one step per call.
//
// Data: tagged messages, zero copy at both ends: a receive posts each buffer with
// fi_trecv, directed at the peer's address where the provider can (FI_DIRECTED_RECV), a
// send is one fi_tsend from NCCL's buffer. The tag is the comm's key (random, from the
// exchange) and NCCL's tag, so a grouped receive's buffers each take the send of their
// tag, and the provider's ordered matching (FI_ORDER_SAS) pairs the sends of one tag with
// the receives of that tag in the order they were posted. No copy, allocation, lock or
// system call on the data path but the provider's own, and a look at the TCP connection
// every few milliseconds.
//
// A completion in error, the peer's TCP connection ending with receives outstanding (after
// a grace for what is still in flight) fails the comm: its requests and every later call
// return kRemote, with one line in the log naming the cause.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/log.h"
#include "core/msg_comm.h"
#include "core/msg_module.h"
#include "fabric/options.h"

namespace slip::fabric {

struct MessageSetup : msg::ModuleSetup<Options, 2> {};

}  // namespace slip::fabric

extern "C" {
// The transports of the chosen provider's domains (at most `max`, in *out; they live as
// long as the process), or -1 with one line in `error`: no provider has what the transport
// needs, the one asked for is not there, a domain cannot be opened. Later calls return the
// first call's answer.
int slip_fabric_message_transports(const slip::fabric::MessageSetup* setup,
                                   slip::msg::Transport** out, int max, char* error,
                                   size_t error_len);
}
