// shm as core's Transport (core/transport.h): the client's offer is a registration at the
// listener's verified rendezvous, the listener's twin is its rendezvous. What each step
// does and why is in shm.h; this file only maps it onto the engine's steps.
#include "core/transport.h"

#include <cerrno>
#include <cstring>
#include <new>

#include "core/local_address.h"
#include "core/log.h"
#include "core/no_destructor.h"
#include "core/sys.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

// A loopback handshake completes inside connect(); allow a little scheduling slack before
// withdrawing the registration and going plain.
constexpr int kTcpHandshakeBudgetMs = 20;

// Binds an unbound socket to an ephemeral port on the address the kernel would pick as
// source for a local destination (the destination itself), so that the 4-tuple is known
// before the SYN.
int BindForRegistration(int fd, const sockaddr* dest, socklen_t len) noexcept {
  if (wire::Endpoint ep; LocalEndpoint(fd, &ep) && ep.port != 0) return 0;
  sockaddr_storage src{};
  std::memcpy(&src, dest, len);
  if (src.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(&src)->sin6_port = 0;
  if (sys::bind(fd, reinterpret_cast<sockaddr*>(&src), len) != 0) return -errno;
  return 0;
}

Reason FdReason(int rc) noexcept {
  return rc == -EMFILE || rc == -ENFILE ? Reason::kFdLimit : Reason::kResources;
}

class ShmClientOffer final : public ClientOffer {
 public:
  ShmClientOffer(const ConnectRequest& req, int rendezvous) noexcept
      : req_(req), rendezvous_(rendezvous) {}
  ~ShmClientOffer() override {
    if (registered_) ClaimWithdraw(&offer_);  // the listener's accept() then goes plain
    if (rendezvous_ >= 0) sys::close(rendezvous_);
  }

  Step Advance(int tcp, Reason* why) noexcept override {
    *why = Register(tcp);
    if (*why == Reason::kNone) return Step::kReady;
    SLIP_LOG(kInfo, "fd %d: shm not used (%s)", req_.fd, ReasonName(*why));
    return Step::kFailed;
  }
  int WaitFd() const noexcept override { return -1; }
  uint64_t DeadlineMs() const noexcept override { return 0; }
  int TcpHandshakeBudgetMs() const noexcept override { return kTcpHandshakeBudgetMs; }

  bool Proxies(int* proxy_a, int* proxy_b) noexcept override {
    if (!offer_.region && PrepareOffer(req_.config->ring_size, &offer_) < 0) return false;
    *proxy_a = offer_.client_a;
    *proxy_b = offer_.client_b;
    return true;
  }

  // The stream goes in now, on the rings. It is settled when the listener answers the
  // registration: ACCEPT, and the CONFIRM goes out as the first bytes of the connection;
  // DECLINE or no answer in time, and the stream continues on this TCP connection from
  // byte 0 (the server never read our ring). Usually the answer is already here.
  Outcome Establish(int tcp, Carrier* out, Reason* why) noexcept override {
    (void)tcp;
    *why = Reason::kResources;
    int proxy_a = -1, proxy_b = -1;
    auto channel = MakeClientChannel(&offer_, rendezvous_, int(req_.config->handshake_timeout_ms),
                                     &proxy_a, &proxy_b);
    if (!channel) return Outcome::kPlain;  // (the destructor withdraws)
    rendezvous_ = -1;                      // the channel's
    registered_ = false;                   // the channel withdraws it if it goes unused
    StreamOptions options;
    options.spin_us = req_.config->spin_us;
    out->stream.reset(new (std::nothrow) Stream(std::move(channel), proxy_a, proxy_b, options));
    if (!out->stream) {
      // (`channel` was not moved from: it goes with its argument, withdrawing.)
      sys::close(proxy_a);
      sys::close(proxy_b);
      return Outcome::kPlain;
    }
    out->anchor_slot = offer_.anchor_slot;
    offer_.anchor_slot = -1;
    out->confirmed = false;  // the CONFIRM follows the listener's ACCEPT (ChannelControl::Settle)
    return Outcome::kCarried;
  }

 private:
  Reason Register(int tcp) noexcept {
    wire::Endpoint client;
    if (BindForRegistration(tcp, req_.dest(), req_.dest_len) < 0 || !LocalEndpoint(tcp, &client))
      return Reason::kUnsupported;
    if (!offer_.region) {
      if (int rc = PrepareOffer(req_.config->ring_size, &offer_); rc < 0) return FdReason(rc);
    }
    if (int rc = SendRegister(rendezvous_, offer_, client, req_.server); rc < 0)
      return rc == -EAGAIN ? Reason::kRendezvousBusy : Reason::kResources;
    registered_ = true;
    return Reason::kNone;
  }

  const ConnectRequest req_;
  int rendezvous_;
  Offer offer_;
  bool registered_ = false;
};

class ShmServerOffer final : public ServerOffer {
 public:
  explicit ShmServerOffer(Registration reg) noexcept : reg_(std::move(reg)) {}

  bool Open(Carrier* out, Reason* why) noexcept override {
    const Claim claim = reg_.ReadClaim();
    if (claim == Claim::kWithdrawn || claim == Claim::kAbandoned) {
      *why = Reason::kConnectSlow;  // its client stays plain too
      return false;
    }
    // Built when the registration was answered: installing it allocates nothing.
    out->stream = std::move(reg_.stream);
    out->anchor_slot = reg_.anchor_slot;
    reg_.anchor_slot = -1;
    return true;
  }
  // (The claim word lives in the region, which the stream maps: the face calls this
  // before the stream it opened is gone.)
  bool Abandon() noexcept override { return reg_.Abandon() != Claim::kConfirmed; }

 private:
  Registration reg_;
};

class ShmTwin final : public ListenerTwin {
 public:
  explicit ShmTwin(std::unique_ptr<Rendezvous> rendezvous) noexcept
      : rendezvous_(std::move(rendezvous)) {}

  ServerOfferPtr Take(const wire::Endpoint& client, const wire::Endpoint& server,
                      ServerOfferRoom* room) noexcept override {
    static_assert(sizeof(ShmServerOffer) <= sizeof(ServerOfferRoom) &&
                  alignof(ShmServerOffer) <= alignof(ServerOfferRoom));
    Registration reg;
    if (!rendezvous_->Take(client, server, &reg)) return nullptr;
    return ServerOfferPtr(new (room->bytes) ShmServerOffer(std::move(reg)));
  }
  void Drop(const wire::Endpoint& client, const wire::Endpoint& server) noexcept override {
    Registration reg;
    if (rendezvous_->Take(client, server, &reg)) reg.Abandon();
  }
  int ServiceFd() const noexcept override { return rendezvous_->fd(); }
  bool Service() noexcept override { return rendezvous_->Drain(); }

 private:
  std::unique_ptr<Rendezvous> rendezvous_;
};

class ShmTransport final : public Transport {
 public:
  TransportKind kind() const noexcept override { return TransportKind::kShm; }
  bool OffersVouchedByKernel() const noexcept override { return true; }

  std::unique_ptr<ClientOffer> Offer(const ConnectRequest& req, Reason* why) noexcept override {
    if (!IsLocalDestination(req.dest())) {
      *why = Reason::kNotSameHost;
      return nullptr;
    }
    const int rv = FindRendezvous(req.dest());
    if (rv < 0) {
      *why = rv == -EAGAIN                    ? Reason::kRendezvousBusy
             : rv == -EPERM                   ? Reason::kUntrustedRendezvous
             : rv == -EMFILE || rv == -ENFILE ? Reason::kFdLimit
                                              : Reason::kPeerNotSlipstream;
      return nullptr;
    }
    std::unique_ptr<ClientOffer> offer(new (std::nothrow) ShmClientOffer(req, rv));
    if (!offer) {
      sys::close(rv);
      *why = Reason::kResources;
    }
    return offer;
  }

  std::unique_ptr<ListenerTwin> Listen(const ListenRequest& req, Reason* why) noexcept override {
    StreamOptions options;
    options.spin_us = req.config->spin_us;
    int err = 0;
    auto rendezvous = Rendezvous::Publish(req.local, req.v6only, options,
                                          int(req.config->handshake_timeout_ms), &err);
    if (!rendezvous) {
      *why = err == -EADDRINUSE ? Reason::kUntrustedRendezvous : FdReason(err);
      SLIP_LOG(kInfo, "fd %d: no rendezvous (%s); same-host connections stay plain", req.fd,
               strerror(-err));
      return nullptr;
    }
    std::unique_ptr<ListenerTwin> twin(new (std::nothrow) ShmTwin(std::move(rendezvous)));
    if (!twin) *why = Reason::kResources;
    return twin;
  }
};

}  // namespace

Transport* TheTransport() noexcept {
  static NoDestructor<ShmTransport> transport;  // connections may be made during exit
  return transport.get();
}

}  // namespace slip::shm
