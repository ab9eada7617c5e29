// Loads a transport's module (libslipstream-verbs.so, libslipstream-fabric.so) for a face:
// from the directory of the face's own shared object (build/lib, or the installed lib/),
// never from the library path, so that a face always loads the modules it was built with.
// A module is its own shared object so that a face never depends on the transport's
// system libraries (rdma-core, libfabric): a host without them runs the face plain.
#pragma once

#include <signal.h>

#include <atomic>
#include <mutex>

#include "core/config.h"

namespace slip {

// What names a transport's module, for both faces: the library a face opens beside its own
// shared object, and the module's entry point for each face.
struct ModuleNames {
  TransportKind kind;
  const char* name;     // "verbs"
  const char* library;  // "libslipstream-verbs.so"
  // The shim's: Module* (const Config*, const Options*, int hidden_fd_floor, OwnFdTable*,
  // char* error, size_t error_len) (core/module_transport.h).
  const char* stream_entry;
  // The NCCL face's: int (const Setup*, msg::Transport**, int max, char* error, size_t
  // error_len) (core/msg_provider.h).
  const char* message_entry;
};

// A function of the face's own shared object (core is linked into it): modules are loaded
// beside it.
const void* ModuleAnchor() noexcept;

// dlopen()s `library` (a file name) beside the shared object that holds `anchor` (a
// function of the face). nullptr with a one-line reason in `error` (dlerror's) when it
// cannot. Modules are never closed: their state lives as long as the process.
void* OpenModuleBeside(const void* anchor, const char* library, char* error,
                       unsigned long error_len) noexcept;

// The application's signal handlers, kept while a module loads and starts, or opens what
// its libraries install handlers for (PSM's exit(1) on SIGINT and SIGTERM through libfabric
// at its load, shm's unlink-and-reraise at its first endpoint), and put back when this goes
// out of scope, with a debug line naming each signal a library changed. The application's
// signals stay its own.
class KeepSignalDispositions {
 public:
  explicit KeepSignalDispositions(const char* module) noexcept;
  ~KeepSignalDispositions();
  KeepSignalDispositions(const KeepSignalDispositions&) = delete;
  KeepSignalDispositions& operator=(const KeepSignalDispositions&) = delete;

 private:
  static constexpr int kSignals = 32;  // (real-time signals are nobody's but the application's)
  const char* module_;
  struct sigaction actions_[kSignals] = {};
  bool saved_[kSignals] = {};
};

// A face's handle on one module, loaded by the first caller that needs it (thread-safe)
// and never again, whatever came of it.
template <typename Module>
class LoadedOnce {
 public:
  // The module, loaded with `load()` (a Module*, null when it cannot) on the first call.
  template <typename Load>
  Module* Get(Load&& load) noexcept {
    try {
      std::call_once(once_, [&] { module_.store(load(), std::memory_order_release); });
    } catch (...) {
      return nullptr;
    }
    return Loaded();
  }
  // The module if it is already loaded (fork and exit handlers must not load it).
  Module* Loaded() const noexcept { return module_.load(std::memory_order_acquire); }

 private:
  std::once_flag once_;
  std::atomic<Module*> module_{nullptr};
};

}  // namespace slip
