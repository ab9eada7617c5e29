// The verbs transport as core's Transport (core/transport.h), for a face's registry.
//
// This part is linked into the face (it needs no rdma-core): it reads the transport's
// options at start-up and loads the module (libslipstream-verbs.so, verbs.h) from next to
// the face's own shared object the first time a connection or listener could use it. A
// missing library, missing rdma-core or no RDMA device means no verbs for this process:
// said once in the log, and connections take the other transports.
#pragma once

namespace slip {
class Transport;
}

namespace slip::verbs {

class Module;

Transport* TheTransport() noexcept;
// The module if it is already loaded (a face's fork and exit handlers must not load it).
Module* LoadedModule() noexcept;

}  // namespace slip::verbs
