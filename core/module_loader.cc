#include "core/module_loader.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstring>

#include "core/log.h"
#include "core/own_fds.h"

namespace slip {

const void* ModuleAnchor() noexcept {
  return reinterpret_cast<const void*>(&ModuleAnchor);
}

void* OpenModuleBeside(const void* anchor, const char* library, char* error,
                       unsigned long error_len) noexcept {
  Dl_info info{};
  if (dladdr(anchor, &info) == 0 || !info.dli_fname) {
    snprintf(error, error_len, "cannot tell where this library was loaded from");
    return nullptr;
  }
  char path[4096];
  const char* slash = strrchr(info.dli_fname, '/');
  const size_t dir = slash ? size_t(slash - info.dli_fname + 1) : 0;
  const size_t name = strlen(library) + 1;
  if (dir + name > sizeof(path)) {
    snprintf(error, error_len, "the library's path is too long");
    return nullptr;
  }
  std::memcpy(path, info.dli_fname, dir);
  std::memcpy(path + dir, library, name);
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    snprintf(error, error_len, "%s", dlerror());
    return nullptr;
  }
  // The module's calls to names the face interposes are about its own descriptors.
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map) NoteOwnCode(map->l_ld);
  return handle;
}

KeepSignalDispositions::KeepSignalDispositions(const char* module) noexcept : module_(module) {
  for (int sig = 1; sig < kSignals; ++sig)
    saved_[sig] = sigaction(sig, nullptr, &actions_[sig]) == 0;
}

KeepSignalDispositions::~KeepSignalDispositions() {
  for (int sig = 1; sig < kSignals; ++sig) {
    struct sigaction now {};
    if (!saved_[sig] || sigaction(sig, nullptr, &now) != 0) continue;
    if (now.sa_handler == actions_[sig].sa_handler && now.sa_flags == actions_[sig].sa_flags)
      continue;
    SLIP_LOG(kDebug,
             "%s: its libraries changed the handler of signal %d; the application's is back",
             module_, sig);
    sigaction(sig, &actions_[sig], nullptr);
  }
}

}  // namespace slip
