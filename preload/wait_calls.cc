// Interposed waits: epoll_wait, epoll_pwait, epoll_pwait2, poll, ppoll, select, pselect.
//
// Readiness of accelerated sockets lives in the kernel (their proxies), so these calls
// are never emulated: before a wait that may sleep, they (1) arm the proxies of the
// connections read since the last wait (preload/accel_list.h; the others stay armed), (2)
// ask the kernel whether anything is ready already, (3) spin briefly, asking the kernel
// again and looking at the rings of the connections that were just busy (a message that
// arrives within SLIP_SPIN_US costs no sleep), then call the real function with the
// caller's own arguments.
#include <sched.h>
#include <sys/select.h>

#include <cstring>

#include "core/sys.h"
#include "preload/accel_list.h"
#include "preload/export.h"
#include "preload/fd_table.h"
#include "preload/hidden_fds.h"
#include "preload/libc.h"
#include "preload/runtime.h"
#include "preload/transports.h"

using namespace slip;
using namespace slip::preload;

namespace {

// `call(true)` waits with a zero timeout, `call(false)` with the caller's timeout.
template <typename Call>
int SleepAware(bool may_sleep, Call&& call) noexcept {
  if (!AccelListNonEmpty()) return call(false);
  // Arming first, even for a probe or a zero timeout: a proxy shows bytes that already
  // wait in its ring only once armed, and a probe that returns early because some other
  // descriptor is ready (a writable socket, say) must still see them; otherwise a loop of
  // such calls never sees them at all.
  PrepareChangedForSleep();
  if (!may_sleep) return call(false);
  int n = call(true);
  if (n != 0) return n;
  // The spin asks the kernel, not just the rings: the caller may wait on descriptors of
  // its own (a listener, plain sockets), and an armed proxy shows its bytes there too.
  const uint64_t deadline = sys::MonotonicNs() + uint64_t(GetRuntime().config.spin_us) * 1000;
  while (sys::MonotonicNs() < deadline && !RecentReadable()) {
    sched_yield();  // let a peer on this CPU run (see Stream::SpinUntil)
    if ((n = call(true)) != 0) return n;
  }
  PrepareChangedForSleep();
  return call(false);
}

bool MaySleep(const timespec* ts) noexcept {
  return !ts || ts->tv_sec != 0 || ts->tv_nsec != 0;
}
bool MaySleep(const timeval* tv) noexcept {
  return !tv || tv->tv_sec != 0 || tv->tv_usec != 0;
}

const timespec kZeroTs{0, 0};

// select() rewrites its sets, so a probe works on copies and only the real call touches
// the caller's sets.
struct FdSets {
  fd_set r, w, e;
  void From(const fd_set* rs, const fd_set* ws, const fd_set* es) noexcept {
    if (rs) r = *rs;
    if (ws) w = *ws;
    if (es) e = *es;
  }
};

}  // namespace

namespace {

void RecordEpollReg(SlipSocket* s, int epfd, int op, int fd, const epoll_event* event) noexcept {
  auto& regs = s->epoll_regs;
  std::erase_if(regs,
                [epfd, fd](const SlipSocket::EpollReg& r) { return r.epfd == epfd && r.fd == fd; });
  if (op != EPOLL_CTL_DEL && event) {
    try {
      regs.push_back({epfd, fd, *event});
    } catch (...) {
    }
  }
  if (s->kind == SockKind::kAccel && s->stream)
    s->stream->SetEdgeTriggered(WatchedEdgeTriggered(s));
}

}  // namespace

SLIP_EXPORT int epoll_ctl(int epfd, int op, int fd, epoll_event* event) {
  // (A descriptor of ours, as the watched one or as the set, is not open for the program.)
  const void* caller = __builtin_return_address(0);
  if (NotTheProgramsFd(fd, caller) || NotTheProgramsFd(epfd, caller)) return -1;
  if (TableInUse()) {
    SocketRef ref(fd);
    if (ref && ref->connecting.load(std::memory_order_acquire)) {
      // The connector may be moving the number back to the TCP socket: the call and its
      // record happen under the socket's mutex, so that the swap moves this registration
      // too (a registration made on the placeholder proxy just before would be lost).
      std::lock_guard<std::mutex> lock(ref->mu);
      int rc = Libc().epoll_ctl(epfd, op, fd, event);
      if (rc == 0) RecordEpollReg(ref.get(), epfd, op, fd, event);
      return rc;
    }
  }
  int rc = Libc().epoll_ctl(epfd, op, fd, event);
  if (rc != 0 || !TableInUse()) return rc;
  SocketRef ref(fd);
  if (!ref || (ref->kind != SockKind::kTcp && ref->kind != SockKind::kAccel &&
               ref->kind != SockKind::kConnecting))
    return rc;
  // Book-keeping only (the kernel did the work): registrations of a socket that may yet be
  // swapped to a proxy by connect(), or that close() must end (fd_table.h).
  std::lock_guard<std::mutex> lock(ref->mu);
  RecordEpollReg(ref.get(), epfd, op, fd, event);
  return rc;
}

SLIP_EXPORT int epoll_wait(int epfd, epoll_event* events, int max, int timeout) {
  if (TransportLibraryCall(__builtin_return_address(0)))
    return Libc().epoll_wait(epfd, events, max, timeout);
  return SleepAware(timeout != 0, [&](bool probe) {
    return Libc().epoll_wait(epfd, events, max, probe ? 0 : timeout);
  });
}

SLIP_EXPORT int epoll_pwait(int epfd, epoll_event* events, int max, int timeout,
                            const sigset_t* mask) {
  if (TransportLibraryCall(__builtin_return_address(0)))
    return Libc().epoll_pwait(epfd, events, max, timeout, mask);
  return SleepAware(timeout != 0, [&](bool probe) {
    return Libc().epoll_pwait(epfd, events, max, probe ? 0 : timeout, mask);
  });
}

SLIP_EXPORT int epoll_pwait2(int epfd, epoll_event* events, int max, const timespec* timeout,
                             const sigset_t* mask) {
  if (TransportLibraryCall(__builtin_return_address(0)))
    return Libc().epoll_pwait2(epfd, events, max, timeout, mask);
  return SleepAware(MaySleep(timeout), [&](bool probe) {
    return Libc().epoll_pwait2(epfd, events, max, probe ? &kZeroTs : timeout, mask);
  });
}

SLIP_EXPORT int poll(pollfd* fds, nfds_t n, int timeout) {
  if (TransportLibraryCall(__builtin_return_address(0))) return Libc().poll(fds, n, timeout);
  return SleepAware(timeout != 0,
                    [&](bool probe) { return Libc().poll(fds, n, probe ? 0 : timeout); });
}

SLIP_EXPORT int __poll_chk(pollfd* fds, nfds_t n, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) __builtin_trap();
  if (TransportLibraryCall(__builtin_return_address(0))) return Libc().poll(fds, n, timeout);
  return poll(fds, n, timeout);
}

SLIP_EXPORT int ppoll(pollfd* fds, nfds_t n, const timespec* timeout, const sigset_t* mask) {
  if (TransportLibraryCall(__builtin_return_address(0))) return Libc().ppoll(fds, n, timeout, mask);
  return SleepAware(MaySleep(timeout), [&](bool probe) {
    return Libc().ppoll(fds, n, probe ? &kZeroTs : timeout, mask);
  });
}

SLIP_EXPORT int __ppoll_chk(pollfd* fds, nfds_t n, const timespec* timeout, const sigset_t* mask,
                            size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) __builtin_trap();
  if (TransportLibraryCall(__builtin_return_address(0))) return Libc().ppoll(fds, n, timeout, mask);
  return ppoll(fds, n, timeout, mask);
}

SLIP_EXPORT int select(int nfds, fd_set* rs, fd_set* ws, fd_set* es, timeval* timeout) {
  if (TransportLibraryCall(__builtin_return_address(0)))
    return Libc().select(nfds, rs, ws, es, timeout);
  return SleepAware(MaySleep(timeout), [&](bool probe) {
    if (!probe) return Libc().select(nfds, rs, ws, es, timeout);
    FdSets copy;
    copy.From(rs, ws, es);
    timeval zero{0, 0};
    int n = Libc().select(nfds, rs ? &copy.r : nullptr, ws ? &copy.w : nullptr,
                          es ? &copy.e : nullptr, &zero);
    if (n > 0) {
      if (rs) *rs = copy.r;
      if (ws) *ws = copy.w;
      if (es) *es = copy.e;
    }
    return n;
  });
}

SLIP_EXPORT int pselect(int nfds, fd_set* rs, fd_set* ws, fd_set* es, const timespec* timeout,
                        const sigset_t* mask) {
  if (TransportLibraryCall(__builtin_return_address(0)))
    return Libc().pselect(nfds, rs, ws, es, timeout, mask);
  return SleepAware(MaySleep(timeout), [&](bool probe) {
    if (!probe) return Libc().pselect(nfds, rs, ws, es, timeout, mask);
    FdSets copy;
    copy.From(rs, ws, es);
    int n = Libc().pselect(nfds, rs ? &copy.r : nullptr, ws ? &copy.w : nullptr,
                           es ? &copy.e : nullptr, &kZeroTs, mask);
    if (n > 0) {
      if (rs) *rs = copy.r;
      if (ws) *ws = copy.w;
      if (es) *es = copy.e;
    }
    return n;
  });
}
