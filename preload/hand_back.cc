// Handing a connection back to TCP (hand_back.h).
//
// A socket option that only the kernel's TCP can honour changes what happens to the bytes
// themselves: MSG_ZEROCOPY sends queue a completion for each call on the socket's error
// queue (a program waits for them before it reuses its buffers), and kernel TLS encrypts
// what the program writes and decrypts what it reads. Over a ring the bytes pass by the
// kernel: completions would never come, and TLS records would travel as the program's
// plaintext while the peer waits for ciphertext. So the connection goes back to its TCP
// socket, at the byte the program read up to, as for exec: for TCP_ULP before the kernel
// takes the option, for SO_ZEROCOPY (which alone changes nothing) at the first
// MSG_ZEROCOPY send.
#include "preload/hand_back.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <vector>

#include "core/log.h"
#include "core/sys.h"
#include "preload/accel_list.h"
#include "preload/control.h"
#include "preload/fd_table.h"
#include "preload/runtime.h"

namespace slip::preload {

namespace {

struct Numbers {
  const SlipSocket* s;
  std::vector<ProgramNumber> list;
};

void CollectNumbers(int fd, SlipSocket* s, void* ctx) noexcept {
  auto* numbers = static_cast<Numbers*>(ctx);
  if (s != numbers->s) return;
  const int flags = sys::fcntl(fd, F_GETFD);
  if (flags < 0) return;
  try {
    numbers->list.push_back({fd, (flags & FD_CLOEXEC) != 0});
  } catch (...) {
  }
}

// Said once at the default level (the program asked for acceleration and does not get it
// for these connections), then at info.
LogLevel FirstTimeWarn() noexcept {
  static std::atomic<bool> said{false};
  return said.exchange(true, std::memory_order_relaxed) ? LogLevel::kInfo : LogLevel::kWarn;
}

}  // namespace

bool HandBackToTcp(SlipSocket* s, const ProgramNumber* numbers, size_t count, Reason why) noexcept {
  ControlUnwatch(s);
  ControlQuiesce();  // the anchor's bytes (the peer's answer) are ours alone now
  if (!s->stream->HandBack(int(GetRuntime().config.handshake_timeout_ms))) return false;
  // The hidden TCP socket must not outlive the program's own descriptors across an exec.
  sys::fcntl(s->anchor_fd, F_SETFD, FD_CLOEXEC);
  AccelListRemove(s);
  for (size_t i = 0; i < count; ++i) {
    const int fd = numbers[i].fd;
    // The program's epoll sets watched the proxy at that number; they watch the TCP
    // socket from now on. (The stream keeps the proxy's file open, so its registrations
    // would outlive the number, and report its EOF, unless taken out first.)
    for (SlipSocket::EpollReg& reg : s->epoll_regs) {
      if (reg.fd == fd) sys::epoll_ctl(reg.epfd, EPOLL_CTL_DEL, fd, nullptr);
    }
    sys::dup3(s->anchor_fd, fd, numbers[i].cloexec ? O_CLOEXEC : 0);
    for (SlipSocket::EpollReg& reg : s->epoll_regs) {
      if (reg.fd == fd) sys::epoll_ctl(reg.epfd, EPOLL_CTL_ADD, fd, &reg.event);
    }
  }
  sys::fcntl(s->anchor_fd, F_SETFL, s->nonblocking.load() ? O_NONBLOCK : 0);
  s->stream->WakeAfterHandBack();
  // The stream stays allocated (a thread may still be inside it) until the last close,
  // which also closes the hidden anchor (the kernel's FIN then follows the last number's).
  s->kind = SockKind::kPlain;
  StatsSetTransport(s->stats, TransportKind::kTcp, why);
  return true;
}

bool KernelOnlyOption(int level, int name, const void* val, unsigned len) noexcept {
  if (level == SOL_SOCKET && name == SO_ZEROCOPY)
    return val && len >= sizeof(int) && *static_cast<const int*>(val) != 0;
  return level == IPPROTO_TCP && name == TCP_ULP;
}

int PrepareForKernelOption(SlipSocket* s, int fd, bool lazily) noexcept {
  // SO_ZEROCOPY by itself changes nothing (gRPC sets it on every socket and sends without
  // MSG_ZEROCOPY): the connection goes back at its first MSG_ZEROCOPY send.
  if (lazily) {
    s->kernel_only.store(true, std::memory_order_relaxed);
    return 0;
  }
  if (s->kind != SockKind::kAccel) return 0;  // (TCP_ULP: the kernel's answer, as plain)
  // Only a settled connection can be handed back (one set up just now may not be yet).
  // (Not under `mu`: settling takes it.)
  ControlWaitSettled(2 * uint64_t(GetRuntime().config.handshake_timeout_ms) + 1000);
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->kind != SockKind::kAccel || !s->stream) return 0;  // (another thread did it)
  if (s->stream->control()->SharedWithOtherProcess()) {
    SLIP_LOG(kWarn,
             "fd %d: a socket option only the kernel's TCP serves (zerocopy, kernel TLS) on a "
             "connection another process also holds: refused (EOPNOTSUPP)",
             fd);
    errno = EOPNOTSUPP;
    return -1;
  }
  Numbers numbers{s, {}};
  ForEachTrackedFd(CollectNumbers, &numbers);
  if (HandBackToTcp(s, numbers.list.data(), numbers.list.size(), Reason::kKernelFeature)) {
    SLIP_LOG_AT(FirstTimeWarn(),
                "fd %d: a socket option only the kernel's TCP serves (zerocopy, kernel TLS): "
                "the connection continues on TCP (reason kernel_feature)",
                fd);
    return 0;
  }
  SLIP_LOG(kWarn,
           "fd %d: cannot hand the connection back to TCP for a socket option only the "
           "kernel's TCP serves; it is reset",
           fd);
  ResetConnection(s, numbers.list.data(), numbers.list.size());
  errno = EOPNOTSUPP;
  return -1;
}

int MakeResetSocket() noexcept {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  char byte = 0;
  sys::send(sv[0], &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  sys::close(sv[1]);
  return sv[0];
}

void ResetConnection(SlipSocket* s, const ProgramNumber* numbers, size_t count) noexcept {
  // Bytes may be missing: the peer must see a reset, not an orderly end.
  s->stream->control()->Abort();
  linger abortive{1, 0};
  sys::setsockopt(s->anchor_fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive));
  const int reset = MakeResetSocket();
  for (size_t i = 0; i < count; ++i) {
    if (reset >= 0) sys::dup3(reset, numbers[i].fd, numbers[i].cloexec ? O_CLOEXEC : 0);
    Remove(numbers[i].fd);
  }
  if (reset >= 0) sys::close(reset);
}

}  // namespace slip::preload
