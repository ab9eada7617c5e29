#include "shm/fd_passing.h"

#include <cerrno>
#include <cstring>

#include "core/sys.h"

namespace slip::shm {

int SendWithFds(int sock, const void* msg, size_t len, const int* fds, int nfds) noexcept {
  constexpr int kMaxFds = 8;
  if (nfds < 0 || nfds > kMaxFds) return -EINVAL;
  iovec iov{const_cast<void*>(msg), len};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  msghdr mh = sys::MessageOver(&iov, nullptr, 0);
  if (nfds > 0) {
    mh.msg_control = control;
    mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
  }
  const ssize_t n = sys::sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0) return -errno;
  return n == ssize_t(len) ? 0 : -EMSGSIZE;
}

int TakeFds(msghdr* mh, int* fds, int max) noexcept {
  int count = 0;
  for (cmsghdr* cm = CMSG_FIRSTHDR(mh); cm != nullptr; cm = CMSG_NXTHDR(mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const size_t in_this = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < in_this; ++i, ++count) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      if (count < max)
        fds[count] = fd;
      else
        sys::CloseHandedOver(fd);
    }
  }
  return count;
}

}  // namespace slip::shm
