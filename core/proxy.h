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
  std::atomic<uint32_t> reader_waiting;  // the receiver's ask (kAsk*): a token on publish
  std::atomic<uint32_t> writer_waiting;  // sender filled its proxy; drain it on consume
  std::atomic<uint32_t> tokens;          // tokens written to the receiver's proxy, not drained
  uint32_t pad;
};

// What a receiver asks of the publishes (WakeState::reader_waiting). kAskOnce: a token on
// the next one, which takes the ask (a sleeper needs one wake-up). kAskEvery: a token on
// each (an edge-triggered epoll watcher sees an edge at every arrival, as on TCP). A peer
// that knows only kAskOnce treats kAskEvery as it: one token.
constexpr uint32_t kAskNone = 0;
constexpr uint32_t kAskOnce = 1;
constexpr uint32_t kAskEvery = 2;

namespace proxy {

// The publisher's side, after its publish is visible (sequentially consistent): whether the
// receiver wants a token for it. Takes a one-shot ask.
inline bool TakeReaderAsk(WakeState* wake) noexcept {
  uint32_t ask = wake->reader_waiting.load(std::memory_order_relaxed);
  while (ask == kAskOnce) {
    if (wake->reader_waiting.compare_exchange_weak(ask, kAskNone)) return true;
  }
  return ask == kAskEvery;
}

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
