// Loads a transport's module (libslipstream-verbs.so, libslipstream-fabric.so) for a face:
// from the directory of the face's own shared object (build/lib, or the installed lib/),
// never from the library path, so that a face always loads the modules it was built with.
// A module is its own shared object so that a face never depends on the transport's
// system libraries (rdma-core, libfabric): a host without them runs the face plain.
#pragma once

namespace slip {

// dlopen()s `library` (a file name) beside the shared object that holds `anchor` (a
// function of the face). nullptr with a one-line reason in `error` (dlerror's) when it
// cannot. Modules are never closed: their state lives as long as the process.
void* OpenModuleBeside(const void* anchor, const char* library, char* error,
                       unsigned long error_len) noexcept;

}  // namespace slip
