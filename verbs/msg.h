// verbs' message face (core/msg_comm.h): NCCL's comms over RC queue pairs, in NCCL's own
// pattern, served from the same module (libslipstream-verbs.so) and queue-pair layer
// (verbs/qp.h) as the shim's streams. docs/DESIGN.md, "The NCCL face", over verbs.
//
// One Transport per RDMA device that has an active port and an IP address (rdma_cm needs
// one: RoCE's netdev, IPoIB's interface). A listener is an rdma_cm listener on that address
// and a random port; its handle (verbs/msg_wire.h) names both and carries a secret. A
// sender resolves, connects and completes the exchange in steps, one per Connect call
// (NCCL calls again until the comm is returned), and so does Accept: nothing here blocks.
//
// Each comm has its own protection domain, completion queue, queue pair and rdma_cm
// event channel. Its memory registrations (Comm::Register, NCCL's regMr) are made in its
// protection domain: a peer reaches only the buffers registered with the comm its queue
// pair belongs to, whatever keys it guesses.
//
// Data (msg_wire.h): the receiver writes a clear-to-send entry per posted buffer into the
// sender's FIFO by RDMA WRITE; the sender writes the bytes straight into the posted buffer
// and completes each send with an RDMA WRITE WITH IMMEDIATE of its size. No copy, no
// allocation, no lock and no system call on the data path; the CPU touches no payload.
//
// A work completion in error, a disconnect (the peer closed or died: the kernel
// disconnects a dead process's ids) or the device's removal fails the comm: its requests
// and every later call return kRemote, with one line in the log naming the cause.
#pragma once

#include <cstddef>

#include "core/log.h"
#include "core/msg_comm.h"
#include "core/msg_module.h"
#include "verbs/options.h"

namespace slip::verbs {

struct MessageSetup : msg::ModuleSetup<Options, 4> {
  // Flush receives into host memory too (SLIP_NCCL_FLUSH=1): the GPUDirect flush's path,
  // exercised where there is no GPU (the Soft-RoCE guest's tests).
  bool flush_host_memory = false;
  // Queue pairs per comm this process connects with (SLIP_NCCL_QPS, 1..4): a send to a
  // receive of one buffer is split across them in 128-byte aligned parts.
  int queue_pairs = 1;
};

}  // namespace slip::verbs

extern "C" {
// The transports of the usable RDMA devices (at most `max`, in *out; they live as long as
// the process), or -1 with one line in `error`: no rdma-core device, none active, none
// with an IP address. Later calls return the first call's answer.
int slip_verbs_message_transports(const slip::verbs::MessageSetup* setup,
                                  slip::msg::Transport** out, int max, char* error,
                                  size_t error_len);
}
