// Interposed socket lifecycle calls: socket, listen, accept, connect, close, close_range,
// closefrom, shutdown, dup*, fcntl, ioctl, socket options and names. Each is a table lookup and a
// dispatch; untracked descriptors go straight to libc.
#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>

#include "core/failover.h"
#include "core/log.h"
#include "core/own_fds.h"
#include "core/sys.h"
#include "preload/connector.h"
#include "preload/exec.h"
#include "preload/export.h"
#include "preload/fd_table.h"
#include "preload/hand_back.h"
#include "preload/handshake.h"
#include "preload/hidden_fds.h"
#include "preload/libc.h"
#include "preload/runtime.h"
#include "preload/transports.h"

using namespace slip;
using namespace slip::preload;

namespace {

bool IsTcpSocket(int domain, int type, int protocol) noexcept {
  return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
         (protocol == 0 || protocol == IPPROTO_TCP);
}

// The descriptor that socket-level calls should reach: the hidden TCP socket for an
// accelerated or connecting one, the descriptor itself otherwise.
int KernelSocket(const SocketRef& ref, int fd) noexcept {
  return (ref && (ref->kind == SockKind::kAccel || ref->kind == SockKind::kConnecting))
             ? ref->anchor_fd
             : fd;
}

// Runs `call(kernel_socket)`; for a connecting socket under its mutex, since the connector
// may be moving the TCP socket back to `fd` and closing the hidden number meanwhile.
template <typename Call>
int OnKernelSocket(const SocketRef& ref, int fd, Call&& call) noexcept {
  if (ref && ref->connecting.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(ref->mu);
    return call(KernelSocket(ref, fd));
  }
  return call(KernelSocket(ref, fd));
}

// close(), dup2() and dup3() are about to end what `fd` refers to: forget it, and for a
// connecting socket do so (and the call) under its mutex, so that the connector, which
// checks the number under the same mutex, never writes over a number reused meanwhile.
template <typename Call>
int EndNumber(int fd, Call&& call) noexcept {
  if (!TableInUse()) return call();
  {
    SocketRef ref(fd);
    if (ref && ref->connecting.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(ref->mu);
      ForgetEpollLocked(ref.get(), fd);
      Remove(fd);
      return call();
    }
  }
  ForgetEpollOnClose(fd);
  Remove(fd);
  return call();
}

// A vfork child (Python's subprocess uses one) shares our memory but has its own
// descriptor table: its close, dup*, and fcntl/ioctl that change flags must reach the
// kernel without touching the fd table, which is the parent's (a dup2 of a socket onto its stdin
// made the parent's stdin read the socket's ring).
bool SharedMemoryChild() noexcept {
  return TableInUse() && InVforkChild();
}

// A connecting socket's number refers to a placeholder proxy: a copy of it would not
// follow the swap back to TCP, so a dup waits until the connect has settled.
void SettleBeforeDup(int oldfd) noexcept {
  if (!TableInUse()) return;
  SocketRef ref(oldfd);
  if (ref) WaitConnectSettled(ref.get());
}

// An exec'd program that inherits an accelerated descriptor must also inherit the hidden
// TCP socket: as with TCP, the connection then ends only when the last holder closes it
// (the peer sees the anchor's FIN). So the anchor's close-on-exec follows the application's
// explicit changes (F_SETFD, FIOCLEX/FIONCLEX), and a duplicate made without close-on-exec
// makes it inheritable.
void MirrorCloexec(const SocketRef& ref, bool cloexec) noexcept {
  if (ref && ref->kind == SockKind::kAccel && ref->anchor_fd >= 0)
    sys::fcntl(ref->anchor_fd, F_SETFD, cloexec ? FD_CLOEXEC : 0);
}

void TrackDup(int oldfd, int newfd, bool cloexec = false) noexcept {
  if (newfd < 0) return;
  SocketRef ref(oldfd);
  if (!ref) return;
  Install(newfd, ref.get());
  if (!cloexec) MirrorCloexec(ref, false);
}

}  // namespace

SLIP_EXPORT int socket(int domain, int type, int protocol) {
  int fd = Libc().socket(domain, type, protocol);
  if (fd < 0) return fd;
  // A transport library's own sockets (libfabric's tcp provider connects and listens on
  // TCP) are never ours to carry: its listen() would load the transport from inside its
  // own loading, and its connections would be offered to itself. They are hidden
  // descriptors (preload/hidden_fds.h).
  if (TransportLibraryCall(__builtin_return_address(0))) return HideTransportFd(fd);
  if (!IsTcpSocket(domain, type, protocol) || !Enabled()) return fd;
  if (SlipSocket* s = NewSocket(SockKind::kTcp, domain)) {
    s->nonblocking.store(type & SOCK_NONBLOCK, std::memory_order_relaxed);
    Install(fd, s);
    Release(s);
  }
  return fd;
}

SLIP_EXPORT int listen(int fd, int backlog) {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  SocketRef ref(fd);
  if (!ref || (ref->kind != SockKind::kTcp && ref->kind != SockKind::kListener))
    return Libc().listen(fd, backlog);
  // Publish first: once the kernel answers SYNs, a Slipstream client must find the
  // rendezvous, or its connection would stay plain for no reason.
  bool was_listening = ref->kind == SockKind::kListener;
  bool decided = SlipListen(ref.get(), fd);
  int rc = Libc().listen(fd, backlog);
  int err = errno;
  if (rc != 0 && decided && !was_listening) SlipUnlisten(ref.get());
  if (rc == 0 && !decided) SlipListen(ref.get(), fd);  // the port was chosen by listen()
  errno = err;
  return rc;
}

namespace {

// accept4 for the code at `caller` (the return address of the entry point it called:
// accept's own, not a frame of the shim's).
int AcceptFor(const void* caller, int fd, sockaddr* addr, socklen_t* len, int flags) noexcept {
  if (NotTheProgramsFd(fd, caller)) return -1;
  SocketRef ref(fd);
  if (ref && ref->kind == SockKind::kListener) return SlipAccept(ref.get(), fd, addr, len, flags);
  const int conn = Libc().accept4(fd, addr, len, flags);
  Transport* library = conn < 0 ? nullptr : TransportLibraryCall(caller);
  if (library == nullptr) return conn;
  const int hidden = HideTransportFd(conn);
  if (hidden >= 0) library->LibraryAccepted(fd, hidden);
  return hidden;
}

}  // namespace

SLIP_EXPORT int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return AcceptFor(__builtin_return_address(0), fd, addr, len, flags);
}

SLIP_EXPORT int accept(int fd, sockaddr* addr, socklen_t* len) {
  return AcceptFor(__builtin_return_address(0), fd, addr, len, 0);
}

SLIP_EXPORT int connect(int fd, const sockaddr* addr, socklen_t len) {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  SocketRef ref(fd);
  if (ref && ref->connecting.load(std::memory_order_acquire)) {
    errno = EALREADY;  // as TCP answers while its handshake is under way
    return -1;
  }
  if (ref && ref->kind == SockKind::kAccel) {
    errno = EISCONN;  // (the proxy, a connected AF_UNIX socket, would say something else)
    return -1;
  }
  if (ref && ref->connect_error.load(std::memory_order_relaxed) != 0) {
    if (const int error = ref->connect_error.exchange(0)) {
      errno = error;
      return -1;
    }
  }
  if (!ref || ref->kind != SockKind::kTcp) return Libc().connect(fd, addr, len);
  return SlipConnect(ref.get(), fd, addr, len);
}

SLIP_EXPORT int close(int fd) {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  if (SharedMemoryChild()) return Libc().close(fd);
  ForgetOwnFd(fd);  // (a transport library closing its own)
  return EndNumber(fd, [fd] { return Libc().close(fd); });
}

namespace {

int KernelCloseRange(unsigned first, unsigned last, int flags) noexcept {
  return static_cast<int>(::syscall(SYS_close_range, first, last, flags));
}

void CloseTrackedIn(int fd, SlipSocket*, void* ctx) noexcept {
  const auto* range = static_cast<const unsigned*>(ctx);
  if (unsigned(fd) >= range[0] && unsigned(fd) <= range[1])
    EndNumber(fd, [fd] { return Libc().close(fd); });
}

// close_range for the program: the tracked sockets in the range end as close() ends them,
// and the kernel closes the rest in the gaps between our own descriptors, which stay open.
int CloseRangeFor(const void* caller, unsigned first, unsigned last, int flags) noexcept {
  if (first > last) {
    errno = EINVAL;
    return -1;
  }
  if (SharedMemoryChild() || IsOwnCode(caller) || TransportLibraryCall(caller) ||
      (!AnyOwnFds() && !TableInUse()))
    return KernelCloseRange(first, last, flags);
  if (!(flags & CLOSE_RANGE_CLOEXEC) && TableInUse()) {
    unsigned range[2] = {first, last};
    ForEachTrackedFd(CloseTrackedIn, range);
  }
  int rc = 0;
  unsigned from = first;
  bool done = false;
  ForEachOwnFd(first, last, [&](int fd) {
    if (SocketRef(fd)) return;  // (a tracked socket of the program's: its to close)
    if (rc == 0 && unsigned(fd) > from) rc = KernelCloseRange(from, unsigned(fd) - 1, flags);
    if (unsigned(fd) == last) done = true;
    from = unsigned(fd) + 1;
  });
  if (rc == 0 && !done) rc = KernelCloseRange(from, last, flags);
  return rc;
}

}  // namespace

SLIP_EXPORT int close_range(unsigned first, unsigned last, int flags) noexcept {
  return CloseRangeFor(__builtin_return_address(0), first, last, flags);
}

SLIP_EXPORT void closefrom(int lowfd) noexcept {
  if (lowfd < 0) lowfd = 0;
  const void* caller = __builtin_return_address(0);
  // (glibc walks /proc/self/fd where the kernel has no close_range: so does its closefrom,
  // which then closes ours too.)
  if (CloseRangeFor(caller, unsigned(lowfd), ~0u, 0) != 0 && errno == ENOSYS && Libc().closefrom)
    Libc().closefrom(lowfd);
}

SLIP_EXPORT int shutdown(int fd, int how) {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  SocketRef ref(fd);
  if (ref && ref->connecting.load(std::memory_order_acquire)) {
    // (The placeholder proxy must not be shut down; TCP would abort its handshake.)
    errno = ENOTCONN;
    return -1;
  }
  if (!ref || ref->kind != SockKind::kAccel) return Libc().shutdown(fd, how);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
    errno = EINVAL;
    return -1;
  }
  // The TCP anchor stays open: it is the lifetime signal for the peer, and a half-close
  // must not look like the peer process going away.
  if (how != SHUT_WR) ref->stream->ShutdownRead();
  if (how != SHUT_RD) ref->stream->ShutdownWrite();
  return 0;
}

namespace {

// dup2/dup3 from a descriptor of ours: EBADF, as from one not open. Onto one of ours: the
// kernel would give the program that number; Slipstream cannot move its descriptor out of
// the way (its number is held in the connection's state), so the call fails with EBUSY, the
// error the kernel gives a dup2 that races an open of the same number, said once.
bool RefuseDupOnto(int oldfd, int newfd, const void* caller) noexcept {
  if (NotTheProgramsFd(oldfd, caller)) return true;
  if (!NotTheProgramsFd(newfd, caller)) return false;
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed))
    SLIP_LOG(kWarn,
             "dup2/dup3 onto descriptor %d, which Slipstream holds (its descriptors are at or "
             "above %d): refused with EBUSY; a larger RLIMIT_NOFILE moves them higher",
             newfd, sys::HiddenFdFloor());
  errno = EBUSY;
  return true;
}

}  // namespace

SLIP_EXPORT int dup(int oldfd) {
  if (NotTheProgramsFd(oldfd, __builtin_return_address(0))) return -1;
  if (SharedMemoryChild()) return Libc().dup(oldfd);
  SettleBeforeDup(oldfd);
  int fd = Libc().dup(oldfd);
  if (TableInUse()) TrackDup(oldfd, fd);
  return fd;
}

SLIP_EXPORT int dup3(int oldfd, int newfd, int flags) {
  if (RefuseDupOnto(oldfd, newfd, __builtin_return_address(0))) return -1;
  if (oldfd == newfd || SharedMemoryChild()) return Libc().dup3(oldfd, newfd, flags);
  SettleBeforeDup(oldfd);
  int fd = EndNumber(newfd, [&] { return Libc().dup3(oldfd, newfd, flags); });
  if (TableInUse()) TrackDup(oldfd, fd, flags & O_CLOEXEC);
  return fd;
}

SLIP_EXPORT int dup2(int oldfd, int newfd) {
  if (RefuseDupOnto(oldfd, newfd, __builtin_return_address(0))) return -1;
  if (oldfd == newfd || SharedMemoryChild()) return Libc().dup2(oldfd, newfd);
  SettleBeforeDup(oldfd);
  int fd = EndNumber(newfd, [&] { return Libc().dup2(oldfd, newfd); });
  if (TableInUse()) TrackDup(oldfd, fd);
  return fd;
}

namespace {

int FcntlImpl(const void* caller, int fd, int cmd, void* arg) noexcept {
  if (NotTheProgramsFd(fd, caller)) return -1;
  // (Only the commands that change what the shim records; the others stay one call.)
  if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC || cmd == F_SETFL) && SharedMemoryChild())
    return Libc().fcntl(fd, cmd, arg);
  // A copy, or a change of O_NONBLOCK, of a connecting socket waits until it settled: the
  // number refers to a placeholder until then (and a blocking call must never sleep there).
  if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC || cmd == F_SETFL) && TableInUse()) {
    SocketRef ref(fd);
    if (ref) WaitConnectSettled(ref.get());
  }
  int rc = Libc().fcntl(fd, cmd, arg);
  if (rc < 0 || !TableInUse()) return rc;
  if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) {
    TrackDup(fd, rc, cmd == F_DUPFD_CLOEXEC);
  } else if (cmd == F_SETFD) {
    MirrorCloexec(SocketRef(fd), (long(arg) & FD_CLOEXEC) != 0);
  } else if (cmd == F_SETFL) {
    SocketRef ref(fd);
    if (ref) ref->nonblocking.store((long(arg) & O_NONBLOCK) != 0, std::memory_order_relaxed);
  }
  return rc;
}

}  // namespace

SLIP_EXPORT int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return FcntlImpl(__builtin_return_address(0), fd, cmd, arg);
}

SLIP_EXPORT int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return FcntlImpl(__builtin_return_address(0), fd, cmd, arg);
}

SLIP_EXPORT int ioctl(int fd, unsigned long request, ...) {
  va_list ap;
  va_start(ap, request);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  // (FIONBIO changes what the shim records; FIONREAD must stay free of system calls.)
  if (request == FIONBIO && SharedMemoryChild()) return Libc().ioctl(fd, request, arg);
  SocketRef ref(fd);
  if (!ref) return Libc().ioctl(fd, request, arg);
  if (request == FIONBIO) WaitConnectSettled(ref.get());  // as F_SETFL
  if (ref->kind == SockKind::kAccel) {
    if (request == FIONREAD) {
      *static_cast<int*>(arg) = int(ref->stream->ReadableBytes());
      return 0;
    }
    if (request == SIOCOUTQ) {
      *static_cast<int*>(arg) = int(ref->stream->UnconsumedBytes());
      return 0;
    }
    if (request == SIOCATMARK) {
      *static_cast<int*>(arg) = ref->stream->AtMark();
      return 0;
    }
    // The descriptor's own flags and owner (SIGIO, SIGURG) are the proxy's, as fcntl's are:
    // everything else is the TCP connection's.
    if (request != FIONBIO && request != FIOCLEX && request != FIONCLEX && request != FIOASYNC &&
        request != FIOSETOWN && request != SIOCSPGRP && request != FIOGETOWN &&
        request != SIOCGPGRP)
      return Libc().ioctl(ref->anchor_fd, request, arg);
  }
  int rc = Libc().ioctl(fd, request, arg);
  if (rc == 0 && request == FIONBIO)
    ref->nonblocking.store(*static_cast<int*>(arg) != 0, std::memory_order_relaxed);
  if (rc == 0 && (request == FIOCLEX || request == FIONCLEX))
    MirrorCloexec(ref, request == FIOCLEX);
  return rc;
}

// (glibc's sockatmark calls its own ioctl, past the interposed one.)
SLIP_EXPORT int sockatmark(int fd) {
  int at = 0;
  return ioctl(fd, SIOCATMARK, &at) == 0 ? at : -1;
}

namespace {

// The application set a buffer size: the stream's bound follows it (Stream::SetSendBuffer,
// AnchorFailover::AnnounceWindow), now or once it is accelerated.
void NoteBufferSize(const SocketRef& ref, int fd, bool receive) noexcept {
  SlipSocket* s = ref.get();
  int bytes = 0;
  socklen_t len = sizeof(bytes);
  // (Read back from the socket the option went to: the kernel doubles what was asked.)
  if (OnKernelSocket(ref, fd,
                     [&](int k) {
                       return sys::getsockopt(k, SOL_SOCKET, receive ? SO_RCVBUF : SO_SNDBUF,
                                              &bytes, &len);
                     }) != 0 ||
      bytes <= 0)
    return;
  (receive ? s->rcvbuf : s->sndbuf).store(uint32_t(bytes), std::memory_order_relaxed);
  if (s->kind != SockKind::kAccel || !s->stream) return;
  if (!receive) {
    s->stream->SetSendBuffer(uint32_t(bytes));
  } else if (AnchorFailover* failover = s->stream->control()->failover()) {
    failover->AnnounceWindow(uint32_t(bytes));
  }
}

}  // namespace

SLIP_EXPORT int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  SocketRef ref(fd);
  int rc =
      OnKernelSocket(ref, fd, [&](int k) { return Libc().getsockopt(k, level, name, val, len); });
  if (rc == 0 && ref && level == SOL_SOCKET && name == SO_ERROR && val && len &&
      *len >= socklen_t(sizeof(int)) && *static_cast<int*>(val) == 0 &&
      ref->connect_error.load(std::memory_order_relaxed) != 0)
    *static_cast<int*>(val) = ref->connect_error.exchange(0);
  return rc;
}

SLIP_EXPORT int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  SocketRef ref(fd);
  // (Before the kernel sees it: an accelerated connection goes back to TCP first.)
  if (ref && KernelOnlyOption(level, name, val, len) &&
      PrepareForKernelOption(ref.get(), fd, /*lazily=*/name == SO_ZEROCOPY) != 0)
    return -1;
  int rc =
      OnKernelSocket(ref, fd, [&](int k) { return Libc().setsockopt(k, level, name, val, len); });
  // Blocking calls of an accelerated socket sleep on the proxy: it carries the timeouts.
  if (rc == 0 && ref && ref->kind == SockKind::kAccel && level == SOL_SOCKET &&
      (name == SO_RCVTIMEO || name == SO_SNDTIMEO || name == SO_RCVTIMEO_NEW ||
       name == SO_SNDTIMEO_NEW))
    sys::setsockopt(fd, level, name, val, len);
  // (The anchor has it too, for urgent data TCP itself carries; never the proxy, whose own
  // urgent byte must stay out of line.)
  if (rc == 0 && ref && ref->kind == SockKind::kAccel && level == SOL_SOCKET &&
      name == SO_OOBINLINE && val && len >= socklen_t(sizeof(int)))
    ref->stream->SetUrgentInline(*static_cast<const int*>(val) != 0);
  if (rc == 0 && ref && level == SOL_SOCKET &&
      (name == SO_RCVBUF || name == SO_RCVBUFFORCE || name == SO_SNDBUF || name == SO_SNDBUFFORCE))
    NoteBufferSize(ref, fd, name == SO_RCVBUF || name == SO_RCVBUFFORCE);
  return rc;
}

SLIP_EXPORT int getsockname(int fd, sockaddr* addr, socklen_t* len) {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  SocketRef ref(fd);
  return OnKernelSocket(ref, fd, [&](int k) { return Libc().getsockname(k, addr, len); });
}

SLIP_EXPORT int getpeername(int fd, sockaddr* addr, socklen_t* len) {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  SocketRef ref(fd);
  return OnKernelSocket(ref, fd, [&](int k) { return Libc().getpeername(k, addr, len); });
}
