// The server side of detect-and-negotiate.
//
// accept() classifies each connection before the application sees it: no registration
// for its 4-tuple means plain, untouched. A registration means the client proved it runs
// Slipstream out of band; its first in-band bytes must then be a CONFIRM carrying the
// registration's nonce. Anything else in those bytes is a plain client (a forged
// registration), and its bytes stay in the socket for the application.
#include <netinet/in.h>
#include <poll.h>

#include <cerrno>
#include <ctime>
#include <vector>

#include "core/log.h"
#include "core/sys.h"
#include "core/wire.h"
#include "preload/control.h"
#include "preload/fd_table.h"
#include "preload/handshake.h"
#include "preload/install.h"
#include "preload/libc.h"
#include "preload/runtime.h"
#include "shm/shm.h"

namespace slip::preload {

namespace {

constexpr int kRoleServer = 1;

enum class Outcome { kAccelerated, kPlain, kDropped };

int64_t MonotonicMs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

void SendDecline(int fd, uint64_t nonce, wire::DeclineReason reason) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kDecline;
  msg.decline = wire::Decline{nonce, reason};
  SendInBand(fd, msg);
}

bool SendAccept(int fd, uint64_t nonce) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kAccept;
  msg.accept = wire::Accept{nonce};
  return SendInBand(fd, msg) == 0;
}

// Waits for the client's first bytes. Returns kOk with the CONFIRM consumed, kNotSlipstream
// (bytes left in place, or EOF), or kNeedMore on timeout / cancellation (*cancelled set).
wire::ParseStatus ReadConfirm(int fd, shm::Rendezvous* rv, const wire::Endpoint& client,
                              const wire::Endpoint& server,
                              const std::vector<shm::Registration>& regs, wire::Confirm* confirm,
                              bool* cancelled) noexcept {
  const int64_t deadline = MonotonicMs() + GetRuntime().config.handshake_timeout_ms;
  uint8_t buf[wire::kMaxMessageSize];
  for (;;) {
    ssize_t n = sys::recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return wire::ParseStatus::kNotSlipstream;  // EOF: nothing of ours in there
    if (n > 0) {
      wire::Message msg;
      size_t used = 0;
      wire::ParseStatus st = wire::ParseMessage(buf, size_t(n), &msg, &used);
      if (st == wire::ParseStatus::kOk && msg.type == wire::Type::kConfirm) {
        sys::recv(fd, buf, used, MSG_DONTWAIT);
        *confirm = msg.confirm;
        return st;
      }
      if (st != wire::ParseStatus::kNeedMore) return wire::ParseStatus::kNotSlipstream;
    } else if (errno != EAGAIN && errno != EINTR) {
      return wire::ParseStatus::kNotSlipstream;  // the application will see the error itself
    }
    for (const shm::Registration& r : regs) {
      if (rv->Cancelled(client, server, r.msg.nonce)) {
        *cancelled = true;
        return wire::ParseStatus::kNeedMore;
      }
    }
    int64_t left = deadline - MonotonicMs();
    if (left <= 0) return wire::ParseStatus::kNeedMore;
    pollfd p[2] = {{fd, POLLIN, 0}, {rv->fd(), POLLIN, 0}};
    // A partial CONFIRM keeps POLLIN set; sleep briefly instead of spinning on it.
    if (n > 0) left = 1;
    sys::poll(p, 2, int(left > 100 ? 100 : left));
  }
}

Outcome Negotiate(SlipSocket* listener, SlipSocket* s, int fd) noexcept {
  sockaddr_storage local{}, remote{};
  socklen_t llen = sizeof(local), rlen = sizeof(remote);
  wire::Endpoint client, server;
  if (sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      sys::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen) != 0 ||
      !wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&remote), &client) ||
      !wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &server)) {
    MarkPlain(s, fd, Reason::kUnsupported, kRoleServer);
    return Outcome::kPlain;
  }
  std::vector<shm::Registration> regs;
  try {
    listener->rendezvous->Take(client, server, &regs);
  } catch (...) {
    regs.clear();
  }
  if (regs.empty()) {
    MarkPlain(s, fd, Reason::kPeerNotSlipstream, kRoleServer);
    return Outcome::kPlain;
  }
  wire::Confirm confirm;
  bool cancelled = false;
  wire::ParseStatus st =
      ReadConfirm(fd, listener->rendezvous.get(), client, server, regs, &confirm, &cancelled);
  if (st != wire::ParseStatus::kOk) {
    Reason why = cancelled                            ? Reason::kConnectSlow
                 : st == wire::ParseStatus::kNeedMore ? Reason::kHandshakeTimeout
                                                      : Reason::kPeerNotSlipstream;
    if (!cancelled)
      SLIP_LOG(kInfo, "fd %d: registered client sent no CONFIRM (%s); plain", fd, ReasonName(why));
    MarkPlain(s, fd, why, kRoleServer);
    return Outcome::kPlain;
  }
  wire::DeclineReason decline = wire::DeclineReason::kNonceMismatch;
  if (!ControlReady()) {
    // Nobody could notice the client's death: decline rather than risk a hang.
    regs.clear();
    decline = wire::DeclineReason::kResources;
  }
  for (shm::Registration& reg : regs) {
    if (reg.msg.nonce != confirm.nonce) continue;
    int proxy_a = -1, proxy_b = -1;
    auto channel = shm::AcceptRegistration(&reg, confirm, &proxy_a, &proxy_b, &decline);
    if (!channel) break;
    if (!SendAccept(fd, confirm.nonce)) {
      sys::close(proxy_a);
      sys::close(proxy_b);
      decline = wire::DeclineReason::kResources;
      break;
    }
    if (InstallAccelerated(s, fd, std::move(channel), proxy_a, proxy_b, kRoleServer) < 0) {
      // ACCEPT is out; the client already writes to the ring. Reset rather than corrupt.
      sys::close(proxy_a);
      sys::close(proxy_b);
      return Outcome::kDropped;
    }
    return Outcome::kAccelerated;
  }
  SLIP_LOG(kWarn, "fd %d: declining a registered connection (reason %u)", fd, unsigned(decline));
  SendDecline(fd, confirm.nonce, decline);
  return Outcome::kDropped;
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
  if (s->rendezvous) return true;
  s->no_rendezvous = Reason::kPolicy;
  if (!rt.config.Allows(TransportKind::kShm) || !ListenerPortAllowed(rt.config, ep.port))
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
  s->no_rendezvous = Reason::kPeerNotSlipstream;
  olen = sizeof(int);
  if (local.ss_family == AF_INET6) sys::getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &olen);
  int err = 0;
  s->rendezvous = shm::Rendezvous::Publish(reinterpret_cast<sockaddr*>(&local), v6only != 0, &err);
  if (!s->rendezvous)
    SLIP_LOG(kInfo, "fd %d: no rendezvous (errno %d); connections stay plain", fd, -err);
  return true;
}

void SlipUnlisten(SlipSocket* s) noexcept {
  std::lock_guard<std::mutex> lock(s->mu);
  s->rendezvous.reset();
  s->kind = SockKind::kTcp;
}

int SlipAccept(SlipSocket* listener, int fd, sockaddr* addr, socklen_t* len, int flags) noexcept {
  for (;;) {
    int cfd = Libc().accept4(fd, addr, len, flags);
    if (cfd < 0) return cfd;
    SlipSocket* s = NewSocket(SockKind::kTcp, listener->family);
    if (!s) return cfd;  // cannot track it: it stays an untracked plain socket
    s->nonblocking.store(flags & SOCK_NONBLOCK, std::memory_order_relaxed);
    Outcome outcome = Outcome::kPlain;
    if (listener->rendezvous) {
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
