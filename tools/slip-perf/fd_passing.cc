#include "tools/slip-perf/fd_passing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "tools/slip-perf/net.h"

namespace slipperf {
namespace {

constexpr size_t kControlSpace = CMSG_SPACE(kMaxPassedFds * sizeof(int));

}  // namespace

void SendWithFds(int sock, const void* data, size_t len, const int* fds, int count) {
  alignas(cmsghdr) char control[kControlSpace] = {};
  iovec iov{const_cast<void*>(data), len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = CMSG_SPACE(count * sizeof(int));
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(count * sizeof(int));
  std::memcpy(CMSG_DATA(cm), fds, count * sizeof(int));
  // The descriptors travel with the first byte; the rest of a short write follows plainly.
  ssize_t n;
  while ((n = sendmsg(sock, &mh, MSG_NOSIGNAL)) < 0) {
    if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "sendmsg");
    CheckStop();
  }
  const auto* rest = static_cast<const uint8_t*>(data) + n;
  for (size_t left = len - static_cast<size_t>(n); left > 0;) {
    const ssize_t m = send(sock, rest, left, MSG_NOSIGNAL);
    if (m < 0 && errno == EINTR) continue;
    if (m < 0) throw std::system_error(errno, std::generic_category(), "send");
    rest += m;
    left -= static_cast<size_t>(m);
  }
}

int RecvWithFds(int sock, void* data, size_t len, int* fds) {
  auto* p = static_cast<uint8_t*>(data);
  int count = 0;
  for (size_t got = 0; got < len;) {
    alignas(cmsghdr) char control[kControlSpace] = {};
    iovec iov{p + got, len - got};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) {
      CheckStop();
      continue;
    }
    if (n < 0) throw std::system_error(errno, std::generic_category(), "recvmsg");
    for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm != nullptr; cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const int arrived = static_cast<int>((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < arrived; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        if (count < kMaxPassedFds) {
          fds[count++] = fd;
        } else {
          close(fd);
        }
      }
    }
    if (mh.msg_flags & MSG_CTRUNC) throw std::runtime_error("recvmsg: descriptors truncated");
    if (n == 0) {
      if (got == 0 && count == 0) return -1;
      throw std::runtime_error("peer closed the connection in the middle of a message");
    }
    got += static_cast<size_t>(n);
  }
  return count;
}

}  // namespace slipperf
