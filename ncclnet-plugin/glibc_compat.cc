// The plugin carries its C++ runtime (libstdc++ linked statically: it must load into
// whatever NCCL and PyTorch the host has), and GCC 12's libstdc++.a refers to glibc 2.36's
// arc4random for std::random_device, which Slipstream never uses. That one reference would
// keep the plugin from loading on glibc 2.34/2.35 hosts (Ubuntu 22.04, RHEL 9), so the
// plugin resolves it to this local definition (the version script keeps it unexported).
#include <sys/random.h>

#include <cstdint>

extern "C" uint32_t arc4random(void) noexcept {
  uint32_t value = 0;
  while (getrandom(&value, sizeof(value), 0) != sizeof(value)) {
  }
  return value;
}
