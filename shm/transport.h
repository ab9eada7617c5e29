// The shm transport's public header: what a face may call. Everything else under shm/ is
// the transport's own (shm/shm.h is its overview and internal interface).
//
// shm carries connections between processes of one host over rings in a memfd region the
// two share, found through a rendezvous each listening socket publishes. It needs no
// device and no library beyond libc, and is linked into each face.
#pragma once

#include "core/transport_entries.h"

namespace slip::shm {

// The shim's transport (core/transport.h): streams under TCP connections of one host.
Transport* TheTransport() noexcept;
// The NCCL face's (core/msg_provider.h): message comms between processes of one host.
msg::Provider* MessageProvider() noexcept;

}  // namespace slip::shm
