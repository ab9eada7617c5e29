// The client side of detect-and-negotiate.
//
// Same host only (shm): find the listener's rendezvous, bind the local port, register the
// 4-tuple, nonce, region and proxies BEFORE the SYN, connect, claim the region (unless the
// server already gave up waiting: shm.h, Claim), then send CONFIRM as the first in-band
// bytes and switch the descriptor to the proxy. The client does not wait
// for an answer: the server reads the ring once it accepts (success is silent), and the control
// thread handles a DECLINE. A plain server has no rendezvous and costs one refused
// AF_UNIX connect: no round trip, no byte in the stream.
//
// Otherwise (another host, or shm not allowed) verbs: VerbsConnect below does the rdma_cm
// exchange before the SYN, then the same CONFIRM (docs/DESIGN.md, "Detection across hosts").
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>

#include "core/log.h"
#include "core/proxy.h"
#include "core/sys.h"
#include "core/wire.h"
#include "preload/accel_list.h"
#include "preload/connector.h"
#include "preload/control.h"
#include "preload/fd_table.h"
#include "preload/handshake.h"
#include "preload/install.h"
#include "preload/libc.h"
#include "preload/runtime.h"
#include "preload/verbs_loader.h"
#include "shm/shm.h"

namespace slip::preload {

namespace {

constexpr int kRoleClient = 0;
// A loopback handshake completes inside connect(); allow a little scheduling slack before
// withdrawing the registration and going plain.
constexpr int kConnectSlackMs = 20;
// How long connect() waits for the listener's answer to a registration before it leaves
// the settling to the control thread.
constexpr int kAnswerWaitMs = 5;

bool IsLoopback(const wire::Endpoint& ep) noexcept {
  if (ep.family == 4) return ep.addr[0] == 127;
  static const uint8_t kLoop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return std::memcmp(ep.addr, kLoop6, 16) == 0;
}

bool IsInterfaceAddress(const wire::Endpoint& ep) noexcept {
  // getifaddrs is a netlink round trip; cache it for a few seconds.
  static std::mutex mu;
  static std::vector<wire::Endpoint> cache;
  static time_t fetched = 0;
  std::lock_guard<std::mutex> lock(mu);
  time_t now = time(nullptr);
  if (now - fetched > 5) {
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) == 0) {
      try {
        cache.clear();
        for (ifaddrs* it = list; it; it = it->ifa_next) {
          wire::Endpoint e;
          if (it->ifa_addr && wire::EndpointFromSockaddr(it->ifa_addr, &e)) cache.push_back(e);
        }
      } catch (...) {
      }
      freeifaddrs(list);
      fetched = now;
    }
  }
  for (const wire::Endpoint& e : cache) {
    if (e.family == ep.family && std::memcmp(e.addr, ep.addr, 16) == 0) return true;
  }
  return false;
}

// Binds an unbound socket to an ephemeral port on the address the kernel would pick as
// source for a local destination (the destination itself), so that the 4-tuple is known
// before the SYN.
int BindForRegistration(int fd, const sockaddr* dest, socklen_t len) noexcept {
  sockaddr_storage local{};
  socklen_t llen = sizeof(local);
  if (sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) return -errno;
  wire::Endpoint ep;
  if (wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &ep) && ep.port != 0)
    return 0;
  sockaddr_storage src{};
  std::memcpy(&src, dest, len);
  if (src.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(&src)->sin6_port = 0;
  if (sys::bind(fd, reinterpret_cast<sockaddr*>(&src), len) != 0) return -errno;
  return 0;
}

int LocalEndpoint(int fd, wire::Endpoint* ep) noexcept {
  sockaddr_storage local{};
  socklen_t llen = sizeof(local);
  if (sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) return -errno;
  return wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), ep) ? 0 : -EAFNOSUPPORT;
}

// Waits for an in-progress connect; true once established.
bool WaitEstablished(int fd, int timeout_ms) noexcept {
  pollfd p{fd, POLLOUT, 0};
  int rc;
  do {
    rc = sys::poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  if (rc != 1 || (p.revents & (POLLERR | POLLHUP))) return false;
  sockaddr_storage peer;
  socklen_t plen = sizeof(peer);
  return sys::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0;
}

}  // namespace

// CONFIRM is in the stream but the connection cannot be installed: plain TCP is no longer
// safe, so fail the connection the way TCP would rather than corrupt it.
int ResetAfterConfirm(SlipSocket* s, int fd) noexcept {
  SLIP_LOG(kError, "fd %d: cannot install the accelerated connection; resetting", fd);
  linger lg{1, 0};
  sys::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  sys::shutdown(fd, SHUT_RDWR);
  MarkPlain(s, fd, Reason::kResources, kRoleClient);
  errno = ECONNRESET;
  return -1;
}

verbs::Module* VerbsCandidate(SlipSocket* s, int fd, const sockaddr* addr, Reason* why) noexcept {
  (void)s;
  const Runtime& rt = GetRuntime();
  wire::Endpoint server;
  *why = Reason::kPolicy;
  if (!rt.config.Allows(TransportKind::kVerbs)) return nullptr;
  *why = Reason::kUnsupported;
  if (!wire::EndpointFromSockaddr(addr, &server)) return nullptr;
  *why = Reason::kNoRdmaPath;
  if (IsLoopback(server)) return nullptr;  // rdma_cm has no loopback device
  sockaddr_storage local{};
  socklen_t llen = sizeof(local);
  sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen);
  *why = Reason::kPolicy;
  if (!PolicyAllows(rt.config, reinterpret_cast<sockaddr*>(&local), addr)) return nullptr;
  wire::Endpoint bound;
  *why = Reason::kUnsupported;  // the application chose its port: keep out of its way
  if (wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &bound) && bound.port != 0)
    return nullptr;
  verbs::Module* m = Verbs();
  *why = Reason::kNoRdmaDevice;
  if (!m) return nullptr;
  *why = Reason::kResources;
  if (!ControlReady()) return nullptr;
  *why = Reason::kNone;
  return m;
}

bool BindToRdmaSource(SlipSocket* s, int fd, const sockaddr_storage& source,
                      wire::Endpoint* client) noexcept {
  // An IPv6 socket reaching an IPv4 peer binds to the v4-mapped source.
  sockaddr_storage bind_to = source;
  socklen_t bind_len = source.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (s->family == AF_INET6 && source.ss_family == AF_INET) {
    sockaddr_in6 mapped{};
    mapped.sin6_family = AF_INET6;
    mapped.sin6_addr.s6_addr[10] = mapped.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&mapped.sin6_addr.s6_addr[12],
                &reinterpret_cast<const sockaddr_in*>(&source)->sin_addr, 4);
    std::memcpy(&bind_to, &mapped, sizeof(mapped));
    bind_len = sizeof(mapped);
  }
  return sys::bind(fd, reinterpret_cast<sockaddr*>(&bind_to), bind_len) == 0 &&
         LocalEndpoint(fd, client) == 0;
}

int SendConfirm(int fd, uint64_t nonce, uint32_t ring_size) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kConfirm;
  msg.confirm = wire::Confirm{nonce, ring_size};
  return SendInBand(fd, msg);
}

namespace {

// The verbs path for a blocking connect (another host, or this host's RDMA device):
// resolve over RDMA, bind to the RDMA route's source address, REQ/REP with the listener's
// twin, and only then the SYN. Returns Reason::kNone when it ran connect() itself (*rc/*err
// are connect's answer); any other reason means nothing happened yet beyond, perhaps, the
// bind. (A non-blocking connect goes to the connector instead: preload/connector.h.)
Reason VerbsConnect(SlipSocket* s, int fd, const sockaddr* addr, socklen_t len, int* rc,
                    int* err) noexcept {
  const Runtime& rt = GetRuntime();
  Reason why = Reason::kNone;
  verbs::Module* m = VerbsCandidate(s, fd, addr, &why);
  if (!m) return why;
  wire::Endpoint server;
  wire::EndpointFromSockaddr(addr, &server);
  sockaddr_storage source{};
  verbs::ClientConn* conn = m->Resolve(addr, &source, &why);
  if (!conn) return why;
  wire::Endpoint client;
  if (!BindToRdmaSource(s, fd, source, &client)) {
    m->Abort(conn);
    return Reason::kUnsupported;
  }
  const uint64_t nonce = sys::RandomNonce();
  const uint32_t ring_size = rt.config.ring_size;
  SLIP_LOG(kDebug, "fd %d: verbs request from port %u", fd, client.port);
  if (!m->Handshake(conn, client, server, nonce, ring_size, &why)) {
    m->Abort(conn);
    SLIP_LOG(kInfo, "fd %d: verbs not used (%s)", fd, ReasonName(why));
    return why;
  }
  *rc = Libc().connect(fd, addr, len);
  *err = errno;
  bool established = *rc == 0;
  if (!established && (*err == EINPROGRESS || *err == EINTR))
    established = WaitEstablished(fd, int(rt.config.handshake_timeout_ms));
  if (!established) {
    m->Abort(conn);  // the listener drops its pending request and treats the SYN as plain
    if (*err == EINPROGRESS || *err == EINTR)
      MarkPlain(s, fd, Reason::kConnectSlow, kRoleClient, addr);
    return Reason::kNone;
  }
  if (SendConfirm(fd, nonce, ring_size) < 0) {
    m->Abort(conn);
    MarkPlain(s, fd, Reason::kResources, kRoleClient);
    return Reason::kNone;
  }
  int pair[2];
  if (proxy::CreatePair(pair) < 0) {
    m->Abort(conn);
    *rc = ResetAfterConfirm(s, fd);
    *err = errno;
    return Reason::kNone;
  }
  int proxy_a = sys::MoveHigh(pair[0], sys::HiddenFdFloor());
  int proxy_b = sys::MoveHigh(pair[1], sys::HiddenFdFloor());
  auto channel = m->Finish(conn, proxy_b);
  if (!channel ||
      InstallAccelerated(s, fd, std::move(channel), proxy_a, proxy_b, nullptr, kRoleClient) < 0) {
    sys::close(proxy_a);
    sys::close(proxy_b);
    *rc = ResetAfterConfirm(s, fd);
    *err = errno;
    return Reason::kNone;
  }
  if (*rc != 0) *err = EINPROGRESS;  // a non-blocking connect reports it as the kernel did
  return Reason::kNone;
}

// Plain connect for a socket we will not accelerate, recording why.
int ConnectPlain(SlipSocket* s, int fd, const sockaddr* addr, socklen_t len,
                 Reason reason) noexcept {
  int rc = Libc().connect(fd, addr, len);
  int err = errno;
  if (rc == 0) {
    MarkPlain(s, fd, reason, kRoleClient, addr);
  } else if (err == EINPROGRESS) {
    // Not a connection yet (it may be refused): recorded once it carries data.
    s->kind = SockKind::kPlain;
    s->pending_reason = reason;
    s->stats_pending.store(true, std::memory_order_release);
  }
  errno = err;
  return rc;
}

Reason ShmDetect(int fd, const sockaddr* addr, int* rendezvous) noexcept {
  const Runtime& rt = GetRuntime();
  wire::Endpoint dest;
  if (!wire::EndpointFromSockaddr(addr, &dest)) return Reason::kUnsupported;
  if (!rt.config.Allows(TransportKind::kShm)) return Reason::kPolicy;
  if (!IsLocalDestination(addr)) return Reason::kNotSameHost;
  sockaddr_storage local{};
  socklen_t llen = sizeof(local);
  sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen);
  if (!PolicyAllows(rt.config, reinterpret_cast<sockaddr*>(&local), addr)) return Reason::kPolicy;
  int rv = shm::FindRendezvous(addr);
  if (rv == -EAGAIN) return Reason::kRendezvousBusy;
  if (rv == -EPERM) return Reason::kUntrustedRendezvous;
  if (rv == -EMFILE || rv == -ENFILE) return Reason::kFdLimit;
  if (rv < 0) return Reason::kPeerNotSlipstream;
  if (!ControlReady()) {  // only now: a plain peer must not cost a thread
    sys::close(rv);
    return Reason::kResources;
  }
  *rendezvous = rv;
  return Reason::kNone;
}

}  // namespace

int SendInBand(int fd, const wire::Message& msg) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  size_t len = wire::EncodeMessage(msg, buf, sizeof(buf));
  if (len == 0) return -EINVAL;
  size_t done = 0;
  while (done < len) {
    ssize_t n = sys::send(fd, buf + done, len - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (sys::poll(&p, 1, 1000) <= 0) return -ETIMEDOUT;
      continue;
    }
    return n < 0 ? -errno : -EPIPE;
  }
  return 0;
}

bool IsLocalDestination(const sockaddr* addr) noexcept {
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(addr, &ep)) return false;
  return IsLoopback(ep) || IsInterfaceAddress(ep);
}

int SlipConnect(SlipSocket* s, int fd, const sockaddr* addr, socklen_t len) noexcept {
  if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) ||
      len < (addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6)))
    return Libc().connect(fd, addr, len);
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->kind == SockKind::kConnecting) {  // another thread's connect got here first
    errno = EALREADY;
    return -1;
  }
  if (s->kind != SockKind::kTcp) return Libc().connect(fd, addr, len);

  int rendezvous = -1;
  Reason reason = ShmDetect(fd, addr, &rendezvous);
  if (reason != Reason::kNone) {
    int rc = 0, err = 0;
    const int fl = sys::fcntl(fd, F_GETFL);
    Reason verbs_reason;
    if (fl >= 0 && (fl & O_NONBLOCK)) {
      // Never blocks: the exchange continues on the connector's thread.
      verbs_reason = ConnectInBackground(s, fd, addr, len);
      if (verbs_reason == Reason::kNone) {
        errno = EINPROGRESS;
        return -1;
      }
    } else {
      verbs_reason = VerbsConnect(s, fd, addr, len, &rc, &err);
      if (verbs_reason == Reason::kNone) {
        errno = err;
        return rc;
      }
    }
    // Say why in the terms of the transport that came closest.
    if (verbs_reason != Reason::kPolicy &&
        (reason == Reason::kNotSameHost || reason == Reason::kPolicy))
      reason = verbs_reason;
    return ConnectPlain(s, fd, addr, len, reason);
  }

  // A Slipstream listener is on this host, its rendezvous verified. Register, then connect.
  shm::Offer offer;
  wire::Endpoint client, server;
  wire::EndpointFromSockaddr(addr, &server);
  if (int rc = BindForRegistration(fd, addr, len); rc < 0) {
    reason = Reason::kUnsupported;
  } else if (LocalEndpoint(fd, &client) < 0) {
    reason = Reason::kUnsupported;
  } else if (!AccelListReserve()) {
    reason = Reason::kResources;
  } else if (int rc = shm::PrepareOffer(GetRuntime().config.ring_size, &offer); rc < 0) {
    reason = rc == -EMFILE || rc == -ENFILE ? Reason::kFdLimit : Reason::kResources;
  } else if (int rc = shm::SendRegister(rendezvous, offer, client, server); rc < 0) {
    reason = rc == -EAGAIN ? Reason::kRendezvousBusy : Reason::kResources;
  }
  if (reason != Reason::kNone) {
    sys::close(rendezvous);
    SLIP_LOG(kInfo, "fd %d: shm not used (%s)", fd, ReasonName(reason));
    return ConnectPlain(s, fd, addr, len, reason);
  }

  int rc = Libc().connect(fd, addr, len);
  int err = errno;
  bool established = rc == 0;
  if (!established && (err == EINPROGRESS || err == EINTR))
    established = WaitEstablished(fd, kConnectSlackMs);
  if (!established) {
    sys::close(rendezvous);
    if (err == EINPROGRESS || err == EINTR) {
      // Withdraw the registration: the server's accept() reads the claim and goes plain.
      shm::ClaimWithdraw(&offer);
      MarkPlain(s, fd, Reason::kConnectSlow, kRoleClient, addr);
    }
    errno = err;
    return rc;
  }
  // The stream goes in now, on the rings. It is settled when the listener answers the
  // registration: ACCEPT, and the CONFIRM goes out as the first bytes of the connection;
  // DECLINE or no answer in time, and the stream continues on this TCP connection from
  // byte 0 (the server never read our ring). Usually the answer is already here.
  int proxy_a = -1, proxy_b = -1;
  auto channel = shm::MakeClientChannel(
      &offer, rendezvous, int(GetRuntime().config.handshake_timeout_ms), &proxy_a, &proxy_b);
  if (!channel) {
    sys::close(rendezvous);
    shm::ClaimWithdraw(&offer);
    MarkPlain(s, fd, Reason::kResources, kRoleClient, addr);
    errno = err;
    return rc;
  }
  // (The channel withdraws the registration itself if it goes unused.)
  if (int irc = InstallAccelerated(s, fd, std::move(channel), proxy_a, proxy_b, &offer.anchor_slot,
                                   kRoleClient);
      irc < 0) {
    sys::close(proxy_a);
    sys::close(proxy_b);
    MarkPlain(s, fd, irc == -EMFILE ? Reason::kFdLimit : Reason::kResources, kRoleClient, addr);
    errno = err;
    return rc;
  }
  // The listener usually answered while the TCP handshake ran; when it is slower, a few
  // milliseconds here save the control thread's round trip (several wake-ups).
  ControlSettle(s, kAnswerWaitMs);
  if (rc != 0) {
    errno = err;  // a non-blocking connect reports EINPROGRESS as the kernel did
    return -1;
  }
  return 0;
}

void RecordPendingPlain(SlipSocket* s, int fd) noexcept {
  std::lock_guard<std::mutex> lock(s->mu);
  if (!s->stats_pending.exchange(false, std::memory_order_acq_rel)) return;
  sockaddr_storage peer{};
  socklen_t plen = sizeof(peer);
  if (sys::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0)
    MarkPlain(s, fd, s->pending_reason, kRoleClient, reinterpret_cast<sockaddr*>(&peer));
}

void MarkPlain(SlipSocket* s, int fd, Reason reason, int role, const sockaddr* remote) noexcept {
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof(local), plen = sizeof(peer);
  sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen);
  if (!remote) {
    if (sys::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0)
      peer.ss_family = AF_UNSPEC;
    remote = reinterpret_cast<sockaddr*>(&peer);
  }
  s->kind = SockKind::kPlain;
  if (!s->stats)
    s->stats =
        StatsOpen(TransportKind::kTcp, reason, role, reinterpret_cast<sockaddr*>(&local), remote);
}

}  // namespace slip::preload
