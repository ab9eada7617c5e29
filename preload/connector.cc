// The connector (preload/connector.h): one service thread drives every non-blocking verbs
// connect of the process, through rdma_cm's asynchronous events, so that many connections'
// exchanges overlap and connect() itself never waits for any of them.
//
// A job's life, all on the thread except its start (docs/DESIGN.md, "Non-blocking connect
// over verbs"):
//   connect()   negative cache, StartResolve, the filled proxy at the application's number,
//               the TCP socket hidden; EINPROGRESS
//   resolved    bind the TCP socket to the RDMA route's source, send the REQ
//   accepted    (the REP came, the queue pair is ready) connect the TCP socket: the SYN
//   established CONFIRM, the stream installed behind the proxy, the fill drained: EPOLLOUT
//   failure     before the SYN: the plain connect; either way the TCP socket goes back to
//               the application's number with its epoll registrations
// The swap of the number happens under the socket's mutex after checking that the number
// still refers to the socket: close(), dup2() and dup3() of a connecting socket take the
// same mutex, so the thread never writes over a number the application reused.
#include "preload/connector.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/log.h"
#include "core/no_destructor.h"
#include "core/proxy.h"
#include "core/sys.h"
#include "preload/fd_table.h"
#include "preload/handshake.h"
#include "preload/install.h"
#include "preload/libc.h"
#include "preload/runtime.h"
#include "verbs/verbs.h"

namespace slip::preload {

namespace {

constexpr int kRoleClient = 0;
// The thread also looks at deadlines this often: a job whose event descriptor could not be
// watched still progresses.
constexpr int kMaxSleepMs = 250;

struct Job {
  SlipSocket* s = nullptr;  // one reference, the job's
  int fd = -1;              // the application's number (the proxy while connecting)
  int tcp = -1;             // the TCP socket, hidden (s->anchor_fd meanwhile)
  int proxy_a = -1, proxy_b = -1;
  sockaddr_storage dest{};
  socklen_t dest_len = 0;
  verbs::Module* m = nullptr;
  verbs::ClientConn* conn = nullptr;
  int cm_fd = -1;            // conn's event descriptor while it is in the epoll set
  bool tcp_watched = false;  // the SYN is out: the TCP socket is in the epoll set
  uint64_t tcp_deadline = 0;
  uint64_t nonce = 0;
  uint32_t ring_size = 0;
  bool done = false;
};

struct Connector {
  std::mutex mu;  // jobs, started, epoll_fd
  std::condition_variable settled;
  std::vector<Job*> jobs;
  int epoll_fd = -1;
  bool started = false;
};

Connector& Get() noexcept {
  static NoDestructor<Connector> c;  // the thread may outlive exit
  return *c;
}

uint64_t SettleBoundMs() noexcept {
  // Resolve, REQ/REP and the TCP handshake are each bounded by the handshake timeout.
  return 3 * uint64_t(GetRuntime().config.handshake_timeout_ms) + 1000;
}

void UnwatchCm(Job* j) noexcept {
  if (j->cm_fd < 0) return;
  sys::epoll_ctl(Get().epoll_fd, EPOLL_CTL_DEL, j->cm_fd, nullptr);
  j->cm_fd = -1;
}

void UnwatchTcp(Job* j) noexcept {
  if (!j->tcp_watched) return;
  sys::epoll_ctl(Get().epoll_fd, EPOLL_CTL_DEL, j->tcp, nullptr);
  j->tcp_watched = false;
}

void DropConn(Job* j) noexcept {
  UnwatchCm(j);
  if (j->conn) j->m->Abort(j->conn);  // the listener drops its pending request
  j->conn = nullptr;
}

// The application closed or replaced its number: nothing of the job is anyone's now.
void AbandonLocked(Job* j) noexcept {
  DropConn(j);
  UnwatchTcp(j);
  sys::close(j->tcp);
  sys::close(j->proxy_a);
  sys::close(j->proxy_b);
  j->s->anchor_fd = -1;
  j->s->kind = SockKind::kPlain;
  j->s->connecting.store(false, std::memory_order_release);
  j->done = true;
  SLIP_LOG(kDebug, "fd %d: closed while connecting", j->fd);
}

// Moves the TCP socket back to the application's number (under s->mu), with the epoll
// registrations made on the number meanwhile. `connected`: the connection is up (it is
// counted now); otherwise it is counted once it carries data, as a plain non-blocking
// connect is.
void SwapBackLocked(Job* j, Reason reason, bool connected) noexcept {
  SlipSocket* s = j->s;
  const int fd = j->fd;
  DropConn(j);
  UnwatchTcp(j);
  if (!TableHolds(fd, s)) {
    AbandonLocked(j);
    return;
  }
  int fd_flags = sys::fcntl(fd, F_GETFD);
  // epoll keys registrations on (file, number): off the proxy's file before the number
  // moves, back on the TCP socket's after.
  std::erase_if(s->epoll_regs, [fd](const SlipSocket::EpollReg& r) { return r.fd != fd; });
  for (const SlipSocket::EpollReg& reg : s->epoll_regs)
    sys::epoll_ctl(reg.epfd, EPOLL_CTL_DEL, fd, nullptr);
  if (sys::dup3(j->tcp, fd, (fd_flags > 0 && (fd_flags & FD_CLOEXEC)) ? O_CLOEXEC : 0) < 0) {
    // Cannot happen for an open number short of a kernel race (EBUSY); the application
    // must not wait forever on a proxy that nothing will fill: end it (EOF, hang-up).
    SLIP_LOG(kError, "fd %d: cannot put the TCP socket back (errno %d); ending it", fd, errno);
    for (SlipSocket::EpollReg& reg : s->epoll_regs)
      sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event);
    sys::shutdown(j->proxy_b, SHUT_RDWR);
    proxy::Unfill(j->proxy_b);
    AbandonLocked(j);
    return;
  }
  for (SlipSocket::EpollReg& reg : s->epoll_regs) {
    if (sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event) != 0)
      SLIP_LOG(kWarn, "fd %d: cannot move its epoll registration back (errno %d)", fd, errno);
  }
  // Only while connected are the registrations worth remembering (close() ends a proxy's).
  s->epoll_regs.clear();
  sys::close(j->tcp);
  sys::close(j->proxy_a);
  sys::close(j->proxy_b);
  s->anchor_fd = -1;
  s->kind = SockKind::kPlain;
  if (connected) {
    MarkPlain(s, fd, reason, kRoleClient, reinterpret_cast<const sockaddr*>(&j->dest));
  } else {
    s->pending_reason = reason;
    s->stats_pending.store(true, std::memory_order_release);
  }
  s->connecting.store(false, std::memory_order_release);
  j->done = true;
}

void SwapBack(Job* j, Reason reason, bool connected) noexcept {
  std::lock_guard<std::mutex> lock(j->s->mu);
  SwapBackLocked(j, reason, connected);
}

// Verbs is not used (no Slipstream listener, no path, a timeout): the application's
// connect, plain, then the TCP socket back at its number, where it completes as usual.
void Fallback(Job* j, Reason why) noexcept {
  SLIP_LOG(kInfo, "fd %d: verbs not used (%s)", j->fd, ReasonName(why));
  DropConn(j);
  int rc = Libc().connect(j->tcp, reinterpret_cast<const sockaddr*>(&j->dest), j->dest_len);
  if (rc != 0 && errno != EINPROGRESS) {
    // (A refusal from this host arrives inside connect(): the socket keeps no error.)
    SLIP_LOG(kInfo, "fd %d: the plain connect failed at once (errno %d)", j->fd, errno);
    j->s->connect_error.store(errno, std::memory_order_relaxed);
  }
  SwapBack(j, why, rc == 0);
}

// The TCP connection is up and the queue pair ready: CONFIRM, then the stream.
void Established(Job* j) noexcept {
  UnwatchTcp(j);
  if (SendConfirm(j->tcp, j->nonce, j->ring_size) < 0) {
    // The connection broke right away; the application will see that on TCP.
    SwapBack(j, Reason::kResources, true);
    return;
  }
  UnwatchCm(j);
  std::unique_ptr<Channel> channel = j->m->Finish(j->conn, j->proxy_b);  // consumes conn
  j->conn = nullptr;
  SlipSocket* s = j->s;
  std::lock_guard<std::mutex> lock(s->mu);
  if (!TableHolds(j->fd, s)) {
    channel.reset();
    AbandonLocked(j);
    return;
  }
  if (!channel || InstallBehindProxy(s, j->fd, std::move(channel), j->proxy_a, j->proxy_b, j->tcp,
                                     kRoleClient) < 0) {
    // CONFIRM is in the stream: plain TCP is not safe any more; fail it as TCP would.
    const int fd = j->fd;
    SwapBackLocked(j, Reason::kResources, true);
    if (TableHolds(fd, s)) ResetAfterConfirm(s, fd);
    return;
  }
  // The stream owns the TCP socket and both proxy ends now.
  s->connecting.store(false, std::memory_order_release);
  j->done = true;
  // EPOLLOUT: the application's connect has completed.
  proxy::Unfill(j->proxy_b);
}

// Resolved: the TCP socket bound to the route's source, then the request (REQ, or a
// parked queue pair's CLAIM) for the now known 4-tuple. kNone when it went; else why not.
Reason SendRequest(verbs::Module* m, verbs::ClientConn* conn, SlipSocket* s, int fd, int tcp,
                   const sockaddr* dest, const sockaddr_storage& source, uint64_t* nonce) noexcept {
  wire::Endpoint client, server;
  wire::EndpointFromSockaddr(dest, &server);
  if (!BindToRdmaSource(s, tcp, source, &client)) return Reason::kUnsupported;
  *nonce = sys::RandomNonce();
  SLIP_LOG(kDebug, "fd %d: verbs request from port %u", fd, client.port);
  Reason why = Reason::kNone;
  if (!m->StartHandshake(conn, client, server, *nonce, GetRuntime().config.ring_size, &why))
    return why;
  return Reason::kNone;
}

void StepRdma(Job* j) noexcept {
  sockaddr_storage source{};
  Reason why = Reason::kNone;
  switch (j->m->Advance(j->conn, &source, &why)) {
    case verbs::Module::Step::kWaiting:
      return;
    case verbs::Module::Step::kResolved:
      why = SendRequest(j->m, j->conn, j->s, j->fd, j->tcp,
                        reinterpret_cast<const sockaddr*>(&j->dest), source, &j->nonce);
      if (why != Reason::kNone) Fallback(j, why);
      return;
    case verbs::Module::Step::kAccepted: {
      // Only now the SYN: the listener holds the request before the connection can reach
      // its accept(), which makes its classification race-free.
      UnwatchCm(j);
      int rc = Libc().connect(j->tcp, reinterpret_cast<const sockaddr*>(&j->dest), j->dest_len);
      if (rc == 0) return Established(j);
      if (errno == EINPROGRESS) {
        epoll_event ev{};
        ev.events = EPOLLOUT;
        ev.data.ptr = j;
        j->tcp_watched = sys::epoll_ctl(Get().epoll_fd, EPOLL_CTL_ADD, j->tcp, &ev) == 0;
        j->tcp_deadline = sys::MonotonicMs() + GetRuntime().config.handshake_timeout_ms;
        if (!j->tcp_watched) {
          // Unwatched, the deadline scan would only see it at the end: go plain now.
          SwapBack(j, Reason::kResources, false);
        }
        return;
      }
      // The SYN could not leave (no route, say): the application finds the socket as a
      // failed non-blocking connect leaves it.
      SLIP_LOG(kInfo, "fd %d: connect failed at once (errno %d)", j->fd, errno);
      j->s->connect_error.store(errno, std::memory_order_relaxed);
      SwapBack(j, Reason::kConnectSlow, false);
      return;
    }
    case verbs::Module::Step::kFailed:
      return Fallback(j, why);
  }
}

void StepTcp(Job* j) noexcept {
  pollfd p{j->tcp, POLLOUT, 0};
  sys::poll(&p, 1, 0);
  if (p.revents & (POLLERR | POLLHUP)) {
    // Refused or reset: the error stays pending on the socket (SO_ERROR is not read here),
    // for the application to find at its number.
    SwapBack(j, Reason::kConnectSlow, false);
    return;
  }
  if (p.revents & POLLOUT) {
    sockaddr_storage peer;
    socklen_t plen = sizeof(peer);
    if (sys::getpeername(j->tcp, reinterpret_cast<sockaddr*>(&peer), &plen) == 0)
      return Established(j);
    SwapBack(j, Reason::kConnectSlow, false);
    return;
  }
  if (sys::MonotonicMs() >= j->tcp_deadline) {
    // As the blocking path: a TCP handshake slower than the handshake timeout goes on
    // plain (the listener drops its pending request and treats the SYN as plain).
    SwapBack(j, Reason::kConnectSlow, false);
  }
}

void Step(Job* j) noexcept {
  if (j->done) return;
  if (!TableHolds(j->fd, j->s)) {  // closed meanwhile: give up early (checked again locked)
    std::lock_guard<std::mutex> lock(j->s->mu);
    if (!TableHolds(j->fd, j->s)) {
      AbandonLocked(j);
      return;
    }
  }
  if (j->tcp_watched) {
    StepTcp(j);
  } else {
    StepRdma(j);
  }
}

uint64_t DeadlineOf(Job* j) noexcept {
  return j->tcp_watched ? j->tcp_deadline : j->m->Deadline(j->conn);
}

void* Main(void*) {
  Connector& c = Get();
  epoll_event events[64];
  std::vector<Job*> snapshot;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(c.mu);
      try {
        snapshot = c.jobs;
      } catch (...) {
        snapshot.clear();
      }
    }
    uint64_t now = sys::MonotonicMs();
    int timeout = kMaxSleepMs;
    for (Job* j : snapshot) {
      uint64_t d = DeadlineOf(j);
      timeout = std::min<int>(timeout, d > now ? int(std::min<uint64_t>(d - now, kMaxSleepMs)) : 0);
    }
    int n = sys::epoll_wait(c.epoll_fd, events, 64, timeout);
    for (int i = 0; i < n; ++i) Step(static_cast<Job*>(events[i].data.ptr));
    // Deadlines (and jobs added since the snapshot simply wait for the next round).
    now = sys::MonotonicMs();
    for (Job* j : snapshot) {
      if (!j->done && DeadlineOf(j) <= now) Step(j);
    }
    std::vector<Job*> finished;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      for (size_t i = 0; i < c.jobs.size();) {
        if (c.jobs[i]->done) {
          try {
            finished.push_back(c.jobs[i]);
          } catch (...) {
            ++i;  // reaped next round
            continue;
          }
          c.jobs[i] = c.jobs.back();
          c.jobs.pop_back();
        } else {
          ++i;
        }
      }
    }
    for (Job* j : finished) {
      Release(j->s);
      delete j;
    }
    if (!finished.empty()) {
      std::lock_guard<std::mutex> lock(c.mu);
      c.settled.notify_all();
    }
  }
  return nullptr;
}

bool EnsureStarted() noexcept {
  Connector& c = Get();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.started) return true;
  if (c.epoll_fd < 0) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return false;
    c.epoll_fd = sys::MoveHigh(ep, sys::HiddenFdFloor());
  }
  if (sys::StartServiceThread(Main, nullptr, "slip-connect") != 0) return false;
  c.started = true;
  return true;
}

}  // namespace

Reason ConnectInBackground(SlipSocket* s, int fd, const sockaddr* addr, socklen_t len) noexcept {
  Reason why = Reason::kNone;
  verbs::Module* m = VerbsCandidate(s, fd, addr, &why);
  if (!m) return why;
  if (!EnsureStarted()) return Reason::kResources;
  // The negative cache answers here, before anything changes: a plain peer costs nothing.
  verbs::ClientConn* conn = m->StartResolve(addr, &why);
  if (!conn) return why;
  // A parked queue pair (docs/DESIGN.md "Reusing queue pairs") is resolved at once: its
  // CLAIM leaves now, and the thread only waits for the answer (no event would wake it
  // for a step that has nothing to wait for).
  uint64_t nonce = 0;
  sockaddr_storage source{};
  switch (m->Advance(conn, &source, &why)) {
    case verbs::Module::Step::kResolved:
      why = SendRequest(m, conn, s, fd, fd, addr, source, &nonce);
      if (why != Reason::kNone) {
        m->Abort(conn);
        return why;
      }
      break;
    case verbs::Module::Step::kFailed:
      m->Abort(conn);
      return why;
    default:
      break;
  }
  auto* j = new (std::nothrow) Job();
  int pair[2] = {-1, -1};
  const int fd_flags = sys::fcntl(fd, F_GETFD);
  const int fl_flags = sys::fcntl(fd, F_GETFL);
  int tcp = -1;
  if (j && fd_flags >= 0 && fl_flags >= 0 && proxy::CreatePair(pair) == 0) {
    tcp = sys::DupHigh(fd, sys::HiddenFdFloor());
  }
  bool queued = false;
  if (tcp >= 0) {
    std::lock_guard<std::mutex> lock(Get().mu);
    try {
      Get().jobs.reserve(Get().jobs.size() + 1);
      queued = true;
    } catch (...) {
    }
  }
  if (!queued) {
    if (tcp >= 0) sys::close(tcp);
    if (pair[0] >= 0) sys::close(pair[0]);
    if (pair[1] >= 0) sys::close(pair[1]);
    delete j;
    m->Abort(conn);
    return Reason::kResources;
  }
  j->s = s;
  j->fd = fd;
  j->tcp = tcp;
  j->proxy_a = sys::MoveHigh(pair[0], sys::HiddenFdFloor());
  j->proxy_b = sys::MoveHigh(pair[1], sys::HiddenFdFloor());
  std::memcpy(&j->dest, addr, std::min<size_t>(len, sizeof(j->dest)));
  j->dest_len = len;
  j->m = m;
  j->conn = conn;
  j->nonce = nonce;
  j->ring_size = GetRuntime().config.ring_size;
  // Neither readable nor writable, as a connecting TCP socket polls; the file status flags
  // (O_NONBLOCK) are the application's.
  proxy::Fill(j->proxy_a);
  sys::fcntl(j->proxy_a, F_SETFL, fl_flags);
  // The swap, as InstallAccelerated does it: registrations off the TCP socket's file,
  // the number to the proxy, registrations onto the proxy's file.
  std::erase_if(s->epoll_regs, [fd](const SlipSocket::EpollReg& r) { return r.fd != fd; });
  for (const SlipSocket::EpollReg& reg : s->epoll_regs)
    sys::epoll_ctl(reg.epfd, EPOLL_CTL_DEL, fd, nullptr);
  if (sys::dup3(j->proxy_a, fd, (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
    for (SlipSocket::EpollReg& reg : s->epoll_regs)
      sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event);
    sys::close(j->tcp);
    sys::close(j->proxy_a);
    sys::close(j->proxy_b);
    delete j;
    m->Abort(conn);
    return Reason::kResources;
  }
  for (SlipSocket::EpollReg& reg : s->epoll_regs) {
    if (sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event) != 0)
      SLIP_LOG(kWarn, "fd %d: cannot move its epoll registration (errno %d)", fd, errno);
  }
  s->anchor_fd = tcp;
  s->kind = SockKind::kConnecting;
  s->connecting.store(true, std::memory_order_release);
  Acquire(s);  // the job's reference
  j->cm_fd = m->EventFd(conn);
  // Watched before it is listed: from here on the thread may step the job (it waits for
  // s->mu, held by our caller, before it touches the number).
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = j;
  // (Unwatched, the job still progresses at the thread's periodic deadline scan; its
  // later EPOLL_CTL_DEL then fails harmlessly.)
  sys::epoll_ctl(Get().epoll_fd, EPOLL_CTL_ADD, j->cm_fd, &ev);
  {
    std::lock_guard<std::mutex> lock(Get().mu);
    try {
      Get().jobs.push_back(j);  // reserved above; another caller may have taken the room
    } catch (...) {
      // Out of memory: the job still runs (it is watched) but is never reaped; its
      // socket reference leaks. Said, since it cannot be undone here.
      SLIP_LOG(kWarn, "fd %d: out of memory listing a connect", fd);
    }
  }
  SLIP_LOG(kDebug, "fd %d: connecting over verbs in the background", fd);
  return Reason::kNone;
}

void WaitConnectSettled(SlipSocket* s) noexcept {
  if (!s->connecting.load(std::memory_order_acquire)) return;
  Connector& c = Get();
  std::unique_lock<std::mutex> lock(c.mu);
  c.settled.wait_for(lock, std::chrono::milliseconds(SettleBoundMs()),
                     [s] { return !s->connecting.load(std::memory_order_acquire); });
}

void ConnectorForkPrepare() noexcept {
  Connector& c = Get();
  std::unique_lock<std::mutex> lock(c.mu);
  if (c.jobs.empty()) return;
  c.settled.wait_for(lock, std::chrono::milliseconds(SettleBoundMs()),
                     [&c] { return c.jobs.empty(); });
  if (!c.jobs.empty())
    SLIP_LOG(kWarn,
             "fork or exec: %zu connect(s) still in progress; their copies in the child (or "
             "the exec'd program) never complete",
             c.jobs.size());
}

}  // namespace slip::preload
