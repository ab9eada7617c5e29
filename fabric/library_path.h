// Which loaded objects are the fabric transport's own code (internal to fabric/).
#pragma once

#include <cstring>

namespace slip::fabric {

// Whether a loaded object's path is libfabric.so.1, a provider it loads from its libfabric/
// directory, or this transport's own module: code the face never takes for the
// application's (Transport::IsLibraryCaller). The module's progress thread is no
// application thread: a face that took its waits for the application's would arm every
// stream and spin first (docs/COMPATIBILITY.md).
inline bool IsTransportLibraryPath(const char* path) noexcept {
  return strstr(path, "libfabric") != nullptr || strstr(path, "libslipstream-fabric") != nullptr;
}

}  // namespace slip::fabric
