// Interposed calls that only make descriptors: socketpair, epoll_create(1), eventfd and
// pipe(2). The application's calls are libc's, untouched (one atomic load more); a
// transport library's results move above the hidden-descriptor floor (preload/hidden_fds.h).
// Each entry point checks its own caller's return address: the code that asked for the
// descriptor, not a frame of the shim's.
#include "preload/hidden_fds.h"

#include <cerrno>

#include "core/sys.h"
#include "preload/export.h"
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
