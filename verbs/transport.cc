// verbs as core's Transport: the client's offer is the rdma_cm exchange (resolve, then a
// REQ or a parked queue pair's CLAIM, answered before the SYN), the listener's twin its
// rdma_cm listener. What each step does and why is in verbs.h and docs/DESIGN.md
// ("Detection across hosts"); this file maps it onto the engine's steps and loads the
// module.
#include "verbs/transport.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "core/anchor_path.h"
#include "core/local_address.h"
#include "core/log.h"
#include "core/module_loader.h"
#include "core/no_destructor.h"
#include "core/offer_steps.h"
#include "core/sys.h"
#include "core/transport.h"
#include "verbs/options.h"
#include "verbs/verbs.h"

namespace slip::verbs {

namespace {

Module* Load(const Config* config, const Options* options) noexcept {
  char error[256] = "";
  void* handle = OpenModuleBeside(reinterpret_cast<const void*>(&TheTransport),
                                  "libslipstream-verbs.so", error, sizeof(error));
  if (!handle) {
    SLIP_LOG(kInfo, "verbs transport unavailable: %s", error);
    return nullptr;
  }
  using Entry = Module* (*)(const Config*, const Options*, int, OwnFdTable*, char*, size_t);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "slip_verbs_module"));
  if (!entry) {
    SLIP_LOG(kWarn, "verbs transport unavailable: libslipstream-verbs.so has no entry point");
    return nullptr;  // never dlclose: keep the loader simple and the state stable
  }
  Module* m = entry(config, options, sys::HiddenFdFloor(), OwnFds(), error, sizeof(error));
  if (!m) SLIP_LOG(kInfo, "verbs transport unavailable: %s", error);
  return m;
}

class VerbsClientOffer final : public ClientOffer {
 public:
  VerbsClientOffer(const ConnectRequest& req, Module* m, ClientConn* conn) noexcept
      : req_(req), m_(m), conn_(conn) {}
  ~VerbsClientOffer() override {
    if (conn_) m_->Abort(conn_);  // the listener drops its pending request
    CloseProxies(&proxy_a_, &proxy_b_);
  }

  Step Advance(int tcp, Reason* why) noexcept override {
    sockaddr_storage source{};
    switch (m_->Advance(conn_, &source, why)) {
      case Module::Step::kWaiting:
        return Step::kWaiting;
      case Module::Step::kResolved:
        *why = SendRequest(tcp, source);
        if (*why == Reason::kNone) return Step::kWaiting;  // for the listener's answer
        break;
      case Module::Step::kAccepted:
        return Step::kReady;
      case Module::Step::kFailed:
        break;
    }
    SLIP_LOG(kInfo, "fd %d: verbs not used (%s)", req_.fd, ReasonName(*why));
    return Step::kFailed;
  }
  int WaitFd() const noexcept override { return m_->EventFd(conn_); }
  uint64_t DeadlineMs() const noexcept override { return m_->Deadline(conn_); }
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
    // A listener that shares its port: the channel sends the CONFIRM once the accepting
    // process said TAKEN (it settles later, held until then).
    const bool later = m_->AwaitsTaken(conn_);
    if (!later) {
      if (!SendConfirm(tcp, nonce_, req_.config->ring_size, 1000)) return Outcome::kPlain;
      // CONFIRM is in the stream: from here a failure cannot go plain.
      out->confirmed = true;
    }
    int a = -1, b = -1;
    if (!Proxies(&a, &b)) return later ? Outcome::kPlain : Outcome::kReset;
    std::unique_ptr<Channel> channel = m_->Finish(conn_, proxy_b_);  // consumes conn_
    conn_ = nullptr;
    // (Held and unconfirmed, a channel that goes disconnects: its server goes plain too.)
    if (!channel) return later ? Outcome::kPlain : Outcome::kReset;
    out->stream = MakeStream(std::move(channel), &proxy_a_, &proxy_b_, *req_.config);
    if (out->stream) return Outcome::kCarried;
    return later ? Outcome::kPlain : Outcome::kReset;
  }

 private:
  // Resolved: the TCP socket bound to the route's source, then the request (REQ, or a
  // parked queue pair's CLAIM) for the now known 4-tuple.
  Reason SendRequest(int tcp, const sockaddr_storage& source) noexcept {
    wire::Endpoint client;
    if (!BindToSource(req_.family, tcp, source, &client)) return Reason::kUnsupported;
    nonce_ = sys::RandomNonce();
    SLIP_LOG(kDebug, "fd %d: verbs request from port %u", req_.fd, client.port);
    Reason why = Reason::kNone;
    if (!m_->StartHandshake(conn_, client, req_.server, nonce_, req_.config->ring_size, &why))
      return why;
    return Reason::kNone;
  }

  const ConnectRequest req_;
  Module* m_;
  ClientConn* conn_;
  uint64_t nonce_ = 0;
  int proxy_a_ = -1, proxy_b_ = -1;
};

class VerbsTwin final : public ListenerTwin {
 public:
  VerbsTwin(Module* m, Listener* l, uint64_t group_member, const Config* config) noexcept
      : m_(m), l_(l), group_member_(group_member), config_(config) {}
  ~VerbsTwin() override { m_->Unlisten(l_, group_member_); }

  ServerOfferPtr Take(const wire::Endpoint& client, const wire::Endpoint& server,
                      ServerOfferRoom* room) noexcept override {
    return PendingServerOffer<Module, Listener>::TakeFrom(m_, l_, client, server, config_, room);
  }
  void Drop(const wire::Endpoint& client, const wire::Endpoint& server) noexcept override {
    m_->DropPending(l_, client, server);
  }

 private:
  Module* m_;
  Listener* l_;
  uint64_t group_member_;  // the TCP listener's inode in its SO_REUSEPORT group, or 0
  const Config* config_;
};

class VerbsTransport final : public ModuleTransport<Module> {
 public:
  TransportKind kind() const noexcept override { return TransportKind::kVerbs; }

  bool ReadOptions(EnvLookup lookup, void* ctx, std::string* error) noexcept override {
    return ParseOptions(lookup, ctx, &options_, error);
  }
  std::span<const char* const> OptionNames() const noexcept override {
    return verbs::OptionNames();
  }

  std::unique_ptr<ClientOffer> Offer(const ConnectRequest& req, Reason* why) noexcept override {
    *why = Reason::kNoRdmaPath;
    if (IsLoopback(req.server)) return nullptr;  // rdma_cm has no loopback device
    wire::Endpoint bound;
    *why = Reason::kUnsupported;  // the application chose its port: keep out of its way
    if (LocalEndpoint(req.fd, &bound) && bound.port != 0) return nullptr;
    Module* m = Get(req.config);
    *why = Reason::kNoRdmaDevice;
    if (!m) return nullptr;
    // The negative cache answers here, before anything changes: a plain peer costs nothing.
    ClientConn* conn = m->StartResolve(req.dest(), why);
    if (!conn) return nullptr;
    std::unique_ptr<ClientOffer> offer(new (std::nothrow) VerbsClientOffer(req, m, conn));
    if (!offer) {
      m->Abort(conn);
      *why = Reason::kResources;
    }
    return offer;
  }

  std::unique_ptr<ListenerTwin> Listen(const ListenRequest& req, Reason* why) noexcept override {
    // SO_REUSEPORT: the group's sockets in one process share the port's rdma_cm listener,
    // which serves only the SYNs the kernel will hand them (docs/DESIGN.md "Servers that
    // share a port"); they are told apart by inode, as the kernel's lookup names them.
    uint64_t group_member = 0;
    if (req.reuseport) {
      struct stat st {};
      *why = Reason::kReusePort;
      if (fstat(req.fd, &st) != 0 || st.st_ino == 0) return nullptr;
      group_member = uint64_t(st.st_ino);
    }
    Module* m = Get(req.config);
    *why = Reason::kNoRdmaDevice;
    if (!m) return nullptr;
    Listener* l = m->Listen(req.local, group_member, why);
    if (!l) return nullptr;
    std::unique_ptr<ListenerTwin> twin(new (std::nothrow)
                                           VerbsTwin(m, l, group_member, req.config));
    if (!twin) {
      m->Unlisten(l, group_member);
      *why = Reason::kResources;
    }
    return twin;
  }

 private:
  // Loads the module on the first call; the configuration must outlive it.
  Module* Get(const Config* config) noexcept {
    return module_.Get([&] { return Load(config, &options_); });
  }

  Options options_;
};

VerbsTransport* Instance() noexcept {
  static NoDestructor<VerbsTransport> transport;  // connections may be made during exit
  return transport.get();
}

}  // namespace

Transport* TheTransport() noexcept {
  return Instance();
}

}  // namespace slip::verbs
