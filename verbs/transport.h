// The verbs transport's public header: what a face may call. Everything else under verbs/
// is the transport's own.
//
// verbs carries connections between hosts over RC queue pairs (libibverbs, librdmacm),
// each end writing into the other's registered ring. Its face-side part needs no rdma-core;
// the module that does the work, libslipstream-verbs.so (verbs/verbs.h, verbs/msg.h), is
// loaded on first need (core/module_transport.h).
#pragma once

#include "core/transport_entries.h"

namespace slip::verbs {

// The shim's transport (core/transport.h): streams under TCP connections.
Transport* TheTransport() noexcept;
// The NCCL face's (core/msg_provider.h): message comms over RC queue pairs.
msg::Provider* MessageProvider() noexcept;

}  // namespace slip::verbs
