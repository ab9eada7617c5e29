// The offers of transports whose streams cross hosts on the peer's ring (verbs, fabric),
// made from their module's steps (core/ring_module.h): the client's, from its request to
// its stream; a listener's twin; and the server's offer of a request that the module keeps
// pending under its 4-tuple. With the steps they share: a client's TCP socket bound to the
// source its transport's route uses, the proxy pair of a stream being made, the stream
// over a transport's channel.
#pragma once

#include <sys/socket.h>

#include <memory>

#include "core/anchor_path.h"
#include "core/channel.h"
#include "core/config.h"
#include "core/log.h"
#include "core/stream.h"
#include "core/sys.h"
#include "core/transport.h"
#include "core/wire.h"

namespace slip {

// Binds the TCP socket `fd` (of `family`) to `source` (port 0); *client is then its
// endpoint. An IPv6 socket reaching an IPv4 peer binds to the v4-mapped source.
bool BindToSource(int family, int fd, const sockaddr_storage& source,
                  wire::Endpoint* client) noexcept;
// A proxy pair above the hidden-descriptor floor; CloseProxies closes what is left (-1s).
bool MakeProxies(int* a, int* b) noexcept;
void CloseProxies(int* a, int* b) noexcept;
// The stream over `channel` and the proxy pair (which it owns from then on: *a and *b
// become -1). nullptr when none could be made (the pair stays the caller's).
std::unique_ptr<Stream> MakeStream(std::unique_ptr<Channel> channel, int* a, int* b,
                                   const Config& config) noexcept;

// What a client offered for one accepted connection, where a transport's module keeps
// requests pending under their 4-tuple (verbs' rdma_cm listener, fabric's UDP twin):
// Module::AcceptPending(listener, client, server, proxy_b, why, committed) gives the
// request's channel *held* until its client's CONFIRM settles it, so accept() never waits
// and nothing of ours is written to the connection.
template <typename Module, typename Listener>
class PendingServerOffer final : public ServerOffer {
 public:
  PendingServerOffer(Module* m, Listener* l, const wire::Endpoint& client,
                     const wire::Endpoint& server, const Config* config) noexcept
      : m_(m), l_(l), client_(client), server_(server), config_(config) {}
  bool Open(Carrier* out, Reason* why) noexcept override {
    int a = -1, b = -1;
    *why = Reason::kResources;
    if (!MakeProxies(&a, &b)) return false;
    auto channel = m_->AcceptPending(l_, client_, server_, b, why, &committed_);
    if (channel) out->stream = MakeStream(std::move(channel), &a, &b, *config_);
    CloseProxies(&a, &b);
    return out->stream != nullptr;
  }
  // A client that had the module's answer may be confirming now: plain would hand its
  // CONFIRM to the application as data.
  bool Abandon() noexcept override { return !committed_; }

  // The offer for `client` -> `server` if the module holds a request for it, built in
  // `room`; null when it holds none.
  static ServerOfferPtr TakeFrom(Module* m, Listener* l, const wire::Endpoint& client,
                                 const wire::Endpoint& server, const Config* config,
                                 ServerOfferRoom* room) noexcept {
    static_assert(sizeof(PendingServerOffer) <= sizeof(ServerOfferRoom) &&
                  alignof(PendingServerOffer) <= alignof(ServerOfferRoom));
    if (!m->HasPending(l, client, server)) return nullptr;
    return ServerOfferPtr(new (room->bytes) PendingServerOffer(m, l, client, server, config));
  }

 private:
  Module* m_;
  Listener* l_;
  wire::Endpoint client_, server_;
  const Config* config_;
  bool committed_ = false;
};

// A listener's twin: what a client offered there is the module's pending request. The
// transport's own twin derives from it (and lets the listener go).
template <typename Module>
class RingTwin : public ListenerTwin {
 public:
  using Listener = typename Module::ListenerType;
  ServerOfferPtr Take(const wire::Endpoint& client, const wire::Endpoint& server,
                      ServerOfferRoom* room) noexcept override {
    return PendingServerOffer<Module, Listener>::TakeFrom(m_, l_, client, server, config_, room);
  }
  void Drop(const wire::Endpoint& client, const wire::Endpoint& server) noexcept override {
    m_->DropPending(l_, client, server);
  }
  Reason Refused(const wire::Endpoint& client, const wire::Endpoint& server) noexcept override {
    return m_->Refused(l_, client, server);
  }

 protected:
  RingTwin(Module* m, Listener* l, const Config* config) noexcept : m_(m), l_(l), config_(config) {}

  Module* const m_;
  Listener* const l_;
  const Config* const config_;
};

// A client's offer: the module's steps (Start made `client`; `source` is known already, or
// Advance resolves it), then the stream once the TCP connection is up. `name` names the
// transport in log lines.
template <typename Module>
class RingClientOffer final : public ClientOffer {
 public:
  using Client = typename Module::ClientType;
  RingClientOffer(const ConnectRequest& req, Module* m, Client* client,
                  const sockaddr_storage& source, const char* name) noexcept
      : req_(req), m_(m), client_(client), source_(source), name_(name) {}
  ~RingClientOffer() override {
    if (client_) m_->Abort(client_);  // the listener drops its pending request
    CloseProxies(&proxy_a_, &proxy_b_);
  }

  Step Advance(int tcp, Reason* why) noexcept override {
    if (!requested_ && source_.ss_family != AF_UNSPEC && !Request(tcp, why)) return Failed(*why);
    sockaddr_storage resolved{};
    switch (m_->Advance(client_, &resolved, why)) {
      case Module::Step::kWaiting:
        return Step::kWaiting;
      case Module::Step::kResolved:
        source_ = resolved;
        if (!Request(tcp, why)) break;
        return Step::kWaiting;  // for the listener's answer
      case Module::Step::kAccepted:
        return Step::kReady;
      case Module::Step::kFailed:
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
    // A listener whose process may not take the SYN: the channel sends the CONFIRM once
    // the accepting process said TAKEN (it settles later, held until then).
    const bool later = m_->AwaitsTaken(client_);
    if (!later) {
      if (!SendConfirm(tcp, nonce_, req_.config->ring_size, 1000)) return Outcome::kPlain;
      out->confirmed = true;  // CONFIRM is in the stream: from here a failure cannot go plain
    }
    const Outcome failed = later ? Outcome::kPlain : Outcome::kReset;
    int a = -1, b = -1;
    if (!Proxies(&a, &b)) return failed;
    std::unique_ptr<Channel> channel = m_->Finish(client_, proxy_b_);  // consumes client_
    client_ = nullptr;
    // (Held and unconfirmed, a channel that goes disconnects: its server goes plain too.)
    if (!channel) return failed;
    out->stream = MakeStream(std::move(channel), &proxy_a_, &proxy_b_, *req_.config);
    return out->stream ? Outcome::kCarried : failed;
  }

 private:
  // The TCP socket bound to the route's source, then the request for the now known
  // 4-tuple.
  bool Request(int tcp, Reason* why) noexcept {
    requested_ = true;
    wire::Endpoint client;
    *why = Reason::kUnsupported;
    if (!BindToSource(req_.family, tcp, source_, &client)) return false;
    nonce_ = sys::RandomNonce();
    SLIP_LOG(kDebug, "fd %d: %s request from port %u", req_.fd, name_, client.port);
    return m_->Request(client_, client, req_.server, nonce_, req_.config->ring_size, why);
  }
  Step Failed(Reason why) const noexcept {
    SLIP_LOG(kInfo, "fd %d: %s not used (%s)", req_.fd, name_, ReasonName(why));
    return Step::kFailed;
  }

  const ConnectRequest req_;
  Module* const m_;
  Client* client_;
  sockaddr_storage source_;
  const char* const name_;
  bool requested_ = false;
  uint64_t nonce_ = 0;
  int proxy_a_ = -1, proxy_b_ = -1;
};

}  // namespace slip
