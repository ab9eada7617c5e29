// Loads the verbs module (libslipstream-verbs.so) for a face: from the directory of the
// face's own shared object (build/lib, or the installed lib/), never from the library
// path, so that a face always loads the module it was built with.
#pragma once

namespace slip::verbs {

// dlopen()s the module beside the shared object that holds `anchor` (a function of the
// face). nullptr with a one-line reason in `error` (dlerror's) when it cannot.
void* OpenModule(const void* anchor, char* error, unsigned long error_len) noexcept;

}  // namespace slip::verbs
