// The real libc entry points behind the interposed ones, resolved once with
// dlsym(RTLD_NEXT). Passthrough calls go here, so plain descriptors keep every libc
// behaviour (cancellation points, fortify checks, vDSO) untouched.
#pragma once

#include <poll.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdarg>

namespace slip::preload {

struct LibcCalls {
  int (*socket)(int, int, int);
  int (*socketpair)(int, int, int, int*);
  int (*bind)(int, const sockaddr*, socklen_t);
  int (*listen)(int, int);
  int (*accept)(int, sockaddr*, socklen_t*);
  int (*accept4)(int, sockaddr*, socklen_t*, int);
  int (*connect)(int, const sockaddr*, socklen_t);
  ssize_t (*read)(int, void*, size_t);
  ssize_t (*write)(int, const void*, size_t);
  ssize_t (*readv)(int, const iovec*, int);
  ssize_t (*writev)(int, const iovec*, int);
  ssize_t (*recv)(int, void*, size_t, int);
  ssize_t (*send)(int, const void*, size_t, int);
  ssize_t (*recvfrom)(int, void*, size_t, int, sockaddr*, socklen_t*);
  ssize_t (*sendto)(int, const void*, size_t, int, const sockaddr*, socklen_t);
  ssize_t (*recvmsg)(int, msghdr*, int);
  ssize_t (*sendmsg)(int, const msghdr*, int);
  int (*recvmmsg)(int, mmsghdr*, unsigned, int, timespec*);
  int (*sendmmsg)(int, mmsghdr*, unsigned, int);
  ssize_t (*sendfile)(int, int, off_t*, size_t);
  ssize_t (*splice)(int, off64_t*, int, off64_t*, size_t, unsigned int);
  int (*close)(int);
  void (*closefrom)(int);
  int (*fstat)(int, struct stat*);
  int (*fstat64)(int, struct stat64*);
  int (*shutdown)(int, int);
  int (*fcntl)(int, int, ...);
  int (*ioctl)(int, unsigned long, ...);
  int (*getsockopt)(int, int, int, void*, socklen_t*);
  int (*setsockopt)(int, int, int, const void*, socklen_t);
  int (*getsockname)(int, sockaddr*, socklen_t*);
  int (*getpeername)(int, sockaddr*, socklen_t*);
  int (*dup)(int);
  int (*dup2)(int, int);
  int (*dup3)(int, int, int);
  int (*epoll_create)(int);
  int (*epoll_create1)(int);
  int (*eventfd)(unsigned int, int);
  int (*pipe)(int*);
  int (*pipe2)(int*, int);
  int (*epoll_ctl)(int, int, int, epoll_event*);
  int (*epoll_wait)(int, epoll_event*, int, int);
  int (*epoll_pwait)(int, epoll_event*, int, int, const sigset_t*);
  int (*epoll_pwait2)(int, epoll_event*, int, const timespec*, const sigset_t*);
  int (*poll)(pollfd*, nfds_t, int);
  int (*ppoll)(pollfd*, nfds_t, const timespec*, const sigset_t*);
  int (*select)(int, fd_set*, fd_set*, fd_set*, timeval*);
  int (*pselect)(int, fd_set*, fd_set*, fd_set*, const timespec*, const sigset_t*);
  int (*execve)(const char*, char* const*, char* const*);
  int (*execveat)(int, const char*, char* const*, char* const*, int);
  int (*fexecve)(int, char* const*, char* const*);
  int (*execv)(const char*, char* const*);
  int (*execvp)(const char*, char* const*);
  int (*execvpe)(const char*, char* const*, char* const*);
  FILE* (*fdopen)(int, const char*);
  int (*vdprintf)(int, const char*, va_list);
};

// Resolved on first use; safe to call from any thread and from constructors.
const LibcCalls& Libc() noexcept;

}  // namespace slip::preload
