// The server side of detect-and-negotiate.
//
// accept() classifies each connection before the application sees it: no registration
// for its 4-tuple means plain, untouched. A registration means the client proved it runs
// Slipstream out of band; its first in-band bytes must then be a CONFIRM carrying the
// registration's nonce. Anything else in those bytes is a plain client (a forged
// registration), and its bytes are the application's.
//
// accept() never waits for those bytes: the offer's stream is built when it arrives (shm:
// a registration's stream; verbs: a request's queue pair and rings), so the connection is
// installed at once, held (no bytes either way) until the CONFIRM comes, which it usually
// already has (ChannelControl::Settle; docs/DESIGN.md, "Settling a connection"). Which
// transports stand beside the listener, and what they were offered, is core's interface
// (core/transport.h): this file names none of them.
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
#include "core/server_setup.h"
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
#include "preload/transports.h"

namespace slip::preload {

namespace {

constexpr int kRoleServer = 1;

enum class Outcome { kAccelerated, kPlain, kDropped };

bool SendDecline(int fd, uint64_t nonce, wire::DeclineReason reason) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kDecline;
  msg.decline = wire::Decline{nonce, reason};
  // (The first bytes on a fresh connection: the socket's buffer has room, nothing waits.)
  return SendOnAnchor(fd, msg, 0);
}

// An accepted connection's addresses, asked once: the offers are looked up by them, and a
// plain connection's stats slot records them.
struct Ends {
  sockaddr_storage peer{}, local{};
  wire::Endpoint client, server;

  bool Ask(int fd) noexcept {
    socklen_t plen = sizeof(peer), llen = sizeof(local);
    return sys::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0 &&
           sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0 &&
           wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&peer), &client) &&
           wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &server);
  }
  const sockaddr* peer_sa() const noexcept { return reinterpret_cast<const sockaddr*>(&peer); }
  const sockaddr* local_sa() const noexcept { return reinterpret_cast<const sockaddr*>(&local); }
};

// Nothing was offered for the connection. A client that confirmed although nothing was
// registered for it believes it runs on a ring: its CONFIRM must not reach the application
// as data. (Its registration went to another process sharing the listener, or was dropped
// unaccepted after 30 s, abandoned first, so that only a client that had confirmed long
// since gets here.) Its CONFIRM is taken off the connection and declined: the client then
// sends its stream from byte 0 on TCP (ChannelControl::OnPeerDecline), and the
// application has a plain connection whose first bytes are that stream's.
Outcome NothingOffered(SlipSocket* listener, SlipSocket* s, int fd, const Ends& ends) noexcept {
  if (const AnchorPeek peek = PeekAnchor(fd); peek.Is(wire::Type::kConfirm)) {
    SLIP_LOG(kWarn,
             "fd %d: a CONFIRM arrived with nothing registered for its connection; declining "
             "it: the connection continues as plain TCP",
             fd);
    ConsumeAnchor(fd, peek);
    if (!SendDecline(fd, peek.msg.confirm.nonce, wire::DeclineReason::kNoRegistration))
      return Outcome::kDropped;  // (the client gets EOF or a reset: never our bytes as data)
    MarkPlain(s, fd, Reason::kDeclined, kRoleServer);
    return Outcome::kPlain;
  }
  Reason why = listener->no_offer;
  for (size_t i = 0; i < Transports().size(); ++i) {
    ListenerTwin* twin = listener->twins[i].get();
    const Reason refused = twin ? twin->Refused(ends.client, ends.server) : Reason::kNone;
    if (refused == Reason::kNone) continue;
    why = refused;
    break;
  }
  SLIP_LOG(kDebug, "fd %d: nothing offered for the connection from port %u: plain (%s)", fd,
           ends.client.port, ReasonName(why));
  MarkPlain(s, fd, why, kRoleServer, ends.peer_sa(), ends.local_sa());
  return Outcome::kPlain;
}

// The listener's twins, as core's server setup takes them.
struct Twins {
  explicit Twins(SlipSocket* listener) noexcept {
    for (size_t i = 0; i < TransportRegistry::kMax; ++i) at[i] = listener->twins[i].get();
  }
  ListenerTwin* at[TransportRegistry::kMax];
};

// Core's server setup (core/server_setup.h) takes, chooses and opens what the twins were
// offered; this installs the held stream, which the client's CONFIRM settles here if it
// is already queued, or later on the control thread: accept() never waits.
Outcome Negotiate(SlipSocket* listener, SlipSocket* s, int fd) noexcept {
  Ends ends;
  if (!ends.Ask(fd)) {
    MarkPlain(s, fd, Reason::kUnsupported, kRoleServer);
    return Outcome::kPlain;
  }
  ServerSetup setup;
  switch (setup.Run(Transports(), Twins(listener).at, ends.client, ends.server)) {
    case ServerSetup::Stage::kNothing:
      return NothingOffered(listener, s, fd, ends);
    case ServerSetup::Stage::kOpened: {
      Carrier* carrier = setup.carrier();
      const int rc = InstallStream(s, fd, &carrier->stream, &carrier->anchor_slot, kRoleServer);
      if (rc == 0) {
        ControlSettle(s);
        return Outcome::kAccelerated;
      }
      // Nothing changed at fd.
      setup.Fail(rc == -EMFILE ? Reason::kFdLimit : Reason::kResources);
      break;
    }
    case ServerSetup::Stage::kDrop:
    case ServerSetup::Stage::kPlain:
      break;
  }
  if (setup.stage() == ServerSetup::Stage::kDrop) {
    SLIP_LOG(kWarn, "fd %d: cannot hold a confirmed connection (%s); dropping it", fd,
             ReasonName(setup.reason()));
    return Outcome::kDropped;
  }
  MarkPlain(s, fd, setup.reason(), kRoleServer, ends.peer_sa(), ends.local_sa());
  return Outcome::kPlain;
}

// An accepted connection that cannot be tracked: what was offered for it is abandoned so
// that its client stays plain. False when the client had already committed to its CONFIRM.
bool UntrackedIsSafe(SlipSocket* listener, int fd) noexcept {
  Ends ends;
  if (!ends.Ask(fd)) return true;
  return ServerSetup::AbandonAll(Transports(), Twins(listener).at, ends.client, ends.server);
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
  if (HasTwins(s)) return true;
  s->no_offer = Reason::kPolicy;
  if (!ListenerPortAllowed(rt.config, ep.port) || Transports().size() == 0) return true;
  int reuseport = 0, v6only = 0;
  socklen_t olen = sizeof(int);
  sys::getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &reuseport, &olen);
  // Without the control thread nobody would notice a client's death or answer an offer:
  // stand no twin up then, so that every client is served plain.
  s->no_offer = Reason::kResources;
  if (!ControlReady() || !AccelListReserve()) return true;
  s->no_offer = Reason::kPeerNotSlipstream;
  olen = sizeof(int);
  if (local.ss_family == AF_INET6) sys::getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &olen);
  ListenRequest req;
  req.fd = fd;
  req.local = reinterpret_cast<sockaddr*>(&local);
  req.v6only = v6only != 0;
  req.reuseport = reuseport != 0;
  req.config = &rt.config;
  // Each twin goes up before the kernel listens: a client that finds the TCP port open
  // finds the twins too. A connection nothing was offered for is plain for the reason of
  // the first transport: the peer is not Slipstream, or that transport could not listen.
  for (size_t i = 0; i < Transports().size(); ++i) {
    Reason why = Reason::kPeerNotSlipstream;
    s->twins[i] = Transports()[i]->Listen(req, &why);
    if (i == 0 && !s->twins[i]) s->no_offer = why;
  }
  return true;
}

void SlipUnlisten(SlipSocket* s) noexcept {
  std::lock_guard<std::mutex> lock(s->mu);
  CloseTwins(s);
  s->kind = SockKind::kTcp;
}

int SlipAccept(SlipSocket* listener, int fd, sockaddr* addr, socklen_t* len, int flags) noexcept {
  // This process accepts here: its control thread does the twins' work as it arrives
  // (answers registrations). (A process that only listens, the master of pre-forked
  // workers, leaves it to the processes that accept.)
  const bool has_twins = HasTwins(listener);
  if (has_twins && listener->forked.load(std::memory_order_relaxed)) {
    for (auto& twin : listener->twins) {
      if (twin) twin->SharedByProcesses();
    }
  }
  if (has_twins && listener->acceptor_pid != NotedProcessId()) ControlWatchTwins(listener);
  for (;;) {
    int cfd = Libc().accept4(fd, addr, len, flags);
    if (cfd < 0) return cfd;
    SlipSocket* s = NewSocket(SockKind::kTcp, listener->family);
    if (!s) {
      // No memory to track it: it can only be an untracked plain socket, which is safe
      // unless its client committed and already confirmed (its CONFIRM would reach the
      // application): that one connection is refused.
      if (!UntrackedIsSafe(listener, cfd)) {
        Libc().close(cfd);
        continue;
      }
      return cfd;
    }
    s->nonblocking.store(flags & SOCK_NONBLOCK, std::memory_order_relaxed);
    s->rcvbuf.store(listener->rcvbuf.load(std::memory_order_relaxed), std::memory_order_relaxed);
    // (The kernel gives the listener's SO_ZEROCOPY to each connection.)
    s->kernel_only.store(listener->kernel_only.load(std::memory_order_relaxed),
                         std::memory_order_relaxed);
    s->sndbuf.store(listener->sndbuf.load(std::memory_order_relaxed), std::memory_order_relaxed);
    Outcome outcome = Outcome::kPlain;
    if (has_twins) {
      outcome = Negotiate(listener, s, cfd);
    } else {
      MarkPlain(s, cfd, listener->no_offer, kRoleServer);
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
