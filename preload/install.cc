#include "preload/install.h"

#include <sys/epoll.h>
#include <sys/time.h>

#include <cerrno>

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
// nothing changed.
bool AttachStream(SlipSocket* s, int fd, std::unique_ptr<Channel> channel, int proxy_a, int proxy_b,
                  int anchor, int fl_flags, const sockaddr_storage& local,
                  const sockaddr_storage& remote, int role) noexcept;

}  // namespace

int InstallAccelerated(SlipSocket* s, int fd, std::unique_ptr<Channel> channel, int proxy_a,
                       int proxy_b, int role) noexcept {
  sockaddr_storage local{}, remote{};
  socklen_t llen = sizeof(local), rlen = sizeof(remote);
  sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen);
  sys::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen);

  int fd_flags = sys::fcntl(fd, F_GETFD);
  int fl_flags = sys::fcntl(fd, F_GETFL);
  // The anchor is inherited across exec exactly when the application's descriptor is: a
  // program exec'd with the socket then holds the TCP connection open as it would on TCP.
  const int dup_cmd = (fd_flags & FD_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD;
  int anchor = fd_flags < 0 ? -1 : sys::fcntl(fd, dup_cmd, sys::HiddenFdFloor());
  if (anchor < 0 && fd_flags >= 0) anchor = sys::fcntl(fd, dup_cmd, 0);
  if (anchor < 0 || fd_flags < 0 || fl_flags < 0) {
    int err = errno;
    if (anchor >= 0) sys::close(anchor);
    SLIP_LOG(kWarn, "fd %d: cannot hide the TCP socket (errno %d); staying on TCP", fd, err);
    return -err;
  }
  CopyTimeouts(fd, proxy_a);
  if (fl_flags & O_NONBLOCK) sys::fcntl(proxy_a, F_SETFL, O_NONBLOCK);
  // epoll keys registrations on (file, number): take them off the TCP socket's file
  // before the number moves, and put them back on the proxy's.
  // (Registrations under other numbers, of dup()s of the unconnected socket, stay where the
  // kernel has them.)
  std::erase_if(s->epoll_regs, [fd](const SlipSocket::EpollReg& r) { return r.fd != fd; });
  for (const SlipSocket::EpollReg& reg : s->epoll_regs)
    sys::epoll_ctl(reg.epfd, EPOLL_CTL_DEL, fd, nullptr);
  // The atomic swap: from here on the application's number refers to the proxy.
  if (sys::dup3(proxy_a, fd, (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
    int err = errno;
    for (SlipSocket::EpollReg& reg : s->epoll_regs)
      sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event);
    sys::close(anchor);
    return -err;
  }
  for (SlipSocket::EpollReg& reg : s->epoll_regs) {
    if (sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event) != 0)
      SLIP_LOG(kWarn, "fd %d: cannot move its epoll registration (errno %d)", fd, errno);
  }
  // They stay recorded: they are now the proxy's, and close() ends them.
  if (!AttachStream(s, fd, std::move(channel), proxy_a, proxy_b, anchor, fl_flags, local, remote,
                    role)) {
    // (A failed allocation here would leave the proxy at fd with nothing behind it; the
    // anchor is put back so the application keeps a working TCP socket.)
    sys::dup3(anchor, fd, (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0);
    sys::fcntl(fd, F_SETFL, fl_flags);
    sys::close(anchor);
    sys::close(proxy_a);
    sys::close(proxy_b);
    return -ENOMEM;
  }
  return 0;
}

int InstallBehindProxy(SlipSocket* s, int fd, std::unique_ptr<Channel> channel, int proxy_a,
                       int proxy_b, int anchor, int role) noexcept {
  sockaddr_storage local{}, remote{};
  socklen_t llen = sizeof(local), rlen = sizeof(remote);
  sys::getsockname(anchor, reinterpret_cast<sockaddr*>(&local), &llen);
  sys::getpeername(anchor, reinterpret_cast<sockaddr*>(&remote), &rlen);
  int fd_flags = sys::fcntl(fd, F_GETFD);
  int fl_flags = sys::fcntl(fd, F_GETFL);
  if (fd_flags < 0 || fl_flags < 0) return -errno;
  // As InstallAccelerated: the anchor is inherited across exec exactly when the
  // application's descriptor is.
  sys::fcntl(anchor, F_SETFD, (fd_flags & FD_CLOEXEC) ? FD_CLOEXEC : 0);
  CopyTimeouts(anchor, proxy_a);
  return AttachStream(s, fd, std::move(channel), proxy_a, proxy_b, anchor, fl_flags, local, remote,
                      role)
             ? 0
             : -ENOMEM;
}

namespace {

bool AttachStream(SlipSocket* s, int fd, std::unique_ptr<Channel> channel, int proxy_a, int proxy_b,
                  int anchor, int fl_flags, const sockaddr_storage& local,
                  const sockaddr_storage& remote, int role) noexcept {
  sys::fcntl(anchor, F_SETFL, fl_flags | O_NONBLOCK);
  StreamOptions options;
  options.spin_us = GetRuntime().config.spin_us;
  auto* stream = new (std::nothrow) Stream(std::move(channel), proxy_a, proxy_b, options);
  if (!stream) return false;
  s->stream.reset(stream);
  s->anchor_fd = anchor;
  if (GetRuntime().config.failover) s->stream->channel()->SetAnchor(anchor);
  s->nonblocking.store(fl_flags & O_NONBLOCK, std::memory_order_relaxed);
  s->stats = StatsOpen(s->stream->channel()->kind(), Reason::kNone, role,
                       reinterpret_cast<const sockaddr*>(&local),
                       reinterpret_cast<const sockaddr*>(&remote));
  s->kind = SockKind::kAccel;
  AccelListAdd(s);
  ControlWatch(s);
  SLIP_LOG(kDebug, "fd %d accelerated (%s), anchor fd %d", fd,
           TransportName(s->stream->channel()->kind()), anchor);
  return true;
}

}  // namespace

}  // namespace slip::preload
