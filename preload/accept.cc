// The server side of detect-and-negotiate.
//
// accept() classifies each connection before the application sees it: no registration
// for its 4-tuple means plain, untouched. A registration means the client proved it runs
// Slipstream out of band; its first in-band bytes must then be a CONFIRM carrying the
// registration's nonce. Anything else in those bytes is a plain client (a forged
// registration), and its bytes are the application's.
//
// accept() never waits for those bytes: a registration's stream (shm) or a request's queue
// pair and rings (verbs) are built when they arrive, so the connection is installed at
// once, held (no bytes either way) until the CONFIRM comes, which it usually already has
// (Channel::Settle; docs/DESIGN.md, "Settling a connection").
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "core/anchor_path.h"
#include "core/log.h"
#include "core/proxy.h"
#include "core/sys.h"
#include "core/wire.h"
#include "preload/accel_list.h"
#include "preload/control.h"
#include "preload/exec.h"
#include "preload/fd_table.h"
#include "preload/handshake.h"
#include "preload/install.h"
#include "preload/libc.h"
#include "preload/runtime.h"
#include "preload/verbs_loader.h"
#include "shm/shm.h"

namespace slip::preload {

namespace {

constexpr int kRoleServer = 1;

enum class Outcome { kAccelerated, kPlain, kDropped };

void SendDecline(int fd, uint64_t nonce, wire::DeclineReason reason) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kDecline;
  msg.decline = wire::Decline{nonce, reason};
  SendInBand(fd, msg);
}

// What the client registered for this connection, out of band: an shm registration
// and/or an rdma_cm request pending on the listener's twin.
struct Registered {
  SlipSocket* listener;
  wire::Endpoint client, server;
  shm::Registration shm;
  bool has_shm = false;
  verbs::Module* verbs = nullptr;  // set when a verbs request is pending
};

// True when the bytes already queued on `fd` start with a whole, valid CONFIRM (nothing is
// consumed).
bool PeekConfirm(int fd, wire::Confirm* confirm) noexcept {
  const AnchorPeek peek = PeekAnchor(fd);
  if (!peek.Is(wire::Type::kConfirm)) return false;
  *confirm = peek.msg.confirm;
  return true;
}

// The verbs half: installs the request's channel held until its client's CONFIRM, which
// settles it (verbs/settle.cc) here if it is already queued, or later on the control
// thread: accept() never waits, and nothing of ours is written to the connection.
Outcome AcceptVerbs(Registered* reg, SlipSocket* s, int fd) noexcept {
  int pair[2];
  int proxy_a = -1, proxy_b = -1;
  if (proxy::CreatePair(pair) == 0) {
    proxy_a = sys::MoveHigh(pair[0], sys::HiddenFdFloor());
    proxy_b = sys::MoveHigh(pair[1], sys::HiddenFdFloor());
  }
  Reason why = Reason::kResources;
  bool committed = false;
  auto channel = reg->verbs->AcceptPending(reg->listener->verbs_listener, reg->client, reg->server,
                                           proxy_b, &why, &committed);
  int rc = -ENOMEM;
  if (channel)
    rc = InstallAccelerated(s, fd, std::move(channel), proxy_a, proxy_b, nullptr, kRoleServer);
  if (rc == 0) {
    ControlSettle(s);
    return Outcome::kAccelerated;
  }
  if (proxy_a >= 0) sys::close(proxy_a);
  if (proxy_b >= 0) sys::close(proxy_b);
  if (committed) {
    // A client that sent its HELLO may be confirming now: plain would hand its CONFIRM to
    // the application as data. (Only our own shortage gets here, never the client's say.)
    SLIP_LOG(kWarn, "fd %d: cannot hold a requested verbs connection (%s); dropping it", fd,
             ReasonName(why));
    return Outcome::kDropped;
  }
  MarkPlain(s, fd, why, kRoleServer);
  return Outcome::kPlain;
}

// The shm half: installs the registration's stream, held until its CONFIRM, which settles
// it here if it is already queued, or later on the control thread: accept() never waits.
Outcome AcceptShm(Registered* reg, SlipSocket* s, int fd) noexcept {
  const shm::Claim claim = reg->shm.ReadClaim();
  if (claim == shm::Claim::kWithdrawn || claim == shm::Claim::kAbandoned) {
    MarkPlain(s, fd, Reason::kConnectSlow, kRoleServer);  // its client stays plain too
    return Outcome::kPlain;
  }
  if (int rc = InstallStream(s, fd, &reg->shm.stream, &reg->shm.anchor_slot, kRoleServer); rc < 0) {
    // Nothing changed at fd. Plain is safe only while the client has not committed.
    if (reg->shm.Abandon() == shm::Claim::kConfirmed) {
      SLIP_LOG(kWarn, "fd %d: cannot install a confirmed connection (errno %d); dropping it", fd,
               -rc);
      return Outcome::kDropped;
    }
    MarkPlain(s, fd, Reason::kResources, kRoleServer);
    return Outcome::kPlain;
  }
  ControlSettle(s);
  return Outcome::kAccelerated;
}

Outcome Negotiate(SlipSocket* listener, SlipSocket* s, int fd) noexcept {
  sockaddr_storage local{}, remote{};
  socklen_t llen = sizeof(local), rlen = sizeof(remote);
  Registered reg;
  reg.listener = listener;
  if (sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      sys::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen) != 0 ||
      !wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&remote), &reg.client) ||
      !wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &reg.server)) {
    MarkPlain(s, fd, Reason::kUnsupported, kRoleServer);
    return Outcome::kPlain;
  }
  if (listener->rendezvous)
    reg.has_shm = listener->rendezvous->Take(reg.client, reg.server, &reg.shm);
  if (listener->verbs_listener) {
    verbs::Module* m = VerbsIfLoaded();
    if (m && m->HasPending(listener->verbs_listener, reg.client, reg.server)) reg.verbs = m;
  }
  if (!reg.has_shm && !reg.verbs) {
    // A client that confirmed although nothing was registered for it believes it runs on
    // a ring: its CONFIRM must not reach the application as data. (A registration dropped
    // unaccepted, after 30 s, is abandoned first, so only a client that had already
    // confirmed gets here, its CONFIRM queued long since.) It is declined, and that client
    // gets a reset.
    if (wire::Confirm orphan; PeekConfirm(fd, &orphan)) {
      SLIP_LOG(kWarn,
               "fd %d: a CONFIRM arrived with nothing registered for its connection; "
               "declining it (reset) rather than passing it on as data",
               fd);
      SendDecline(fd, orphan.nonce, wire::DeclineReason::kNoRegistration);
      return Outcome::kDropped;
    }
    if (LogEnabled(LogLevel::kDebug)) {
      char peer[64];
      FormatSockaddr(reinterpret_cast<sockaddr*>(&remote), peer, sizeof(peer));
      SLIP_LOG(kDebug, "fd %d: nothing registered for the connection from %s: plain", fd, peer);
    }
    MarkPlain(s, fd, listener->rendezvous ? Reason::kPeerNotSlipstream : listener->no_rendezvous,
              kRoleServer);
    return Outcome::kPlain;
  }
  if (!reg.verbs) return AcceptShm(&reg, s, fd);
  if (reg.has_shm) {
    // The registration came from the owner of the connection's client socket (Take checks
    // it, with the kernel's view): the rdma_cm request for the same tuple is not its.
    reg.verbs->DropPending(listener->verbs_listener, reg.client, reg.server);
    return AcceptShm(&reg, s, fd);
  }
  return AcceptVerbs(&reg, s, fd);
}

// An accepted connection that cannot be tracked: its registration, if any, is abandoned so
// that its client stays plain. False when the client had already committed to its CONFIRM.
bool UntrackedIsSafe(SlipSocket* listener, int fd) noexcept {
  sockaddr_storage local{}, remote{};
  socklen_t llen = sizeof(local), rlen = sizeof(remote);
  wire::Endpoint client, server;
  if (!listener->rendezvous ||
      sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      sys::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen) != 0 ||
      !wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&remote), &client) ||
      !wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &server))
    return true;
  shm::Registration reg;
  if (!listener->rendezvous->Take(client, server, &reg)) return true;
  return reg.Abandon() != shm::Claim::kConfirmed;
}

}  // namespace

bool SlipListen(SlipSocket* s, int fd) noexcept {
  std::lock_guard<std::mutex> lock(s->mu);
  sockaddr_storage local{};
  socklen_t llen = sizeof(local);
  wire::Endpoint ep;
  if (sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      !wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &ep) || ep.port == 0)
    return false;  // not bound yet: listen() picks the port, decide after it
  s->kind = SockKind::kListener;
  const Runtime& rt = GetRuntime();
  if (s->rendezvous || s->verbs_listener) return true;
  s->no_rendezvous = Reason::kPolicy;
  if (!ListenerPortAllowed(rt.config, ep.port) ||
      !(rt.config.Allows(TransportKind::kShm) || rt.config.Allows(TransportKind::kVerbs)))
    return true;
  int reuseport = 0, v6only = 0;
  socklen_t olen = sizeof(int);
  sys::getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &reuseport, &olen);
  if (reuseport) {
    // Several processes may share the port: a registration could reach the wrong one.
    SLIP_LOG(kInfo, "fd %d: SO_REUSEPORT listener stays plain", fd);
    s->no_rendezvous = Reason::kReusePort;
    return true;
  }
  // Without the control thread nobody would notice a client's death or answer a
  // registration: publish nothing then, so that every client is served plain.
  s->no_rendezvous = Reason::kResources;
  if (!ControlReady() || !AccelListReserve()) return true;
  s->no_rendezvous = Reason::kPeerNotSlipstream;
  if (rt.config.Allows(TransportKind::kShm)) {
    olen = sizeof(int);
    if (local.ss_family == AF_INET6) sys::getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &olen);
    int err = 0;
    StreamOptions options;
    options.spin_us = rt.config.spin_us;
    s->rendezvous = shm::Rendezvous::Publish(reinterpret_cast<sockaddr*>(&local), v6only != 0,
                                             options, int(rt.config.handshake_timeout_ms), &err);
    if (!s->rendezvous) {
      s->no_rendezvous = err == -EADDRINUSE                 ? Reason::kUntrustedRendezvous
                         : err == -EMFILE || err == -ENFILE ? Reason::kFdLimit
                                                            : Reason::kResources;
      SLIP_LOG(kInfo, "fd %d: no rendezvous (%s); same-host connections stay plain", fd,
               strerror(-err));
    }
  }
  // Its rdma_cm twin goes up before the kernel listens, like the rendezvous: a client that
  // finds the TCP port open finds the rdma_cm port too.
  if (rt.config.Allows(TransportKind::kVerbs)) {
    if (verbs::Module* m = Verbs()) {
      Reason why = Reason::kNone;
      s->verbs_listener = m->Listen(reinterpret_cast<sockaddr*>(&local), &why);
    }
  }
  return true;
}

void SlipUnlisten(SlipSocket* s) noexcept {
  std::lock_guard<std::mutex> lock(s->mu);
  s->rendezvous.reset();
  UnlistenVerbs(s);
  s->kind = SockKind::kTcp;
}

int SlipAccept(SlipSocket* listener, int fd, sockaddr* addr, socklen_t* len, int flags) noexcept {
  // This process accepts here: its control thread answers the registrations as they come.
  // (A process that only listens, the master of pre-forked workers, leaves them to the
  // processes that accept.)
  if (listener->rendezvous && listener->acceptor_pid != NotedProcessId())
    ControlWatchRendezvous(listener);
  for (;;) {
    int cfd = Libc().accept4(fd, addr, len, flags);
    if (cfd < 0) return cfd;
    SlipSocket* s = NewSocket(SockKind::kTcp, listener->family);
    if (!s) {
      // No memory to track it: it can only be an untracked plain socket, which is safe
      // unless its client registered and already confirmed (its CONFIRM would reach the
      // application): that one connection is refused.
      if (!UntrackedIsSafe(listener, cfd)) {
        Libc().close(cfd);
        continue;
      }
      return cfd;
    }
    s->nonblocking.store(flags & SOCK_NONBLOCK, std::memory_order_relaxed);
    Outcome outcome = Outcome::kPlain;
    if (listener->rendezvous || listener->verbs_listener) {
      outcome = Negotiate(listener, s, cfd);
    } else {
      MarkPlain(s, cfd, listener->no_rendezvous, kRoleServer);
    }
    if (outcome == Outcome::kDropped) {
      Release(s);
      Libc().close(cfd);
      continue;  // the application never sees a connection we had to refuse
    }
    Install(cfd, s);
    Release(s);
    return cfd;
  }
}

}  // namespace slip::preload
