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
#include "core/proxy.h"
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
  using Entry = Module* (*)(const Config*, const Options*, int, char*, size_t);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "slip_verbs_module"));
  if (!entry) {
    SLIP_LOG(kWarn, "verbs transport unavailable: libslipstream-verbs.so has no entry point");
    return nullptr;  // never dlclose: keep the loader simple and the state stable
  }
  Module* m = entry(config, options, sys::HiddenFdFloor(), error, sizeof(error));
  if (!m) SLIP_LOG(kInfo, "verbs transport unavailable: %s", error);
  return m;
}

// Binds the TCP socket to the RDMA route's source address; *client is then its endpoint.
// An IPv6 socket reaching an IPv4 peer binds to the v4-mapped source.
bool BindToRdmaSource(int family, int fd, const sockaddr_storage& source,
                      wire::Endpoint* client) noexcept {
  sockaddr_storage bind_to = source;
  socklen_t bind_len = source.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (family == AF_INET6 && source.ss_family == AF_INET) {
    sockaddr_in6 mapped{};
    mapped.sin6_family = AF_INET6;
    mapped.sin6_addr.s6_addr[10] = mapped.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&mapped.sin6_addr.s6_addr[12],
                &reinterpret_cast<const sockaddr_in*>(&source)->sin_addr, 4);
    std::memcpy(&bind_to, &mapped, sizeof(mapped));
    bind_len = sizeof(mapped);
  }
  return sys::bind(fd, reinterpret_cast<sockaddr*>(&bind_to), bind_len) == 0 &&
         LocalEndpoint(fd, client);
}

// A proxy pair above the hidden-descriptor floor.
bool MakeProxies(int* a, int* b) noexcept {
  int pair[2];
  if (proxy::CreatePair(pair) != 0) return false;
  *a = sys::MoveHigh(pair[0], sys::HiddenFdFloor());
  *b = sys::MoveHigh(pair[1], sys::HiddenFdFloor());
  return true;
}

void CloseProxies(int* a, int* b) noexcept {
  if (*a >= 0) sys::close(*a);
  if (*b >= 0) sys::close(*b);
  *a = *b = -1;
}

std::unique_ptr<Stream> MakeStream(std::unique_ptr<Channel> channel, int* a, int* b,
                                   const Config& config) noexcept {
  StreamOptions options;
  options.spin_us = config.spin_us;
  std::unique_ptr<Stream> stream(new (std::nothrow) Stream(std::move(channel), *a, *b, options));
  if (stream) *a = *b = -1;  // the stream's
  return stream;
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
    if (!BindToRdmaSource(req_.family, tcp, source, &client)) return Reason::kUnsupported;
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

class VerbsServerOffer final : public ServerOffer {
 public:
  VerbsServerOffer(Module* m, Listener* l, const wire::Endpoint& client,
                   const wire::Endpoint& server, const Config* config) noexcept
      : m_(m), l_(l), client_(client), server_(server), config_(config) {}

  // The request's channel, held until its client's CONFIRM settles it (verbs/settle.cc):
  // accept() never waits, and nothing of ours is written to the connection.
  bool Open(Carrier* out, Reason* why) noexcept override {
    int a = -1, b = -1;
    *why = Reason::kResources;
    if (!MakeProxies(&a, &b)) return false;
    auto channel = m_->AcceptPending(l_, client_, server_, b, why, &committed_);
    if (channel) out->stream = MakeStream(std::move(channel), &a, &b, *config_);
    CloseProxies(&a, &b);
    return out->stream != nullptr;
  }
  // A client that sent its HELLO may be confirming now: plain would hand its CONFIRM to
  // the application as data.
  bool Abandon() noexcept override { return !committed_; }

 private:
  Module* m_;
  Listener* l_;
  wire::Endpoint client_, server_;
  const Config* config_;
  bool committed_ = false;
};

class VerbsTwin final : public ListenerTwin {
 public:
  VerbsTwin(Module* m, Listener* l, uint64_t group_member, const Config* config) noexcept
      : m_(m), l_(l), group_member_(group_member), config_(config) {}
  ~VerbsTwin() override { m_->Unlisten(l_, group_member_); }

  ServerOfferPtr Take(const wire::Endpoint& client, const wire::Endpoint& server,
                      ServerOfferRoom* room) noexcept override {
    static_assert(sizeof(VerbsServerOffer) <= sizeof(ServerOfferRoom) &&
                  alignof(VerbsServerOffer) <= alignof(ServerOfferRoom));
    if (!m_->HasPending(l_, client, server)) return nullptr;
    return ServerOfferPtr(new (room->bytes) VerbsServerOffer(m_, l_, client, server, config_));
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

class VerbsTransport final : public Transport {
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

  Module* Loaded() const noexcept { return module_.load(std::memory_order_acquire); }

 private:
  // Loads the module on the first call (thread-safe); the configuration must outlive it.
  Module* Get(const Config* config) noexcept {
    try {
      std::call_once(once_, [this, config] {
        module_.store(Load(config, &options_), std::memory_order_release);
      });
    } catch (...) {
      return nullptr;
    }
    return Loaded();
  }

  Options options_;
  std::once_flag once_;
  std::atomic<Module*> module_{nullptr};
};

VerbsTransport* Instance() noexcept {
  static NoDestructor<VerbsTransport> transport;  // connections may be made during exit
  return transport.get();
}

}  // namespace

Transport* TheTransport() noexcept {
  return Instance();
}

Module* LoadedModule() noexcept {
  return Instance()->Loaded();
}

}  // namespace slip::verbs
