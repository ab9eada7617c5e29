// fabric as core's Transport: the client's offer is the UDP rendezvous (a REQ answered
// before the SYN), the listener's twin its UDP socket. What each step does and why is in
// fabric/stream.h and docs/DESIGN.md ("Detection across hosts (fabric)"); this file maps it
// onto the engine's steps and loads the module.
#include "fabric/transport.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>

#include "core/anchor_path.h"
#include "core/local_address.h"
#include "core/log.h"
#include "core/module_loader.h"
#include "core/no_destructor.h"
#include "core/offer_steps.h"
#include "core/sys.h"
#include "core/transport.h"
#include "fabric/library_path.h"
#include "fabric/options.h"
#include "fabric/stream.h"

namespace slip::fabric {

namespace {

// Where libfabric's code and this transport's module lie once loaded
// (IsTransportLibraryPath), so that a face can tell their calls apart with a few
// comparisons (libfabric's epoll_wait and poll run on every progress call).
struct TransportCode {
  struct Range {
    uintptr_t lo, hi;
  };
  static constexpr int kMax = 16;
  Range ranges[kMax] = {};
  std::atomic<int> count{-1};  // -1: not known yet
};
TransportCode g_code;
// Whether the module was ever asked for: the one load that the application's interposed
// calls pay before libc's (a global, not a member behind a static's guard).
std::atomic<bool> g_in_use{false};

void NoteTransportCode() noexcept {
  struct Found {
    int count = 0;
    int dropped = 0;  // code segments past kMax
  } found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) -> int {
        auto* f = static_cast<Found*>(arg);
        if (!info->dlpi_name || !IsTransportLibraryPath(info->dlpi_name)) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          if (f->count == TransportCode::kMax) {
            ++f->dropped;
            continue;
          }
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          g_code.ranges[f->count++] = {lo, lo + ph.p_memsz};
        }
        return 0;
      },
      &found);
  g_code.count.store(found.count, std::memory_order_release);
  // Calls from the code left out would be taken for the application's (the re-entry the
  // check exists to prevent): said, so that a host with that many provider libraries
  // shows why.
  if (found.dropped > 0)
    SLIP_LOG(kWarn,
             "fabric: %d code segments of libfabric, its providers or the stream module beyond the "
             "%d this face tells apart; their calls may be taken for the application's",
             found.dropped, TransportCode::kMax);
}

// Whether `code` lies in libfabric, one of its providers or the module.
bool IsTransportCode(const void* code) noexcept {
  const int n = g_code.count.load(std::memory_order_acquire);
  if (n < 0) {
    // Still loading (libfabric and its providers are being opened): asked by name.
    Dl_info info{};
    return dladdr(code, &info) != 0 && info.dli_fname && IsTransportLibraryPath(info.dli_fname);
  }
  const auto pc = uintptr_t(code);
  for (int i = 0; i < n; ++i)
    if (pc >= g_code.ranges[i].lo && pc < g_code.ranges[i].hi) return true;
  return false;
}

StreamModule* Load(const Config* config, const Options* options) noexcept {
  KeepSignalDispositions keep("fabric");
  char error[256] = "";
  void* handle = OpenModuleBeside(reinterpret_cast<const void*>(&TheTransport),
                                  "libslipstream-fabric.so", error, sizeof(error));
  if (!handle) {
    SLIP_LOG(kInfo, "fabric transport unavailable: %s", error);
    return nullptr;
  }
  using Entry = StreamModule* (*)(const Config*, const Options*, int, OwnFdTable*, char*, size_t);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "slip_fabric_stream_module"));
  if (!entry) {
    SLIP_LOG(kWarn, "fabric transport unavailable: libslipstream-fabric.so has no entry point");
    return nullptr;
  }
  StreamModule* m = entry(config, options, sys::HiddenFdFloor(), OwnFds(), error, sizeof(error));
  if (!m) SLIP_LOG(kWarn, "fabric transport unavailable: %s", error);
  return m;
}

class FabricClientOffer final : public ClientOffer {
 public:
  FabricClientOffer(const ConnectRequest& req, StreamModule* m, StreamClient* client,
                    const sockaddr_storage& source) noexcept
      : req_(req), m_(m), client_(client), source_(source) {}
  ~FabricClientOffer() override {
    if (client_) m_->Abort(client_);  // (the listener's pending request expires)
    CloseProxies(&proxy_a_, &proxy_b_);
  }

  Step Advance(int tcp, Reason* why) noexcept override {
    if (!requested_) {
      // The 4-tuple, then the REQ that names it.
      wire::Endpoint client;
      *why = Reason::kUnsupported;
      if (!BindToSource(req_.family, tcp, source_, &client)) return Failed(*why);
      nonce_ = sys::RandomNonce();
      if (!m_->Request(client_, client, req_.server, nonce_, req_.config->ring_size, why))
        return Failed(*why);
      requested_ = true;
    }
    switch (m_->Advance(client_, why)) {
      case StreamModule::Step::kWaiting:
        return Step::kWaiting;
      case StreamModule::Step::kAccepted:
        return Step::kReady;
      case StreamModule::Step::kFailed:
        break;
    }
    return Failed(*why);
  }
  int WaitFd() const noexcept override { return m_->EventFd(client_); }
  uint64_t DeadlineMs() const noexcept override { return m_->Deadline(client_); }
  int TcpHandshakeBudgetMs() const noexcept override {
    return int(req_.config->handshake_timeout_ms);
  }
  bool Proxies(int* proxy_a, int* proxy_b) noexcept override {
    if (proxy_a_ < 0 && !MakeProxies(&proxy_a_, &proxy_b_)) return false;
    *proxy_a = proxy_a_;
    *proxy_b = proxy_b_;
    return true;
  }
  Outcome Establish(int tcp, Carrier* out, Reason* why) noexcept override {
    *why = Reason::kResources;
    if (!SendConfirm(tcp, nonce_, req_.config->ring_size, 1000)) return Outcome::kPlain;
    out->confirmed = true;  // from here a failure cannot go plain
    int a = -1, b = -1;
    if (!Proxies(&a, &b)) return Outcome::kReset;
    std::unique_ptr<Channel> channel = m_->Finish(client_, proxy_b_);  // consumes client_
    client_ = nullptr;
    if (!channel) return Outcome::kReset;
    out->stream = MakeStream(std::move(channel), &proxy_a_, &proxy_b_, *req_.config);
    return out->stream ? Outcome::kCarried : Outcome::kReset;
  }

 private:
  Step Failed(Reason why) const noexcept {
    SLIP_LOG(kInfo, "fd %d: fabric not used (%s)", req_.fd, ReasonName(why));
    return Step::kFailed;
  }

  const ConnectRequest req_;
  StreamModule* m_;
  StreamClient* client_;
  const sockaddr_storage source_;
  bool requested_ = false;
  uint64_t nonce_ = 0;
  int proxy_a_ = -1, proxy_b_ = -1;
};

class FabricTwin final : public ListenerTwin {
 public:
  FabricTwin(StreamModule* m, StreamListener* l, const Config* config) noexcept
      : m_(m), l_(l), config_(config) {}
  ~FabricTwin() override { m_->Unlisten(l_); }
  ServerOfferPtr Take(const wire::Endpoint& client, const wire::Endpoint& server,
                      ServerOfferRoom* room) noexcept override {
    return PendingServerOffer<StreamModule, StreamListener>::TakeFrom(m_, l_, client, server,
                                                                      config_, room);
  }
  void Drop(const wire::Endpoint& client, const wire::Endpoint& server) noexcept override {
    m_->DropPending(l_, client, server);
  }
  Reason Refused(const wire::Endpoint& client, const wire::Endpoint& server) noexcept override {
    return m_->Refused(l_, client, server);
  }
  // (No ServiceFd: REQs are answered by the module's progress thread alone. A client sends
  // its SYN only once it has our REP, so accept() finds its request kept already and
  // never reads the socket, where a flood would run on the application's thread.)
  void SharedByProcesses() noexcept override { m_->Share(l_); }
  void BeforeFork() noexcept override { m_->Share(l_); }

 private:
  StreamModule* m_;
  StreamListener* l_;
  const Config* config_;
};

class FabricTransport final : public ModuleTransport<StreamModule> {
 public:
  void BeforeExec() noexcept override {
    if (StreamModule* m = Loaded()) m->BeforeExec();
  }
  TransportKind kind() const noexcept override { return TransportKind::kFabric; }
  bool ReadOptions(EnvLookup lookup, void* ctx, std::string* error) noexcept override {
    return ParseOptions(lookup, ctx, &options_, error);
  }
  std::span<const char* const> OptionNames() const noexcept override {
    return fabric::OptionNames();
  }

  LibraryCheck IsLibraryCaller() const noexcept override {
    return [](const void* code) noexcept {
      return g_in_use.load(std::memory_order_acquire) && IsTransportCode(code);
    };
  }
  void LibraryAccepted(int listening, int conn) noexcept override {
    if (StreamModule* m = Loaded()) m->ProviderAccepted(listening, conn);
  }

  std::unique_ptr<ClientOffer> Offer(const ConnectRequest& req, Reason* why) noexcept override {
    wire::Endpoint bound;
    *why = Reason::kUnsupported;  // the application chose its port: keep out of its way
    if (LocalEndpoint(req.fd, &bound) && bound.port != 0) return nullptr;
    StreamModule* m = Get(req.config);
    *why = Reason::kNoRdmaDevice;
    if (!m) return nullptr;
    // The negative cache answers here, before anything changes: a plain peer costs nothing.
    sockaddr_storage source{};
    StreamClient* client = m->Start(req.dest(), &source, why);
    if (!client) return nullptr;
    std::unique_ptr<ClientOffer> offer(new (std::nothrow)
                                           FabricClientOffer(req, m, client, source));
    if (!offer) {
      m->Abort(client);
      *why = Reason::kResources;
    }
    return offer;
  }

  std::unique_ptr<ListenerTwin> Listen(const ListenRequest& req, Reason* why) noexcept override {
    // SO_REUSEPORT: the kernel hands each SYN to one of the group's sockets, which a REQ
    // cannot know in advance (verbs' groups are not built for fabric): plain.
    *why = Reason::kReusePort;
    if (req.reuseport) return nullptr;
    StreamModule* m = Get(req.config);
    *why = Reason::kNoRdmaDevice;
    if (!m) return nullptr;
    StreamListener* l = m->Listen(req.local, req.v6only, why);
    if (!l) return nullptr;
    std::unique_ptr<ListenerTwin> twin(new (std::nothrow) FabricTwin(m, l, req.config));
    if (!twin) {
      m->Unlisten(l);
      *why = Reason::kResources;
    }
    return twin;
  }

 private:
  // Loads the module on the first call; the configuration must outlive it. libfabric's
  // code is known from then on (its own sockets and waits go to libc).
  StreamModule* Get(const Config* config) noexcept {
    g_in_use.store(true, std::memory_order_release);
    return module_.Get([&] {
      StreamModule* m = Load(config, &options_);
      NoteTransportCode();
      return m;
    });
  }

  Options options_;
};

FabricTransport* Instance() noexcept {
  static NoDestructor<FabricTransport> transport;  // connections may be made during exit
  return transport.get();
}

}  // namespace

Transport* TheTransport() noexcept {
  return Instance();
}

}  // namespace slip::fabric
