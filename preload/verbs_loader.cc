#include "preload/verbs_loader.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "core/log.h"
#include "core/sys.h"
#include "preload/runtime.h"

namespace slip::preload {

namespace {

std::atomic<verbs::Module*> g_module{nullptr};

std::string ModulePath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&Verbs), &info) == 0 || !info.dli_fname) return {};
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  path = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  return path + "libslipstream-verbs.so";
}

verbs::Module* Load() noexcept {
  const Runtime& rt = GetRuntime();
  std::string path;
  try {
    path = ModulePath();
  } catch (...) {
    return nullptr;
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    SLIP_LOG(kInfo, "verbs transport unavailable: %s", dlerror());
    return nullptr;
  }
  using Entry = verbs::Module* (*)(const Config*, const verbs::Options*, int, char*, size_t);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "slip_verbs_module"));
  if (!entry) {
    SLIP_LOG(kWarn, "verbs transport unavailable: %s has no entry point", path.c_str());
    return nullptr;  // never dlclose: keep the loader simple and the state stable
  }
  char error[256] = "";
  verbs::Module* m = entry(&rt.config, &rt.verbs, sys::HiddenFdFloor(), error, sizeof(error));
  if (!m) SLIP_LOG(kInfo, "verbs transport unavailable: %s", error);
  return m;
}

}  // namespace

verbs::Module* Verbs() noexcept {
  static std::once_flag once;
  try {
    std::call_once(once, [] { g_module.store(Load(), std::memory_order_release); });
  } catch (...) {
    return nullptr;
  }
  return g_module.load(std::memory_order_acquire);
}

verbs::Module* VerbsIfLoaded() noexcept {
  return g_module.load(std::memory_order_acquire);
}

}  // namespace slip::preload
