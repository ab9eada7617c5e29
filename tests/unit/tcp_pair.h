// What the tests of the anchor's stream share: a connected loopback TCP pair, seeded random
// bytes, and a short wait for readiness.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <vector>

namespace slip::testing {

inline void NonBlocking(int fd) {
  ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

// A TCP listener on a loopback port the kernel picks: *listener, and its address in *addr.
inline void LoopbackListener(int* listener, sockaddr_in* addr, int backlog = 1) {
  *listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(*listener, 0);
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(*addr);
  ASSERT_EQ(bind(*listener, reinterpret_cast<sockaddr*>(addr), sizeof(*addr)), 0);
  ASSERT_EQ(listen(*listener, backlog), 0);
  ASSERT_EQ(getsockname(*listener, reinterpret_cast<sockaddr*>(addr), &len), 0);
}

// A connected TCP pair on loopback (a reset needs TCP), both non-blocking.
inline void TcpPair(int fds[2]) {
  int listener = -1;
  sockaddr_in addr;
  ASSERT_NO_FATAL_FAILURE(LoopbackListener(&listener, &addr));
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(fds[0], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  fds[1] = accept(listener, nullptr, nullptr);
  ASSERT_GE(fds[1], 0);
  close(listener);
  NonBlocking(fds[0]);
  NonBlocking(fds[1]);
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = uint8_t(rng());
  return out;
}

inline void WaitFor(int fd, short events) {
  pollfd pfd{fd, events, 0};
  poll(&pfd, 1, 10);
}

}  // namespace slip::testing
