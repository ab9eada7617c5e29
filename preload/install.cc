#include "preload/install.h"

#include <sys/epoll.h>
#include <sys/time.h>

#include <cerrno>

#include "core/failover.h"
#include "core/log.h"
#include "core/sys.h"
#include "preload/accel_list.h"
#include "preload/control.h"
#include "preload/fd_table.h"
#include "preload/runtime.h"

namespace slip::preload {

namespace {

// Timeouts set before connect/accept completed live on the TCP socket; the proxy must
// carry them, since blocking calls sleep on it.
void CopyTimeouts(int from, int to) noexcept {
  for (int opt : {SO_RCVTIMEO, SO_SNDTIMEO}) {
    timeval tv{};
    socklen_t len = sizeof(tv);
    if (sys::getsockopt(from, SOL_SOCKET, opt, &tv, &len) == 0 && (tv.tv_sec || tv.tv_usec))
      sys::setsockopt(to, SOL_SOCKET, opt, &tv, sizeof(tv));
  }
}

// The common tail: the stream, the anchor, stats, and the watchers. False: out of memory,
// nothing changed (the stream is still the caller's).
bool AttachStream(SlipSocket* s, int fd, std::unique_ptr<Stream>* stream, int anchor, int fl_flags,
                  const sockaddr_storage& local, const sockaddr_storage& remote, int role) noexcept;

// Hides the TCP socket at `fd`: at `anchor_slot` (a number kept for it, taken over), or at
// a new number above the floor (below it if none is free: a connection already confirmed
// must not fail for want of a number). The anchor is inherited across exec exactly when
// the application's descriptor is: a program exec'd with the socket then holds the TCP
// connection open as it would on TCP. Returns the anchor or -errno.
int HideAnchor(int fd, int fd_flags, int anchor_slot) noexcept {
  if (anchor_slot >= 0) {
    if (sys::dup3(fd, anchor_slot, (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) return -errno;
    return anchor_slot;
  }
  const int dup_cmd = (fd_flags & FD_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD;
  int anchor = sys::fcntl(fd, dup_cmd, sys::HiddenFdFloor());
  if (anchor < 0) anchor = sys::fcntl(fd, dup_cmd, 0);
  if (anchor < 0) return -errno;
  MarkOwnFd(anchor);
  return anchor;
}

// Puts `proxy_a` at the application's number `fd`, with its epoll registrations. epoll
// keys registrations on (file, number): they come off the TCP socket's file before the
// number moves, and go back on the proxy's. (Registrations under other numbers, of dup()s
// of the unconnected socket, stay where the kernel has them.) Returns 0 or -errno, when
// nothing changed.
int SwapInProxy(SlipSocket* s, int fd, int fd_flags, int fl_flags, int proxy_a) noexcept {
  CopyTimeouts(fd, proxy_a);
  if (fl_flags & O_NONBLOCK) sys::fcntl(proxy_a, F_SETFL, O_NONBLOCK);
  std::erase_if(s->epoll_regs, [fd](const SlipSocket::EpollReg& r) { return r.fd != fd; });
  for (const SlipSocket::EpollReg& reg : s->epoll_regs)
    sys::epoll_ctl(reg.epfd, EPOLL_CTL_DEL, fd, nullptr);
  // The atomic swap: from here on the application's number refers to the proxy.
  if (sys::dup3(proxy_a, fd, (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
    int err = errno;
    for (SlipSocket::EpollReg& reg : s->epoll_regs)
      sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event);
    return -err;
  }
  for (SlipSocket::EpollReg& reg : s->epoll_regs) {
    if (sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event) != 0)
      SLIP_LOG(kWarn, "fd %d: cannot move its epoll registration (errno %d)", fd, errno);
  }
  // They stay recorded: they are now the proxy's, and close() ends them.
  return 0;
}

}  // namespace

int InstallStream(SlipSocket* s, int fd, std::unique_ptr<Stream>* stream, int* anchor_slot,
                  int role) noexcept {
  sockaddr_storage local{}, remote{};
  socklen_t llen = sizeof(local), rlen = sizeof(remote);
  sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen);
  sys::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen);
  const int fd_flags = sys::fcntl(fd, F_GETFD);
  const int fl_flags = sys::fcntl(fd, F_GETFL);
  if (fd_flags < 0 || fl_flags < 0) return -errno;
  const int anchor = HideAnchor(fd, fd_flags, *anchor_slot);
  if (anchor < 0) {
    SLIP_LOG(kWarn, "fd %d: cannot hide the TCP socket (errno %d); staying on TCP", fd, -anchor);
    return anchor;
  }
  const int proxy_a = (*stream)->proxy_a();
  auto undo_anchor = [&] {
    // A kept slot goes back to being a placeholder the caller owns (it still refers to
    // the TCP socket, which the application's number keeps too).
    if (anchor != *anchor_slot) sys::close(anchor);
  };
  if (int rc = SwapInProxy(s, fd, fd_flags, fl_flags, proxy_a); rc < 0) {
    undo_anchor();
    return rc;
  }
  if (!AttachStream(s, fd, stream, anchor, fl_flags, local, remote, role)) {
    // The anchor is put back so the application keeps a working TCP socket.
    sys::dup3(anchor, fd, (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0);
    sys::fcntl(fd, F_SETFL, fl_flags);
    undo_anchor();
    return -ENOMEM;
  }
  if (anchor == *anchor_slot) *anchor_slot = -1;  // the stream's anchor now
  return 0;
}

int InstallBehindProxy(SlipSocket* s, int fd, std::unique_ptr<Stream>* stream, int anchor,
                       int role) noexcept {
  sockaddr_storage local{}, remote{};
  socklen_t llen = sizeof(local), rlen = sizeof(remote);
  sys::getsockname(anchor, reinterpret_cast<sockaddr*>(&local), &llen);
  sys::getpeername(anchor, reinterpret_cast<sockaddr*>(&remote), &rlen);
  int fd_flags = sys::fcntl(fd, F_GETFD);
  int fl_flags = sys::fcntl(fd, F_GETFL);
  if (fd_flags < 0 || fl_flags < 0) return -errno;
  // As InstallStream: the anchor is inherited across exec exactly when the application's
  // descriptor is.
  sys::fcntl(anchor, F_SETFD, (fd_flags & FD_CLOEXEC) ? FD_CLOEXEC : 0);
  CopyTimeouts(anchor, (*stream)->proxy_a());
  return AttachStream(s, fd, stream, anchor, fl_flags, local, remote, role) ? 0 : -ENOMEM;
}

namespace {

bool AttachStream(SlipSocket* s, int fd, std::unique_ptr<Stream>* stream, int anchor, int fl_flags,
                  const sockaddr_storage& local, const sockaddr_storage& remote,
                  int role) noexcept {
  s->stream = std::move(*stream);
  s->stream->SetEdgeTriggered(WatchedEdgeTriggered(s));
  if (!AccelListAdd(s)) {
    *stream = std::move(s->stream);
    return false;
  }
  sys::fcntl(anchor, F_SETFL, fl_flags | O_NONBLOCK);
  s->anchor_fd = anchor;
  if (GetRuntime().config.failover) s->stream->control()->SetAnchor(anchor);
  s->nonblocking.store(fl_flags & O_NONBLOCK, std::memory_order_relaxed);
  if (uint32_t bytes = s->sndbuf.load(std::memory_order_relaxed)) s->stream->SetSendBuffer(bytes);
  if (uint32_t bytes = s->rcvbuf.load(std::memory_order_relaxed)) {
    if (AnchorFailover* failover = s->stream->control()->failover())
      failover->AnnounceWindow(bytes);
  }
  int inline_urgent = 0;  // (set before connect, or inherited from the listener)
  socklen_t inline_len = sizeof(inline_urgent);
  if (sys::getsockopt(anchor, SOL_SOCKET, SO_OOBINLINE, &inline_urgent, &inline_len) == 0)
    s->stream->SetUrgentInline(inline_urgent != 0);
  s->stats = StatsOpen(
      s->stream->channel()->kind(), Reason::kNone, role, reinterpret_cast<const sockaddr*>(&local),
      reinterpret_cast<const sockaddr*>(&remote), s->stream->channel()->provider());
  s->kind = SockKind::kAccel;
  ControlWatch(s);
  SLIP_LOG(kDebug, "fd %d accelerated (%s), anchor fd %d", fd,
           TransportName(s->stream->channel()->kind()), anchor);
  return true;
}

}  // namespace

}  // namespace slip::preload
