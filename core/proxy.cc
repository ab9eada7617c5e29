#include "core/proxy.h"

#include <atomic>
#include <cerrno>

#include "core/sys.h"

namespace slip::proxy {

int CreatePair(int sv[2]) noexcept {
  if (sys::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -errno;
  int one = 1;  // the kernel raises this to its minimum
  sys::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &one, sizeof(one));
  return 0;
}

void WriteToken(WakeState* wake, int b_fd) noexcept {
  wake->tokens.fetch_add(1, std::memory_order_relaxed);
  char token = 't';
  if (sys::send(b_fd, &token, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1) {
    // B's queue is full of earlier tokens (A is readable anyway) or the pair is gone.
    wake->tokens.fetch_sub(1, std::memory_order_relaxed);
  }
}

void DrainTokens(WakeState* wake, int a_fd) noexcept {
  // Only when the count says some are queued: this runs after every receive that empties
  // the ring, where a system call for nothing would cost more than the message.
  if (wake->tokens.load(std::memory_order_relaxed) != 0) DrainAllTokens(wake, a_fd);
}

void DrainAllTokens(WakeState* wake, int a_fd) noexcept {
  // Everything queued on A, not just what the count says: the count may live where the
  // peer writes (shm), and a byte nobody counted would leave A readable with nothing to
  // read, so that a level-triggered poller would spin. The count goes down by what was
  // taken, never below zero (a token written meanwhile keeps its count).
  char buf[256];
  for (;;) {
    const ssize_t n = sys::recv(a_fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) return;
    uint32_t tokens = wake->tokens.load(std::memory_order_relaxed);
    uint32_t left;
    do {
      left = tokens > uint32_t(n) ? tokens - uint32_t(n) : 0;
    } while (!wake->tokens.compare_exchange_weak(tokens, left, std::memory_order_relaxed));
    // Ordered before the receiver's next look at its ring (Stream::Armed): an arming that
    // saw bytes and a token, and so wrote none, saw it before this took it; then the
    // receiver sees those bytes too.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (n < ssize_t(sizeof(buf))) return;
  }
}

void Fill(int a_fd) noexcept {
  // One send takes what A's minimal send buffer allows and stops short when it is full
  // (A is writable again only below a quarter of it): one system call, not one per byte.
  static const char kFill[8192] = {};
  for (int i = 0; i < 8; ++i) {
    if (sys::send(a_fd, kFill, sizeof(kFill), MSG_DONTWAIT | MSG_NOSIGNAL) !=
        ssize_t(sizeof(kFill)))
      return;
  }
}

void Unfill(int b_fd) noexcept {
  char buf[8192];
  while (sys::recv(b_fd, buf, sizeof(buf), MSG_DONTWAIT) == ssize_t(sizeof(buf))) {
  }
}

}  // namespace slip::proxy
