// shm as core's Transport (core/transport.h): the client's offer is a registration at the
// listener's verified rendezvous, the listener's twin is its rendezvous. What each step
// does and why is in shm.h; this file only maps it onto the engine's steps.
#include "core/transport.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/local_address.h"
#include "core/log.h"
#include "core/negative_cache.h"
#include "core/no_destructor.h"
#include "core/sock_diag.h"
#include "core/sys.h"
#include "shm/dir_rendezvous.h"
#include "shm/shm.h"
#include "shm/transport.h"

namespace slip::shm {

namespace {

// A loopback handshake completes inside connect(); allow a little scheduling slack before
// withdrawing the registration and going plain.
constexpr int kTcpHandshakeBudgetMs = 20;

// Binds an unbound socket (the caller knows it is) to an ephemeral port on the address the kernel
// would pick as source (for a destination in this namespace, the destination itself; for one in
// another namespace, the route's source), so that the 4-tuple is known before the SYN.
int BindForRegistration(int fd, const sockaddr* dest, socklen_t len,
                        bool across_namespaces) noexcept {
  sockaddr_storage src{};
  if (across_namespaces) {
    if (!SourceToward(dest, &src)) return -ENETUNREACH;
    // (An AF_INET6 socket to a v4-mapped destination binds the mapped source.)
    if (dest->sa_family == AF_INET6 && src.ss_family == AF_INET) {
      const auto v4 = reinterpret_cast<sockaddr_in*>(&src)->sin_addr;
      auto* v6 = reinterpret_cast<sockaddr_in6*>(&src);
      *v6 = sockaddr_in6{};
      v6->sin6_family = AF_INET6;
      v6->sin6_addr.s6_addr[10] = v6->sin6_addr.s6_addr[11] = 0xff;
      std::memcpy(v6->sin6_addr.s6_addr + 12, &v4, 4);
    }
  } else {
    std::memcpy(&src, dest, len);
    if (src.ss_family == AF_INET)
      reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;
    else
      reinterpret_cast<sockaddr_in6*>(&src)->sin6_port = 0;
  }
  if (sys::bind(fd, reinterpret_cast<sockaddr*>(&src), len) != 0) return -errno;
  return 0;
}

Reason FdReason(int rc) noexcept {
  return rc == -EMFILE || rc == -ENFILE ? Reason::kFdLimit : Reason::kResources;
}

// Why a client cannot use the rendezvous FindRendezvous did not return.
Reason OfferReason(int rc) noexcept {
  return rc == -EAGAIN                    ? Reason::kRendezvousBusy
         : rc == -EPERM                   ? Reason::kUntrustedRendezvous
         : rc == -EMFILE || rc == -ENFILE ? Reason::kFdLimit
                                          : Reason::kPeerNotSlipstream;
}

// A member of `plain`'s SO_REUSEPORT group that runs Slipstream, as SYNs from a few other
// sources reach them (the kernel hashes the 4-tuple): its rendezvous, and *member its
// listening socket. *group says whether another member answered at all; -ECONNREFUSED
// when none runs Slipstream (or `plain` is alone: a group whose every probe lands on the
// same member is taken for a lone listener, its connections plain for a while, safely).
int FindOtherMember(const sockaddr* dest, uint64_t plain, bool* group, uint64_t* member) noexcept {
  sockaddr_storage source{};
  source.ss_family = dest->sa_family;
  if (dest->sa_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&source)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  else
    reinterpret_cast<sockaddr_in6*>(&source)->sin6_addr = in6addr_loopback;
  *group = false;
  for (uint16_t port = 40001; port < 40009; ++port) {
    // (Same offset for sin_port and sin6_port.)
    reinterpret_cast<sockaddr_in*>(&source)->sin_port = htons(port);
    const auto* from = reinterpret_cast<const sockaddr*>(&source);
    SocketInfo listener;
    if (FindListener(dest, &listener, from) != 0 || listener.inode == plain) continue;
    *group = true;
    const int rv = FindRendezvous(dest, from, member);
    if (rv >= 0) return rv;
  }
  return -ECONNREFUSED;
}

class ShmClientOffer final : public ClientOffer {
 public:
  // `member`: the listening socket whose rendezvous that is, or 0 for one found in the
  // rendezvous directory (another network namespace).
  ShmClientOffer(const ConnectRequest& req, int rendezvous, uint64_t member) noexcept
      : req_(req), rendezvous_(rendezvous), member_(member), across_namespaces_(member == 0) {}
  ~ShmClientOffer() override {
    // Never established: the listener's accept(), if it comes, then goes plain.
    if (stream_) stream_->control()->WithdrawUninstalled();
    if (registered_) ClaimWithdraw(&offer_);
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
  bool WithdrawSlow() noexcept override {
    if (stream_) return stream_->control()->WithdrawUninstalled();
    registered_ = false;
    return ClaimWithdraw(&offer_);
  }

  bool Proxies(int* proxy_a, int* proxy_b) noexcept override {
    if (stream_) {
      *proxy_a = stream_->proxy_a();
      *proxy_b = proxy_b_;
      return true;
    }
    if (!offer_.region && PrepareOffer(req_.config->ring_size, &offer_) < 0) return false;
    *proxy_a = offer_.client_a;
    *proxy_b = offer_.client_b;
    return true;
  }

  // The stream goes in now, on the rings, built before the SYN (nothing here can fail). It
  // is settled when the process that accepts the connection takes the registration (the
  // claim; its ACCEPT wakes us), or, when that process turns out to be one without it,
  // continues on this TCP connection from byte 0 (nobody read our ring).
  Outcome Establish(int tcp, Carrier* out, Reason* why) noexcept override {
    (void)tcp;
    *why = Reason::kResources;
    if (!stream_) return Outcome::kPlain;
    out->stream = std::move(stream_);
    out->anchor_slot = offer_.anchor_slot;
    offer_.anchor_slot = -1;
    out->confirmed = false;  // nothing of ours goes in band
    return Outcome::kCarried;
  }

 private:
  Reason Register(int tcp) noexcept {
    wire::Endpoint own;
    if (!LocalEndpoint(tcp, &own)) return Reason::kUnsupported;
    // A listener that takes every SYN to its address (no SO_REUSEPORT, as its last
    // connection's region said) needs no 4-tuple: the registration carries the TCP socket
    // itself, which the listener knows again at accept by its inode, and connect() picks
    // the port as for plain TCP. A port bound first would cost bind()'s port search, which
    // crawls once the ports sit in TIME_WAIT (docs/DESIGN.md, "Registering without a port").
    const bool keyed = !across_namespaces_ && own.port == 0 && IsSoloListener(member_);
    if (keyed) {
      client_ = own;  // (port 0: the listener reads that as "keyed by the socket")
    } else if (!RegisterBound(tcp, own)) {
      return Reason::kUnsupported;
    } else if (const Reason why = RegisterWithMemberFromSource(); why != Reason::kNone) {
      return why;
    }
    if (!offer_.region) {
      if (int rc = PrepareOffer(req_.config->ring_size, &offer_); rc < 0) return FdReason(rc);
    }
    // (From another namespace, and keyed, with the TCP socket itself: the listener's proof
    // that the registration is this connection's.)
    if (int rc = SendRegister(rendezvous_, offer_, client_, req_.server,
                              across_namespaces_ || keyed ? tcp : -1);
        rc < 0)
      return rc == -EAGAIN ? Reason::kRendezvousBusy : Reason::kResources;
    registered_ = true;
    // Everything the connection will need is built now, before the SYN: once the SYN is
    // out the listener may take the registration at any moment, and from then on the
    // connection can no longer go plain. (Failing here, no SYN has left: the registration
    // is withdrawn, and nobody can have taken it.)
    int proxy_a = -1, proxy_b = -1;
    auto channel = MakeClientChannel(&offer_, rendezvous_, client_, req_.server, &proxy_a, &proxy_b,
                                     across_namespaces_, member_);
    if (!channel) return Reason::kResources;  // (withdrawn by the destructor)
    rendezvous_ = -1;                         // the channel's
    registered_ = false;                      // the channel's to withdraw
    StreamOptions options;
    options.spin_us = req_.config->spin_us;
    stream_.reset(new (std::nothrow) Stream(std::move(channel), proxy_a, proxy_b, options));
    if (!stream_) {
      // (`channel` was not moved from: a failed allocation constructs nothing.)
      sys::close(proxy_a);
      sys::close(proxy_b);
      channel->control()->WithdrawUninstalled();
      return Reason::kResources;
    }
    proxy_b_ = proxy_b;  // (the stream's)
    return Reason::kNone;
  }

  // Binds the socket (unless the application did) so that the 4-tuple is known before the
  // SYN: `client_` is it.
  bool RegisterBound(int tcp, const wire::Endpoint& own) noexcept {
    if (own.port != 0) {
      client_ = own;
      return true;
    }
    return BindForRegistration(tcp, req_.dest(), req_.dest_len, across_namespaces_) == 0 &&
           LocalEndpoint(tcp, &client_);
  }

  // Now that the 4-tuple is known, the kernel says which listener the SYN will reach: in
  // an SO_REUSEPORT group, maybe another member than the probe's; its rendezvous then
  // replaces ours. Says why when that one cannot be used (kNone: registered with the one
  // the SYN reaches).
  // (No answer, e.g. a TIME_WAIT socket of an earlier connection on this 4-tuple found
  // first: the probe's member stands. A wrong one costs acceleration, never bytes.)
  // (Another namespace's listener checks that itself: CheckAcrossNamespaces.)
  Reason RegisterWithMemberFromSource() noexcept {
    sockaddr_storage source;
    SocketInfo listener;
    if (across_namespaces_ || !wire::SockaddrFromEndpoint(client_, &source) ||
        FindListener(req_.dest(), &listener, reinterpret_cast<sockaddr*>(&source)) != 0 ||
        listener.inode == member_)
      return Reason::kNone;
    uint64_t member = 0;
    const int rv = FindRendezvous(req_.dest(), reinterpret_cast<sockaddr*>(&source), &member);
    if (rv < 0) return OfferReason(rv);
    sys::close(rendezvous_);
    rendezvous_ = rv;
    member_ = member;
    return Reason::kNone;
  }

  const ConnectRequest req_;
  int rendezvous_;
  uint64_t member_;  // the listening socket whose rendezvous that is
  const bool across_namespaces_;
  wire::Endpoint client_;
  Offer offer_;
  bool registered_ = false;         // REGISTER sent, and the offer (not a channel) withdraws it
  std::unique_ptr<Stream> stream_;  // built before the SYN, until Establish hands it over
  int proxy_b_ = -1;                // the stream's B
};

class ShmServerOffer final : public ServerOffer {
 public:
  explicit ShmServerOffer(Registration reg) noexcept : reg_(std::move(reg)) {}

  bool Open(Carrier* out, Reason* why) noexcept override {
    // The claim: from here the rings carry the connection, unless its client withdrew.
    if (!reg_.Commit()) {
      *why = Reason::kConnectSlow;  // its client continues on TCP too
      return false;
    }
    // Built when the registration was read: installing it allocates nothing.
    out->stream = std::move(reg_.stream);
    out->anchor_slot = reg_.anchor_slot;
    reg_.anchor_slot = -1;
    return true;
  }
  // (The claim word lives in the region, which the stream maps: the face calls this
  // before the stream it opened is gone.)
  bool Abandon() noexcept override { return reg_.Abandon() != Claim::kTaken; }

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
  int ServiceFd() const noexcept override { return rendezvous_->shared() ? -1 : rendezvous_->fd(); }
  bool Service() noexcept override { return rendezvous_->Drain(); }
  void SharedByProcesses() noexcept override { rendezvous_->Share(); }
  void BeforeFork() noexcept override { rendezvous_->PrepareSharing(); }

 private:
  std::unique_ptr<Rendezvous> rendezvous_;
};

class ShmTransport final : public Transport {
 public:
  TransportKind kind() const noexcept override { return TransportKind::kShm; }
  bool OffersVouchedByKernel() const noexcept override { return true; }

  std::unique_ptr<ClientOffer> Offer(const ConnectRequest& req, Reason* why) noexcept override {
    uint64_t member = 0;
    int rv;
    if (IsLocalDestination(req.dest())) {
      // A plain listener answered lately: plain at once, without asking the kernel again.
      const uint64_t now_ms = sys::MonotonicMs();
      if (plain_listeners_.Lookup(req.server, now_ms, why)) return nullptr;
      // (From nowhere: the socket is not bound yet, and a plain listener must not have it
      // bound. Register looks again from the bound port.)
      rv = FindRendezvous(req.dest(), nullptr, &member);
      if (rv == -ECONNREFUSED && member != 0) {
        // The probe from nowhere reached a plain listener. In an SO_REUSEPORT group that is
        // only the member the kernel's hash gives a SYN from nowhere (its per-boot secret
        // decides which): another member may run Slipstream, and Register looks again
        // from the source. A lone plain listener is remembered.
        bool group = false;
        rv = FindOtherMember(req.dest(), member, &group, &member);
        if (!group)
          plain_listeners_.Insert(req.server, Reason::kPeerNotSlipstream,
                                  now_ms + kPlainListenerTtlMs);
      }
    } else if (!req.config->rendezvous_dir.empty()) {
      // Maybe another namespace of this host (a pod): its listener's name in the directory.
      rv = FindDirRendezvous(req.config->rendezvous_dir.c_str(), req.dest());
      if (rv == -ENOENT || rv == -ECONNREFUSED || rv == -ENAMETOOLONG) rv = -EHOSTUNREACH;
    } else {
      rv = -EHOSTUNREACH;
    }
    if (rv == -EHOSTUNREACH) {
      *why = Reason::kNotSameHost;
      return nullptr;
    }
    if (rv < 0) {
      *why = OfferReason(rv);
      return nullptr;
    }
    std::unique_ptr<ClientOffer> offer(new (std::nothrow) ShmClientOffer(req, rv, member));
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
    wire::Endpoint local;
    struct stat st;
    if (!wire::EndpointFromSockaddr(req.local, &local) || fstat(req.fd, &st) != 0) {
      *why = Reason::kUnsupported;
      return nullptr;
    }
    // One rendezvous per listening socket, named by its inode: each member of an
    // SO_REUSEPORT group publishes its own. Without SO_REUSEPORT no other socket can share
    // the address, and its clients are told so (kListenerSolo).
    int reuseport = 1;
    socklen_t optlen = sizeof(reuseport);
    if (sys::getsockopt(req.fd, SOL_SOCKET, SO_REUSEPORT, &reuseport, &optlen) != 0) reuseport = 1;
    auto rendezvous =
        Rendezvous::Publish(local.port, uint64_t(st.st_ino), options, &err, reuseport == 0);
    if (!rendezvous) {
      *why = err == -EADDRINUSE ? Reason::kUntrustedRendezvous : FdReason(err);
      SLIP_LOG(kInfo, "fd %d: no rendezvous (%s); same-host connections stay plain", req.fd,
               strerror(-err));
      return nullptr;
    }
    // Other network namespaces of this host (pods) find it in the rendezvous directory.
    if (!req.config->rendezvous_dir.empty()) {
      wire::Endpoint reached[kMaxDirNames];
      const size_t count = ReachableEndpoints(local, req.v6only, reached, kMaxDirNames);
      RendezvousDir dir;
      if (count > 0 && dir.Open(req.config->rendezvous_dir.c_str()))
        rendezvous->PublishInDir(dir.get(), reached, count);
    }
    std::unique_ptr<ListenerTwin> twin(new (std::nothrow) ShmTwin(std::move(rendezvous)));
    if (!twin) *why = Reason::kResources;
    return twin;
  }

  void ForkPrepare() noexcept override { plain_listeners_.fork_mutex().ForkPrepare(); }
  void ForkParent() noexcept override { plain_listeners_.fork_mutex().ForkParent(); }
  void ForkChild() noexcept override { plain_listeners_.fork_mutex().ForkChild(); }

 private:
  // Destinations whose listening socket publishes no rendezvous (a plain server): a
  // connection-per-request client of one paid the kernel's listener lookup and a refused
  // connect(2) for every connection. Not what nobody listens on: a client that retries
  // until its server is up must find the rendezvous the moment it is. A listener that
  // starts publishing (the server restarted under Slipstream) is seen within the TTL.
  static constexpr uint64_t kPlainListenerTtlMs = 1000;
  NegativeCache plain_listeners_;
};

}  // namespace

Transport* TheTransport() noexcept {
  static NoDestructor<ShmTransport> transport;  // connections may be made during exit
  return transport.get();
}

}  // namespace slip::shm
