// The fabric transport as core's Transport (core/transport.h), for the shim's registry.
//
// This part is linked into the face (it needs no libfabric): it reads the transport's
// options at start-up and loads the stream module (libslipstream-fabric.so, fabric/
// stream.h) from next to the face's own shared object the first time a connection or
// listener could use it. A missing library, missing libfabric or no provider that can
// serve means no fabric for this process: said once in the log, and connections take the
// other transports.
#pragma once

#include <cstring>

namespace slip {
class Transport;
}

namespace slip::fabric {

// Whether a loaded object's path is libfabric.so.1, a provider it loads from its libfabric/
// directory, or this transport's own module: code the face never takes for the
// application's (IsTransportLibraryCaller). The module's progress thread is no application
// thread: the face's waits once took it for one (they armed every stream and spun first:
// a hung iperf3, a spurious edge-triggered EPOLLIN; docs/COMPATIBILITY.md).
inline bool IsTransportLibraryPath(const char* path) noexcept {
  return strstr(path, "libfabric") != nullptr || strstr(path, "libslipstream-fabric") != nullptr;
}

Transport* TheTransport() noexcept;
// The provider the process's fabric streams use, or null while none is loaded.
const char* LoadedProvider() noexcept;
// Whether the module was ever asked for (libfabric may be loaded, or loading, since).
bool ModuleInUse() noexcept;
// Whether `code` (a return address) lies in libfabric, one of its providers or this
// module: a face leaves the sockets such code makes and its waits alone.
bool IsTransportLibraryCaller(const void* code) noexcept;
// Transport-library code accepted `conn` on `listening` (the face hid it already): the
// stream module bounds and times the sockets of its connection listener. Returns `conn`.
int ProviderAccepted(int listening, int conn) noexcept;

}  // namespace slip::fabric
