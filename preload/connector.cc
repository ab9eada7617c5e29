// The connector (preload/connector.h): one service thread drives every non-blocking
// connect of the process whose offer must wait (verbs: rdma_cm's asynchronous events), so
// that many connections' exchanges overlap and connect() itself never waits for any of
// them. Each job is a ClientSetup (core/client_setup.h) stepped on its news.
//
// A job's life, all on the thread except its start (docs/DESIGN.md, "Non-blocking
// connect"):
//   connect()   the probe and the offer's first step, the filled proxy at the
//               application's number, the TCP socket hidden; EINPROGRESS
//   kOffer      the offer's exchange (verbs: resolve, bind, REQ or CLAIM, the answer)
//   SYN         once the listener holds the offer; kTcpHandshake until it is up
//   kCarried    the stream installed behind the proxy, the fill drained: EPOLLOUT
//   kPlain      before the SYN: the plain connect; either way the TCP socket goes back to
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

#include "core/client_setup.h"
#include "core/log.h"
#include "core/no_destructor.h"
#include "core/proxy.h"
#include "core/sanitizer.h"
#include "core/sys.h"
#include "preload/control.h"
#include "preload/fd_table.h"
#include "preload/handshake.h"
#include "preload/install.h"
#include "preload/libc.h"
#include "preload/runtime.h"

namespace slip::preload {

namespace {

constexpr int kRoleClient = 0;
// The thread also looks at deadlines this often: a job whose descriptor could not be
// watched still progresses.
constexpr int kMaxSleepMs = 250;

struct Job {
  explicit Job(ClientSetup&& s) noexcept : setup(std::move(s)) {}
  SlipSocket* s = nullptr;  // one reference, the job's
  int fd = -1;              // the application's number (the proxy while connecting)
  int tcp = -1;             // the TCP socket, hidden (s->anchor_fd meanwhile)
  // Duplicates of the offer's proxy ends, the job's own: the offer may go (withdrawn)
  // while the application's number still shows the proxy, which must not hang up then.
  int proxy_a = -1, proxy_b = -1;
  ClientSetup setup;
  int watched = -1;  // the descriptor in the epoll set for this job, if any
  uint32_t watched_events = 0;
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
  // The offer's exchange and the TCP handshake are each bounded by the handshake timeout.
  return 3 * uint64_t(GetRuntime().config.handshake_timeout_ms) + 1000;
}

void Unwatch(Job* j) noexcept {
  if (j->watched < 0) return;
  sys::epoll_ctl(Get().epoll_fd, EPOLL_CTL_DEL, j->watched, nullptr);
  j->watched = -1;
}

// Watches what the machine waits for now. False when it cannot be watched.
bool Watch(Job* j) noexcept {
  const ClientSetup::Wait w = j->setup.NextWait(j->tcp);
  const uint32_t events = w.events == POLLOUT ? EPOLLOUT : EPOLLIN;
  if (w.fd == j->watched && events == j->watched_events) return true;
  Unwatch(j);
  if (w.fd < 0) return true;
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = j;
  j->watched = w.fd;  // (before the thread can see an event for it)
  j->watched_events = events;
  // What the job holds reaches the thread through the kernel (the event's data), which
  // orders it: ThreadSanitizer is told so (core/sanitizer.h), as it cannot see this call.
  san::HappensBefore(j);
  if (sys::epoll_ctl(Get().epoll_fd, EPOLL_CTL_ADD, w.fd, &ev) == 0) return true;
  j->watched = -1;
  return false;
}

void CloseOwn(Job* j) noexcept {
  sys::close(j->proxy_a);
  sys::close(j->proxy_b);
  j->proxy_a = j->proxy_b = -1;
}

// The application closed or replaced its number: nothing of the job is anyone's now.
void AbandonLocked(Job* j) noexcept {
  Unwatch(j);
  j->setup.GiveUp(Reason::kConnectSlow);  // withdraws the offer, if it is still out
  sys::close(j->tcp);
  CloseOwn(j);
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
  Unwatch(j);
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
  CloseOwn(j);
  s->anchor_fd = -1;
  s->kind = SockKind::kPlain;
  if (connected) {
    MarkPlain(s, fd, reason, kRoleClient, j->setup.request().dest());
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

// No offer before the SYN (no Slipstream listener, no path, a timeout): the application's
// connect, plain, then the TCP socket back at its number, where it completes as usual.
void Fallback(Job* j, Reason why) noexcept {
  const ConnectRequest& req = j->setup.request();
  int rc = Libc().connect(j->tcp, req.dest(), req.dest_len);
  if (rc != 0 && errno != EINPROGRESS) {
    // (A refusal from this host arrives inside connect(): the socket keeps no error.)
    SLIP_LOG(kInfo, "fd %d: the plain connect failed at once (errno %d)", j->fd, errno);
    j->s->connect_error.store(errno, std::memory_order_relaxed);
  }
  SwapBack(j, why, rc == 0);
}

// The stream is built: it goes in behind the proxy the application already holds.
void Carried(Job* j) noexcept {
  Unwatch(j);
  Carrier* carrier = j->setup.carrier();
  SlipSocket* s = j->s;
  std::lock_guard<std::mutex> lock(s->mu);
  if (!TableHolds(j->fd, s)) {
    carrier->stream.reset();
    AbandonLocked(j);
    return;
  }
  if (InstallBehindProxy(s, j->fd, &carrier->stream, j->tcp, kRoleClient) < 0) {
    const int fd = j->fd;
    SwapBackLocked(j, Reason::kResources, true);
    // A CONFIRM in the stream: plain TCP is not safe any more; fail it as TCP would.
    if (carrier->confirmed && TableHolds(fd, s)) ResetAfterConfirm(s, fd);
    return;
  }
  // EPOLLOUT: the application's connect has completed.
  proxy::Unfill(j->proxy_b);
  // The stream owns the TCP socket and the proxy ends now (the job's duplicates go).
  CloseOwn(j);
  s->connecting.store(false, std::memory_order_release);
  j->done = true;
  // Unsettled (verbs to a listener that shares its port: the CONFIRM waits for the
  // accepting process's word): the control thread settles it.
  if (s->stream && s->stream->control()->SettleDeadline() != 0) ControlSettle(s);
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
  ClientSetup& setup = j->setup;
  switch (setup.Step(j->tcp)) {
    case ClientSetup::Stage::kProbe:
    case ClientSetup::Stage::kOffer:
      Watch(j);  // (unwatched, it still progresses at the deadline scan)
      return;
    case ClientSetup::Stage::kTcpHandshake:
      // Unwatched, the deadline scan would only see it at the end: go plain now.
      if (!Watch(j)) SwapBack(j, Reason::kResources, false);
      return;
    case ClientSetup::Stage::kCarried:
      return Carried(j);
    case ClientSetup::Stage::kPlain:
      Unwatch(j);
      if (!setup.syn_sent()) return Fallback(j, setup.reason());
      if (setup.syn_rc() != 0 && setup.syn_errno() != EINPROGRESS && setup.syn_errno() != EINTR) {
        // The SYN could not leave (no route, say): the application finds the socket as a
        // failed non-blocking connect leaves it.
        SLIP_LOG(kInfo, "fd %d: connect failed at once (errno %d)", j->fd, setup.syn_errno());
        j->s->connect_error.store(setup.syn_errno(), std::memory_order_relaxed);
      }
      return SwapBack(j, setup.reason(), setup.connected());
    case ClientSetup::Stage::kReset: {
      SlipSocket* s = j->s;
      const int fd = j->fd;
      std::lock_guard<std::mutex> lock(s->mu);
      SwapBackLocked(j, Reason::kResources, true);
      if (TableHolds(fd, s)) ResetAfterConfirm(s, fd);
      return;
    }
  }
}

uint64_t DeadlineOf(Job* j) noexcept {
  return j->setup.NextWait(j->tcp).deadline_ms;
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
    for (int i = 0; i < n; ++i) {
      auto* j = static_cast<Job*>(events[i].data.ptr);
      san::HappensAfter(j);  // (Watch's pair)
      Step(j);
    }
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

bool ConnectInBackground(SlipSocket* s, int fd, ClientSetup* setup) noexcept {
  if (!EnsureStarted()) return false;
  int offer_a = -1, offer_b = -1;
  if (!setup->offer()->Proxies(&offer_a, &offer_b)) return false;
  auto* j = new (std::nothrow) Job(std::move(*setup));
  if (!j) return false;
  const int fd_flags = sys::fcntl(fd, F_GETFD);
  const int fl_flags = sys::fcntl(fd, F_GETFL);
  bool queued = false;
  if (fd_flags >= 0 && fl_flags >= 0) {
    j->tcp = sys::DupHigh(fd, sys::HiddenFdFloor());
    j->proxy_a = sys::DupHigh(offer_a, sys::HiddenFdFloor());
    j->proxy_b = sys::DupHigh(offer_b, sys::HiddenFdFloor());
  }
  if (j->tcp >= 0 && j->proxy_a >= 0 && j->proxy_b >= 0) {
    std::lock_guard<std::mutex> lock(Get().mu);
    try {
      Get().jobs.reserve(Get().jobs.size() + 1);
      queued = true;
    } catch (...) {
    }
  }
  auto undo = [&] {
    if (j->tcp >= 0) sys::close(j->tcp);
    CloseOwn(j);
    *setup = std::move(j->setup);  // back to the caller, which goes plain
    delete j;
  };
  if (!queued) {
    undo();
    return false;
  }
  j->s = s;
  j->fd = fd;
  // Neither readable nor writable, as a connecting TCP socket polls; the file status flags
  // (O_NONBLOCK) are the application's.
  proxy::Fill(j->proxy_a);
  sys::fcntl(j->proxy_a, F_SETFL, fl_flags);
  // The swap, as InstallStream does it: registrations off the TCP socket's file, the
  // number to the proxy, registrations onto the proxy's file.
  std::erase_if(s->epoll_regs, [fd](const SlipSocket::EpollReg& r) { return r.fd != fd; });
  for (const SlipSocket::EpollReg& reg : s->epoll_regs)
    sys::epoll_ctl(reg.epfd, EPOLL_CTL_DEL, fd, nullptr);
  if (sys::dup3(j->proxy_a, fd, (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
    for (SlipSocket::EpollReg& reg : s->epoll_regs)
      sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event);
    undo();
    return false;
  }
  for (SlipSocket::EpollReg& reg : s->epoll_regs) {
    if (sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event) != 0)
      SLIP_LOG(kWarn, "fd %d: cannot move its epoll registration (errno %d)", fd, errno);
  }
  s->anchor_fd = j->tcp;
  s->kind = SockKind::kConnecting;
  s->connecting.store(true, std::memory_order_release);
  Acquire(s);  // the job's reference
  // Watched before it is listed: from here on the thread may step the job (it waits for
  // s->mu, held by our caller, before it touches the number). (Unwatched, the job still
  // progresses at the thread's periodic deadline scan.)
  Watch(j);
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
  SLIP_LOG(kDebug, "fd %d: connecting in the background", fd);
  return true;
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
