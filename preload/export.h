// Marks an interposed libc entry point: C linkage, exported (the library is otherwise
// built with hidden visibility and a version script).
#pragma once

#include <cerrno>

#define SLIP_EXPORT extern "C" __attribute__((visibility("default")))

namespace slip::preload {

// Converts an internal result (bytes, or -errno) to the libc convention.
inline long ToLibc(long rc) noexcept {
  if (rc >= 0) return rc;
  errno = int(-rc);
  return -1;
}

}  // namespace slip::preload
