// Interposed calls that only make descriptors: socketpair, epoll_create(1), eventfd and
// pipe(2). The application's calls are libc's, untouched (one atomic load more); a
// transport library's results move above the hidden-descriptor floor (preload/hidden_fds.h).
// And fstat, which must not find a hidden one for the program.
// Each entry point checks its own caller's return address: the code that asked for the
// descriptor, not a frame of the shim's.
#include "preload/hidden_fds.h"

#include <sys/stat.h>

#include <cerrno>

#include "core/own_fds.h"
#include "core/sys.h"
#include "preload/export.h"
#include "preload/fd_table.h"
#include "preload/libc.h"
#include "preload/transports.h"

using namespace slip;
using namespace slip::preload;

namespace slip::preload {

int HideTransportFd(int fd) noexcept {
  return sys::MoveAbove(fd, sys::HiddenFdFloor());
}

int HideTransportPair(int fds[2]) noexcept {
  const int floor = sys::HiddenFdFloor();
  const int first = sys::MoveAbove(fds[0], floor);
  if (first < 0) {
    sys::close(fds[1]);
    errno = EMFILE;
    return -1;
  }
  const int second = sys::MoveAbove(fds[1], floor);
  if (second < 0) {
    sys::close(first);
    errno = EMFILE;
    return -1;
  }
  fds[0] = first;
  fds[1] = second;
  return 0;
}

bool NotTheProgramsFd(int fd, const void* caller) noexcept {
  // (The cheap questions first: most numbers carry no mark, and a transport library's
  // calls on its own descriptors must not cost a system call each.)
  if (!OwnFdMarked(fd) || IsOwnCode(caller) || TransportLibraryCall(caller) || !IsOwnFd(fd))
    return false;
  // A socket the fd table tracks is the program's, whatever marked its number.
  if (SocketRef(fd)) return false;
  errno = EBADF;
  return true;
}

}  // namespace slip::preload

namespace {

int OneFd(int fd, const void* caller) noexcept {
  return fd >= 0 && TransportLibraryCall(caller) ? HideTransportFd(fd) : fd;
}

int TwoFds(int rc, int fds[2], const void* caller) noexcept {
  return rc == 0 && TransportLibraryCall(caller) ? HideTransportPair(fds) : rc;
}

}  // namespace

SLIP_EXPORT int socketpair(int domain, int type, int protocol, int sv[2]) {
  return TwoFds(Libc().socketpair(domain, type, protocol, sv), sv, __builtin_return_address(0));
}

SLIP_EXPORT int epoll_create(int size) {
  return OneFd(Libc().epoll_create(size), __builtin_return_address(0));
}

SLIP_EXPORT int epoll_create1(int flags) {
  return OneFd(Libc().epoll_create1(flags), __builtin_return_address(0));
}

SLIP_EXPORT int eventfd(unsigned int count, int flags) {
  return OneFd(Libc().eventfd(count, flags), __builtin_return_address(0));
}

SLIP_EXPORT int pipe(int fds[2]) {
  return TwoFds(Libc().pipe(fds), fds, __builtin_return_address(0));
}

SLIP_EXPORT int pipe2(int fds[2], int flags) {
  return TwoFds(Libc().pipe2(fds, flags), fds, __builtin_return_address(0));
}

// fstat of a descriptor of ours: EBADF for the program, as for a number that is not open.
// (The shim's and the modules' own fstat calls reach here too, through the exported name.)
SLIP_EXPORT int fstat(int fd, struct stat* st) noexcept {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  return Libc().fstat(fd, st);
}

SLIP_EXPORT int fstat64(int fd, struct stat64* st) noexcept {
  if (NotTheProgramsFd(fd, __builtin_return_address(0))) return -1;
  return Libc().fstat64(fd, st);
}
