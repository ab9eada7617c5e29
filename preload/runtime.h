// Process-wide state of the shim: the validated configuration and whether Slipstream is
// active in this process. Initialised once, on first use or by the library constructor,
// whichever comes first (other libraries' constructors may open sockets before ours runs).
#pragma once

#include "core/config.h"

namespace slip::preload {

struct Runtime {
  Config config;  // core's; each transport reads its own (preload/transports.h)
  bool enabled = false;
};

const Runtime& GetRuntime() noexcept;
inline bool Enabled() noexcept {
  return GetRuntime().enabled;
}

}  // namespace slip::preload
