// The verbs transport's public header: what a face may call. Everything else under verbs/
// is the transport's own.
//
// The transport is in two parts. Its face-side part, linked into each face, needs no
// rdma-core: it reads the transport's options at start-up and loads the module
// (libslipstream-verbs.so: verbs/verbs.h, verbs/msg.h) from next to the face's own shared
// object the first time a connection, a listener or an NCCL comm could use it. A missing
// library, a missing rdma-core or no RDMA device means no verbs for this process: said
// once in the log, and connections take the other transports.
#pragma once

namespace slip {
class Transport;
namespace msg {
class Provider;
}
}  // namespace slip

namespace slip::verbs {

// The shim's transport (core/transport.h): streams under TCP connections.
Transport* TheTransport() noexcept;
// The NCCL face's (core/msg_provider.h): message comms over RC queue pairs.
msg::Provider* MessageProvider() noexcept;

}  // namespace slip::verbs
