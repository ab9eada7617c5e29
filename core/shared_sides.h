// SharedSides: a stream's cursors and per-side locks, in memory that the processes holding
// the stream after fork share (docs/DESIGN.md, "fork").
//
// Each process that holds an inherited connection has its own copy of the Stream: its own
// cursors and its own locks. Before fork the stream moves those into a MAP_SHARED anonymous
// page (the child inherits the mapping, not a copy), so that two processes sending on one
// connection (a pre-forked server whose parent and child both write, a logger child) each
// take the side's lock and continue from the other's cursor: the bytes of both arrive in
// some order of whole calls, as on TCP. The same holds for two receivers.
//
// The locks are robust: a process that dies holding one (killed mid-send) leaves it to the
// next taker, which continues from the cursor last published (the dead call's unpublished
// bytes are not sent, as a write cut short by death). The page is never shared with the
// peer: only the processes of this end can touch it.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

namespace slip {

class SharedSides {
 public:
  enum class Side { kTx, kRx };

  // A fresh page holding these cursors; nullptr when it cannot be mapped.
  static SharedSides* Create(uint64_t produced, uint64_t consumed) noexcept;
  // Unmaps this process's mapping (the others keep theirs).
  static void Destroy(SharedSides* sides) noexcept;

  // Takes (or gives back) the side's lock. False when it cannot be taken (its state is
  // unrecoverable: a holder died and a later taker gave up on it).
  bool Lock(Side side) noexcept;
  void Unlock(Side side) noexcept;

  std::atomic<uint64_t> produced{0};  // written under the tx lock
  std::atomic<uint64_t> consumed{0};  // written under the rx lock

 private:
  SharedSides() = default;
  pthread_mutex_t* MutexOf(Side side) noexcept { return side == Side::kTx ? &tx_ : &rx_; }
  pthread_mutex_t tx_;
  pthread_mutex_t rx_;
};

// Holds a side's lock for a scope, when there is a shared page (nothing otherwise).
class SideLock {
 public:
  SideLock(SharedSides* sides, SharedSides::Side side) noexcept
      : sides_(sides), side_(side), held_(sides && sides->Lock(side)) {}
  ~SideLock() {
    if (held_) sides_->Unlock(side_);
  }
  SideLock(const SideLock&) = delete;
  SideLock& operator=(const SideLock&) = delete;
  // Whether the caller may go on (no page, or its lock is held).
  bool ok() const noexcept { return !sides_ || held_; }

 private:
  SharedSides* const sides_;
  const SharedSides::Side side_;
  const bool held_;
};

}  // namespace slip
