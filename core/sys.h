// Raw system calls for code that runs inside the shim.
//
// libslipstream.so exports libc names (recv, close, ...), so a plain call to recv() from
// inside the library would re-enter the interposed symbol. Core and transports therefore
// issue their own system calls through these wrappers: they never re-enter the shim,
// they set errno like libc, and they keep kernel semantics (blocking, SA_RESTART, timeouts).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

#include "core/own_fds.h"
#include "core/sanitizer.h"

namespace slip::sys {

inline ssize_t recv(int fd, void* buf, size_t len, int flags) noexcept {
  return ::syscall(SYS_recvfrom, fd, buf, len, flags, nullptr, nullptr);
}
inline ssize_t send(int fd, const void* buf, size_t len, int flags) noexcept {
  return ::syscall(SYS_sendto, fd, buf, len, flags, nullptr, 0);
}
inline ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* from,
                        socklen_t* from_len) noexcept {
  return ::syscall(SYS_recvfrom, fd, buf, len, flags, from, from_len);
}
inline ssize_t sendto(int fd, const void* buf, size_t len, int flags, const sockaddr* to,
                      socklen_t to_len) noexcept {
  return ::syscall(SYS_sendto, fd, buf, len, flags, to, to_len);
}
inline ssize_t sendmsg(int fd, const msghdr* msg, int flags) noexcept {
  return ::syscall(SYS_sendmsg, fd, msg, flags);
}
inline ssize_t recvmsg(int fd, msghdr* msg, int flags) noexcept {
  return ::syscall(SYS_recvmsg, fd, msg, flags);
}
// (No timeout: with MSG_DONTWAIT, what is queued now, up to `n` datagrams.)
inline int recvmmsg(int fd, mmsghdr* msgs, unsigned n, int flags) noexcept {
  return static_cast<int>(::syscall(SYS_recvmmsg, fd, msgs, n, flags, nullptr));
}
inline ssize_t read(int fd, void* buf, size_t len) noexcept {
  return ::syscall(SYS_read, fd, buf, len);
}
inline ssize_t write(int fd, const void* buf, size_t len) noexcept {
  return ::syscall(SYS_write, fd, buf, len);
}
// (A descriptor of ours is forgotten as it closes, and its mark follows a dup3 onto it:
// core/own_fds.h.)
inline int close(int fd) noexcept {
  ForgetOwnFd(fd);
  san::FdClosing(fd);
  return static_cast<int>(::syscall(SYS_close, fd));
}
inline int dup3(int oldfd, int newfd, int flags) noexcept {
  if (oldfd != newfd) san::FdClosing(newfd);  // (whatever `newfd` was is closed)
  const int rc = static_cast<int>(::syscall(SYS_dup3, oldfd, newfd, flags));
  if (rc >= 0) RemarkOwnFd(newfd);
  return rc;
}
inline int fcntl(int fd, int cmd, long arg = 0) noexcept {
  return static_cast<int>(::syscall(SYS_fcntl, fd, cmd, arg));
}
inline int ioctl(int fd, unsigned long request, void* arg) noexcept {
  return static_cast<int>(::syscall(SYS_ioctl, fd, request, arg));
}
inline int socket(int domain, int type, int protocol) noexcept {
  return static_cast<int>(::syscall(SYS_socket, domain, type, protocol));
}
inline int socketpair(int domain, int type, int protocol, int sv[2]) noexcept {
  return static_cast<int>(::syscall(SYS_socketpair, domain, type, protocol, sv));
}
inline int connect(int fd, const sockaddr* addr, socklen_t len) noexcept {
  return static_cast<int>(::syscall(SYS_connect, fd, addr, len));
}
inline int bind(int fd, const sockaddr* addr, socklen_t len) noexcept {
  return static_cast<int>(::syscall(SYS_bind, fd, addr, len));
}
inline int listen(int fd, int backlog) noexcept {
  return static_cast<int>(::syscall(SYS_listen, fd, backlog));
}
inline int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) noexcept {
  return static_cast<int>(::syscall(SYS_accept4, fd, addr, len, flags));
}
inline int shutdown(int fd, int how) noexcept {
  return static_cast<int>(::syscall(SYS_shutdown, fd, how));
}
inline int getsockname(int fd, sockaddr* addr, socklen_t* len) noexcept {
  return static_cast<int>(::syscall(SYS_getsockname, fd, addr, len));
}
inline int getpeername(int fd, sockaddr* addr, socklen_t* len) noexcept {
  return static_cast<int>(::syscall(SYS_getpeername, fd, addr, len));
}
inline int getsockopt(int fd, int level, int name, void* val, socklen_t* len) noexcept {
  return static_cast<int>(::syscall(SYS_getsockopt, fd, level, name, val, len));
}
inline int setsockopt(int fd, int level, int name, const void* val, socklen_t len) noexcept {
  return static_cast<int>(::syscall(SYS_setsockopt, fd, level, name, val, len));
}
// A message over one buffer, with `control_len` bytes at `control` for descriptors
// (SCM_RIGHTS) to come or go.
inline msghdr MessageOver(iovec* iov, void* control, size_t control_len) noexcept {
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = control_len;
  return mh;
}
inline int poll(pollfd* fds, nfds_t n, int timeout_ms) noexcept {
  return static_cast<int>(::syscall(SYS_poll, fds, n, timeout_ms));
}
// (The kernel writes the time left into *timeout.)
inline int ppoll(pollfd* fds, nfds_t n, timespec* timeout) noexcept {
  return static_cast<int>(::syscall(SYS_ppoll, fds, n, timeout, nullptr, 8));
}
inline int epoll_ctl(int epfd, int op, int fd, epoll_event* ev) noexcept {
  return static_cast<int>(::syscall(SYS_epoll_ctl, epfd, op, fd, ev));
}
inline int epoll_wait(int epfd, epoll_event* events, int max, int timeout_ms) noexcept {
  return static_cast<int>(::syscall(SYS_epoll_pwait, epfd, events, max, timeout_ms, nullptr, 8));
}

// CLOCK_MONOTONIC in nanoseconds: spins and sleeps of the data path.
inline uint64_t MonotonicNs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// CLOCK_MONOTONIC in milliseconds: deadlines of the control path.
inline uint64_t MonotonicMs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

// A non-zero random 64-bit value (connection nonces).
inline uint64_t RandomNonce() noexcept {
  uint64_t nonce = 0;
  while (nonce == 0) {
    if (::getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce)) nonce = 0;
  }
  return nonce;
}

// The helpers below make descriptors of ours: each marks what it returns
// (core/own_fds.h), so that the application's calls find it as a number that is not open.
//
// Moves `fd` to a descriptor number at or above `floor` (close-on-exec) and closes the
// original. Keeps hidden descriptors out of the low numbers the application expects.
int MoveHigh(int fd, int floor) noexcept;
// The same for a descriptor a system library keeps and uses itself (rdma-core's event
// channels), left unmarked: the library's own calls on it (its close, its fcntl) come
// from code the face cannot tell from the program's, and must reach the kernel.
int MoveLibraryFdHigh(int fd, int floor) noexcept;
// The same, but never below the floor: when no number at or above it is free, closes `fd`
// and fails (-1, errno EMFILE). Slipstream's own descriptors of a connection never take
// the numbers the application would get: a connection that cannot have its descriptors
// above the floor stays plain (docs/SECURITY.md, "Descriptors"). `fd` < 0 is returned as is.
int MoveAbove(int fd, int floor) noexcept;
// Closes a descriptor another process handed us (SCM_RIGHTS) without ever blocking: a
// TCP socket whose last reference this is, with SO_LINGER set to a timeout and bytes its
// peer will not take, would hold close() that long. Its linger is turned off first (the
// socket then ends in the background, as after any close).
void CloseHandedOver(int fd) noexcept;
// A close-on-exec duplicate of `fd` at or above `floor`, or -1 (errno EMFILE).
int DupAbove(int fd, int floor) noexcept;
// A close-on-exec duplicate of `fd` at or above `floor` (below it when the floor is out of
// reach): one system call where MoveHigh of a plain dup is three.
int DupHigh(int fd, int floor) noexcept;

// The floor for hidden descriptors, chosen once at start-up.
int HiddenFdFloor() noexcept;
void SetHiddenFdFloor(int floor) noexcept;

// The file size limit (RLIMIT_FSIZE). A regular file that a call would take past the soft
// limit gets the caller SIGXFSZ, whose default action kills the host program, so the shim
// never lets its own files reach it: it checks first and gives up the write (or the file)
// instead. The checks mirror the kernel's (the limit counts bytes):
// - growing a file (ftruncate, fallocate: fs/attr.c inode_newsize_ok) to `end` signals
//   when end > limit, compared unsigned;
// - a write of len > 0 bytes at `pos` (O_APPEND: the file's size) signals when
//   pos >= limit, and is cut to limit - pos otherwise (generic_write_check_limits, whose
//   limit is a signed loff_t: a limit above 2^63 that is not RLIM_INFINITY signals every
//   write). Only regular files have the limit; pipes, terminals, devices do not.

// Whether a file may be grown to `end` bytes (ftruncate, fallocate) without SIGXFSZ under
// the current soft limit; always true for RLIM_INFINITY.
bool FileSizeAllows(uint64_t end) noexcept;

// ftruncate(fd, size) for growing a file, refused (-1, EFBIG) rather than raising SIGXFSZ
// when the limit does not allow `size`. 0 or -1 with errno, as ftruncate.
int TruncateFitting(int fd, uint64_t size) noexcept;

// Writes all of buf[0, len) to fd (retrying EINTR and short writes), or nothing when the
// file size limit would cut it: then false with errno EFBIG, and no SIGXFSZ. False with
// errno on other failures (part may have been written, as with write). Another writer can
// grow the same file between the check and the write (a log shared by many processes):
// then the write may be cut or refused, but still raises nothing, because it runs with
// SIGXFSZ blocked in this thread and a SIGXFSZ it raised is taken back.
bool WriteFitting(int fd, const void* buf, size_t len) noexcept;

// Starts a detached service thread named `name` with every signal blocked: the shim's own
// threads must never take the application's signals. Returns 0 or pthread_create's error.
int StartServiceThread(void* (*main)(void*), void* arg, const char* name) noexcept;

}  // namespace slip::sys
