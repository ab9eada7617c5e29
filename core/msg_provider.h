// The NCCL face's registry entry for a transport: what finds the transport's devices and
// hands the face their message comms (core/msg_comm.h). Each transport's public header
// (<name>/transport.h) declares its MessageProvider(); the build lists them
// (BuiltMessageProviders), and the face asks them in the user's order (SLIP_TRANSPORTS).
// The face names no transport.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

#include "core/config.h"
#include "core/log.h"
#include "core/module_loader.h"
#include "core/msg_comm.h"
#include "core/options.h"

namespace slip::msg {

// What the face hands each provider it asks.
struct FaceSetup {
  const Config* config = nullptr;  // the process's (read once; outlives every comm)
  LogLevel log_level = LogLevel::kWarn;
  LogSink log_sink = nullptr;       // the face's (NCCL's logger); null: stderr
  uint32_t connect_timeout_ms = 0;  // a connect or accept not complete by then fails
  // Flush receives into host memory too (SLIP_NCCL_FLUSH=1): the GPUDirect flush's path,
  // exercised where there is no GPU.
  bool flush_host_memory = false;
  int queue_pairs = 1;  // queue pairs per comm, where a transport has them (SLIP_NCCL_QPS)
};

class Provider {
 public:
  virtual ~Provider() = default;
  virtual TransportKind kind() const noexcept = 0;
  // Whether its comms reach other hosts. NCCL's network is for traffic between hosts: the
  // face takes the first such transport, in the user's order, that finds a device, and a
  // one-host transport (shm: ranks of one host made to look like several) only when none
  // does.
  virtual bool BetweenHosts() const noexcept = 0;
  // The transport's devices as message transports, at most `max` into `out` (they live as
  // long as the process). 0 with one line in `why` when there are none (`why` left empty
  // when the provider said why itself, at error level: a bad variable). Asked once.
  virtual int Find(const FaceSetup& setup, Transport** out, int max, char* why,
                   size_t why_len) noexcept = 0;

 protected:
  Provider() = default;
};

// Every message provider this build has, in the build's order (generated, like
// BuiltTransports, from the top-level CMakeLists.txt's SLIP_TRANSPORTS).
std::span<Provider* const> BuiltMessageProviders() noexcept;

// A provider whose comms live in a module the face loads on first need. Its options
// (Options, read by `parse` from the process's environment; the module keeps a pointer to
// them) and the module's setup (Setup: the fields every module's has, filled from the
// face's, then `complete` for the module's own). The module is opened while the
// application's signal handlers are kept (a provider library may install its own).
template <typename Options, typename Setup>
class ModuleProvider final : public Provider {
 public:
  using Complete = void (*)(const FaceSetup&, Setup*) noexcept;
  ModuleProvider(const ModuleNames& names, const options::Table<Options>& options,
                 Complete complete = nullptr) noexcept
      : names_(names), table_(options), complete_(complete) {}

  TransportKind kind() const noexcept override { return names_.kind; }
  bool BetweenHosts() const noexcept override { return true; }

  int Find(const FaceSetup& face, Transport** out, int max, char* why,
           size_t why_len) noexcept override {
    if (why_len > 0) why[0] = '\0';
    std::string error;
    if (!table_.Parse(ProcessEnv, nullptr, &options_, &error)) {
      SLIP_LOG(kError, "%s: no %s devices", error.c_str(), names_.name);
      return 0;
    }
    Setup setup;
    setup.options = &options_;
    setup.log_level = face.log_level;
    setup.log_sink = face.log_sink;
    setup.connect_timeout_ms = face.connect_timeout_ms;
    if (complete_ != nullptr) complete_(face, &setup);
    KeepSignalDispositions keep(names_.name);
    void* module = OpenModuleBeside(ModuleAnchor(), names_.library, why, why_len);
    if (module == nullptr) return 0;
    using Entry = int (*)(const Setup*, Transport**, int, char*, size_t);
    auto entry = reinterpret_cast<Entry>(dlsym(module, names_.message_entry));
    if (entry == nullptr) {
      snprintf(why, why_len, "the %s module has no message face", names_.name);
      return 0;
    }
    const int n = entry(&setup, out, max, why, why_len);
    return n > 0 ? n : 0;
  }

 private:
  const ModuleNames names_;
  const options::Table<Options>& table_;
  const Complete complete_;
  Options options_;
};

}  // namespace slip::msg
