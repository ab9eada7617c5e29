// The fabric transport's public header: what a face may call. Everything else under
// fabric/ is the transport's own.
//
// fabric carries connections between hosts over a libfabric provider's endpoints (RMA
// writes into the peer's registered ring, or sends where a provider has none). Its
// face-side part needs no libfabric; the module that does the work,
// libslipstream-fabric.so (fabric/stream.h, fabric/msg.h), is loaded on first need
// (core/module_transport.h).
#pragma once

#include "core/transport_entries.h"

namespace slip::fabric {

// The shim's transport (core/transport.h): streams under TCP connections.
Transport* TheTransport() noexcept;
// The NCCL face's (core/msg_provider.h): message comms over the provider's domains.
msg::Provider* MessageProvider() noexcept;

}  // namespace slip::fabric
