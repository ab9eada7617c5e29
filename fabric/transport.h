// The fabric transport's public header: what a face may call. Everything else under
// fabric/ is the transport's own.
//
// The transport is in two parts. Its face-side part, linked into each face, needs no
// libfabric: it reads the transport's options at start-up and loads the module
// (libslipstream-fabric.so: fabric/stream.h, fabric/msg.h) from next to the face's own
// shared object the first time a connection, a listener or an NCCL comm could use it. A
// missing library, a missing libfabric or no provider that can serve means no fabric for
// this process: said once in the log, and connections take the other transports.
#pragma once

namespace slip {
class Transport;
namespace msg {
class Provider;
}
}  // namespace slip

namespace slip::fabric {

// The shim's transport (core/transport.h): streams under TCP connections.
Transport* TheTransport() noexcept;
// The NCCL face's (core/msg_provider.h): message comms over the provider's domains.
msg::Provider* MessageProvider() noexcept;

}  // namespace slip::fabric
