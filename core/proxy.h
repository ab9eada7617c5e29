// The readiness proxy: a kernel socketpair whose readiness mirrors an accelerated stream.
//
// The application's descriptor refers to end A; Slipstream (and the peer process, which
// holds a duplicate of B) control both readiness bits of A:
//  - A is readable while token bytes written on B are queued to it. A token is written
//    when a reader that announced it is about to sleep (WakeState::reader_waiting) is
//    owed a wake-up, and at EOF or error.
//  - A is writable while B's receive queue has room. When the send ring is full the
//    sender fills that queue from A (A's SO_SNDBUF is tiny), and whoever frees ring space
//    while the sender is waiting drains B, which makes A writable again: a real EPOLLOUT
//    edge.
// Sleeping therefore happens in the kernel with kernel semantics (epoll, poll, select,
// blocking calls, SO_RCVTIMEO, signals), while messages flow without any proxy traffic as
// long as nobody sleeps.
//
// Thread safety: all members are safe from any thread and any process holding the fds.
#pragma once

#include <atomic>
#include <cstdint>

namespace slip {

// Wake-up bookkeeping of one direction, shared by its sender and its receiver.
// Lives in memory both can reach (the shared region for shm).
struct WakeState {
  std::atomic<uint32_t> reader_waiting;  // receiver wants a token on the next publish
  std::atomic<uint32_t> writer_waiting;  // sender filled its proxy; drain it on consume
  std::atomic<uint32_t> tokens;          // tokens written to the receiver's proxy, not drained
  uint32_t pad;
};

namespace proxy {

// Creates a proxy pair: sv[0] is A (given to the application), sv[1] is B.
// Both close-on-exec; A gets the smallest send buffer so that it fills in a few writes.
int CreatePair(int sv[2]) noexcept;

// Writes one token on B (the receiver's proxy) and counts it in `wake->tokens`.
void WriteToken(WakeState* wake, int b_fd) noexcept;

// Drains queued tokens from A without blocking, when the count says there are some.
void DrainTokens(WakeState* wake, int a_fd) noexcept;
// Drains whatever is queued on A, counted or not (a stray byte of the peer's): for a
// receive that found nothing, where A must not stay readable for nothing.
void DrainAllTokens(WakeState* wake, int a_fd) noexcept;

// Fills B's receive queue from A until A is not writable.
void Fill(int a_fd) noexcept;

// Drains fill bytes from B so that A becomes writable.
void Unfill(int b_fd) noexcept;

}  // namespace proxy
}  // namespace slip
