// Finds the verbs transport (libslipstream-verbs.so, next to libslipstream.so) on first
// need. A missing library, missing rdma-core or no RDMA device means no verbs for this
// process: said once in the log, and connections take the other transports.
#pragma once

#include "verbs/verbs.h"

namespace slip::preload {

// The module, or nullptr. Loads it on the first call (thread-safe).
verbs::Module* Verbs() noexcept;
// The module if it is already loaded (fork and exit handlers must not load it).
verbs::Module* VerbsIfLoaded() noexcept;

}  // namespace slip::preload
