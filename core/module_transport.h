// A transport whose work is done by a module its faces load on first need (verbs, fabric):
// the shim's Transport over the module's steps (core/ring_module.h). It reads the
// transport's options at start-up, loads the module the first time a connection or a
// listener could use it (never for fork or exit), and makes the client's offer; the
// transport adds its listeners' twins and what only it knows.
//
// A missing library, a missing system library of the module or no usable device means no
// such transport for this process: said once in the log (at warn for a transport the user
// named, which the default list does not hold), and connections take the other transports.
#pragma once

#include <dlfcn.h>

#include <memory>
#include <new>
#include <span>
#include <string>

#include "core/config.h"
#include "core/local_address.h"
#include "core/log.h"
#include "core/module_loader.h"
#include "core/offer_steps.h"
#include "core/options.h"
#include "core/own_fds.h"
#include "core/sys.h"
#include "core/transport.h"

namespace slip {

template <typename Module, typename Options>
class ModuleTransport : public Transport {
 public:
  TransportKind kind() const noexcept override { return names_.kind; }
  bool ReadOptions(EnvLookup lookup, void* ctx, std::string* error) noexcept override {
    return table_.Parse(lookup, ctx, &options_, error);
  }
  std::span<const char* const> OptionNames() const noexcept override { return table_.names(); }

  // A client's offer where the application left the port to the kernel (one it chose is
  // kept out of the way): the module's Start, then its steps (RingClientOffer).
  std::unique_ptr<ClientOffer> Offer(const ConnectRequest& req, Reason* why) noexcept override {
    wire::Endpoint bound;
    *why = Reason::kUnsupported;
    if (LocalEndpoint(req.fd, &bound) && bound.port != 0) return nullptr;
    Module* m = Get(req.config);
    *why = Reason::kNoRdmaDevice;
    if (!m) return nullptr;
    // The negative cache answers here, before anything changes: a plain peer costs nothing.
    sockaddr_storage source{};
    auto* client = m->Start(req.dest(), &source, why);
    if (!client) return nullptr;
    std::unique_ptr<ClientOffer> offer(
        new (std::nothrow) RingClientOffer<Module>(req, m, client, source, names_.name));
    if (!offer) {
      m->Abort(client);
      *why = Reason::kResources;
    }
    return offer;
  }

  void ForkPrepare() noexcept override {
    if (Module* m = Loaded()) m->ForkPrepare();
  }
  void ForkParent() noexcept override {
    if (Module* m = Loaded()) m->ForkParent();
  }
  void ForkChild() noexcept override {
    if (Module* m = Loaded()) m->ForkChild();
  }
  void Flush(int timeout_ms) noexcept override {
    if (Module* m = Loaded()) m->FlushAll(timeout_ms);
  }
  Module* Loaded() const noexcept { return module_.Loaded(); }

 protected:
  ModuleTransport(const ModuleNames& names, const options::Table<Options>& table) noexcept
      : names_(names), table_(table) {}

  // The module, loaded on the first call; the configuration must outlive it.
  Module* Get(const Config* config) noexcept {
    return module_.Get([&] {
      BeforeLoad();
      Module* m = Load(config);
      AfterLoad();
      return m;
    });
  }
  // Around the load, once: what the transport must know of the libraries it brings.
  virtual void BeforeLoad() noexcept {}
  virtual void AfterLoad() noexcept {}

 private:
  Module* Load(const Config* config) noexcept {
    const LogLevel missing = IsDefault() ? LogLevel::kInfo : LogLevel::kWarn;
    KeepSignalDispositions keep(names_.name);
    char error[256] = "";
    void* handle = OpenModuleBeside(ModuleAnchor(), names_.library, error, sizeof(error));
    if (!handle) {
      SLIP_LOG(kInfo, "%s transport unavailable: %s", names_.name, error);
      return nullptr;
    }
    using Entry = Module* (*)(const Config*, const Options*, int, OwnFdTable*, char*, size_t);
    auto entry = reinterpret_cast<Entry>(dlsym(handle, names_.stream_entry));
    if (!entry) {
      SLIP_LOG(kWarn, "%s transport unavailable: %s has no entry point", names_.name,
               names_.library);
      return nullptr;  // never dlclose: keep the loader simple and the state stable
    }
    Module* m = entry(config, &options_, sys::HiddenFdFloor(), OwnFds(), error, sizeof(error));
    if (!m) SLIP_LOG_AT(missing, "%s transport unavailable: %s", names_.name, error);
    return m;
  }
  // Whether the default SLIP_TRANSPORTS holds this transport (its absence is no news).
  bool IsDefault() const noexcept {
    for (TransportKind k : Config{}.transports)
      if (k == names_.kind) return true;
    return false;
  }

  const ModuleNames& names_;
  const options::Table<Options>& table_;
  Options options_;
  LoadedOnce<Module> module_;
};

}  // namespace slip
