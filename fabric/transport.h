// The fabric transport as core's Transport (core/transport.h), for the shim's registry.
//
// This part is linked into the face (it needs no libfabric): it reads the transport's
// options at start-up and loads the stream module (libslipstream-fabric.so, fabric/
// stream.h) from next to the face's own shared object the first time a connection or
// listener could use it. A missing library, missing libfabric or no provider that can
// serve means no fabric for this process: said once in the log, and connections take the
// other transports.
#pragma once

namespace slip {
class Transport;
}

namespace slip::fabric {

Transport* TheTransport() noexcept;
// The provider the process's fabric streams use, or null while none is loaded.
const char* LoadedProvider() noexcept;
// Whether the module was ever asked for (libfabric may be loaded, or loading, since).
bool ModuleInUse() noexcept;
// Whether `code` (a return address) lies in libfabric, one of its providers or this
// module: a face leaves the sockets such code makes and its waits alone.
bool IsLibfabricCaller(const void* code) noexcept;

}  // namespace slip::fabric
