// The client side of detect-and-negotiate, the face's part of it.
//
// core/client_setup.h sequences a connection: the registry's transports are asked in the
// user's order whether they can reach the peer, the first that can makes its out-of-band
// offer (shm: a registration at the listener's verified rendezvous; verbs: the rdma_cm
// exchange), the SYN follows once the listener holds the offer, and the stream is built
// once TCP is up (docs/DESIGN.md, "The connection engine"). This file owns what only the
// face knows: the application's descriptor number, when a non-blocking connect continues
// on the connector's thread (preload/connector.h), installing the stream behind the
// number, and the stats. A plain peer costs one failed probe per transport (shm: one
// refused AF_UNIX connect; verbs: the negative cache or a resolve): no round trip and no
// byte in the stream.
#include <fcntl.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>

#include "core/client_setup.h"
#include "core/log.h"
#include "core/no_destructor.h"
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
#include "preload/transports.h"

namespace slip::preload {

namespace {

constexpr int kRoleClient = 0;

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

// The request as the transports see it; false when the address is not one they handle.
bool MakeRequest(SlipSocket* s, int fd, const sockaddr* addr, socklen_t len,
                 ConnectRequest* req) noexcept {
  req->fd = fd;
  req->family = s->family;
  if (len > sizeof(req->dest_storage)) return false;
  std::memcpy(&req->dest_storage, addr, len);
  req->dest_len = len;
  req->config = &GetRuntime().config;
  return wire::EndpointFromSockaddr(addr, &req->server);
}

// The machine ended inline (a blocking connect, or an offer that needed no wait): the
// stream installed at `fd`, or the connection left as it stands. Returns like connect(2).
int Finish(SlipSocket* s, int fd, ClientSetup* setup) noexcept {
  const ConnectRequest& req = setup->request();
  switch (setup->stage()) {
    case ClientSetup::Stage::kCarried: {
      Carrier* carrier = setup->carrier();
      if (int irc = InstallStream(s, fd, &carrier->stream, &carrier->anchor_slot, kRoleClient);
          irc < 0) {
        // (A peer that may already carry it on the transport: reset, never plain.)
        if (carrier->confirmed || !carrier->stream->control()->WithdrawUninstalled())
          return ResetAfterConfirm(s, fd);
        // The stream goes with the carrier (an unsettled one withdraws its offer).
        MarkPlain(s, fd, irc == -EMFILE ? Reason::kFdLimit : Reason::kResources, kRoleClient,
                  req.dest());
        break;
      }
      // Unsettled (shm: its listener takes the registration when it accepts, which may be
      // later or never): the control thread settles it, the stream runs meanwhile.
      if (s->stream->control()->SettleDeadline() != 0) ControlSettle(s);
      break;
    }
    case ClientSetup::Stage::kReset:
      return ResetAfterConfirm(s, fd);
    default:  // kPlain after the SYN: the connection is the application's as it stands
      if (setup->connected() || setup->syn_errno() == EINPROGRESS || setup->syn_errno() == EINTR)
        MarkPlain(s, fd, setup->reason(), kRoleClient, req.dest());
      break;
  }
  if (setup->syn_rc() != 0) {
    errno = setup->syn_errno();  // a non-blocking connect reports EINPROGRESS as the kernel did
    return -1;
  }
  return 0;
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

  ConnectRequest req;
  if (!MakeRequest(s, fd, addr, len, &req))
    return ConnectPlain(s, fd, addr, len, Reason::kUnsupported);
  sockaddr_storage local{};
  socklen_t llen = sizeof(local);
  if (PolicyNeedsLocal(*req.config))  // (a system call a plain peer's connect need not pay)
    sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen);
  if (!PolicyAllows(*req.config, reinterpret_cast<sockaddr*>(&local), addr))
    return ConnectPlain(s, fd, addr, len, Reason::kPolicy);
  if (req.config->short_conns_adaptive) {
    if (ShortConns().Bypass(req.server, sys::MonotonicMs()))
      return ConnectPlain(s, fd, addr, len, Reason::kShortLived);
    s->judged = true;
    s->judged_dest = req.server;
  }

  ClientSetup setup(req, Libc().connect);
  if (!setup.Probe(Transports())) return ConnectPlain(s, fd, addr, len, setup.reason());
  // Only now: a plain peer must not cost a thread or a slot.
  if (!ControlReady() || !AccelListReserve()) {
    setup.GiveUp(Reason::kResources);
    return ConnectPlain(s, fd, addr, len, Reason::kResources);
  }
  setup.Step(fd);
  if (setup.stage() == ClientSetup::Stage::kOffer) {
    const int fl = sys::fcntl(fd, F_GETFL);
    if (fl >= 0 && (fl & O_NONBLOCK)) {
      // Never blocks on the exchange: it continues on the connector's thread.
      if (ConnectInBackground(s, fd, &setup)) {
        errno = EINPROGRESS;
        return -1;
      }
      setup.GiveUp(Reason::kResources);
    }
  }
  setup.Run(fd);  // (a non-blocking socket waits here only for the TCP handshake of an
                  // offer with a short budget: shm's, on this host)
  if (setup.stage() == ClientSetup::Stage::kPlain && !setup.syn_sent())
    return ConnectPlain(s, fd, addr, len, setup.reason());
  return Finish(s, fd, &setup);
}

ShortConnPolicy& ShortConns() noexcept {
  static NoDestructor<ShortConnPolicy> policy;  // connections may close during exit
  return *policy;
}

void NoteClientClosed(const wire::Endpoint& dest, const ConnSlot& slot) noexcept {
  if (slot.role != kRoleClient || slot.transport == uint8_t(TransportKind::kTcp)) return;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);  // (the slot's clock)
  const uint64_t now_ns = uint64_t(now.tv_sec) * 1000000000ull + uint64_t(now.tv_nsec);
  const uint64_t life_ms = now_ns > slot.opened_ns ? (now_ns - slot.opened_ns) / 1000000 : 0;
  const uint64_t bytes = slot.bytes_sent.load(std::memory_order_relaxed) +
                         slot.bytes_received.load(std::memory_order_relaxed);
  ShortConns().NoteClosed(dest, sys::MonotonicMs(), life_ms, bytes);
}

void RecordPendingPlain(SlipSocket* s, int fd) noexcept {
  std::lock_guard<std::mutex> lock(s->mu);
  if (!s->stats_pending.exchange(false, std::memory_order_acq_rel)) return;
  sockaddr_storage peer{};
  socklen_t plen = sizeof(peer);
  if (sys::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0)
    MarkPlain(s, fd, s->pending_reason, kRoleClient, reinterpret_cast<sockaddr*>(&peer));
}

void MarkPlain(SlipSocket* s, int fd, Reason reason, int role, const sockaddr* remote,
               const sockaddr* local) noexcept {
  s->kind = SockKind::kPlain;
  if (s->stats) return;
  sockaddr_storage own{}, peer{};
  socklen_t llen = sizeof(own), plen = sizeof(peer);
  if (!local) {
    sys::getsockname(fd, reinterpret_cast<sockaddr*>(&own), &llen);
    local = reinterpret_cast<sockaddr*>(&own);
  }
  if (!remote) {
    if (sys::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0)
      peer.ss_family = AF_UNSPEC;
    remote = reinterpret_cast<sockaddr*>(&peer);
  }
  s->stats = StatsOpen(TransportKind::kTcp, reason, role, local, remote);
}

}  // namespace slip::preload
