// The queue through which the processes sharing one listener (forked workers: nginx,
// gunicorn, pre-fork servers) hand each other rendezvous connections.
//
// Every process that accepts on a shared listening socket reads registrations from the
// one rendezvous they all inherited; two accepting at once may each read the other's.
// One that reads a registration that is not for the connection it accepted passes the
// rendezvous connection on, its message unread (its descriptors stay in the kernel's
// queue), so that the sibling that accepted that connection reads it itself.
//
// Made before the first fork (so that every process inherits the same queue): an
// AF_UNIX socketpair whose one queue every sibling writes to and reads from, and a shared page that
// says whether a sibling is between reading a rendezvous connection and passing it on (an accept()
// that found nothing waits for that, and only for that: a plain client's connection is never
// delayed). Nothing outside the processes that forked from the listener's holder can reach either.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace slip::shm {

class SiblingQueue {
 public:
  // Null when it cannot be made (the listener then works as before: a registration read
  // by the wrong sibling costs its connection acceleration).
  static std::unique_ptr<SiblingQueue> Create() noexcept;
  ~SiblingQueue();
  SiblingQueue(const SiblingQueue&) = delete;
  SiblingQueue& operator=(const SiblingQueue&) = delete;

  // Who passed a connection on, and when it was first read.
  struct Passed {
    uint64_t first_read_ms = 0;
    uint32_t passer = 0;  // the passing process's pid
    uint64_t seq = 0;     // its passes, counted
  };
  // Passes `conn` (a rendezvous connection) to whichever sibling reads next; our
  // descriptor is closed either way. Returns the pass's seq, 0 when the queue is full (the
  // client then sees its rendezvous closed and stays plain).
  uint64_t Pass(int conn, uint64_t first_read_ms) noexcept;
  // The next connection passed on by a sibling or by this process, above the descriptor
  // floor, and *passed; -1 when none is queued.
  int Receive(Passed* passed) noexcept;
  // Whether `passed` was passed by this process at or after its pass `seq`.
  bool PassedHereSince(const Passed& passed, uint64_t seq) const noexcept;

  // Brackets the time a rendezvous connection is held by this process before it is read
  // or passed on.
  void BeginHold(uint64_t now_ms) noexcept;
  void EndHold() noexcept;
  // Whether a sibling may hold the registration we look for: one holds a connection it
  // took within the last few milliseconds. (A sibling that died holding one stops
  // counting after that.)
  bool SiblingHolds(uint64_t now_ms) const noexcept;

 private:
  struct Shared {  // in a MAP_SHARED page: every sibling's view
    std::atomic<uint32_t> holding;
    std::atomic<uint64_t> last_hold_ms;
  };
  SiblingQueue() noexcept = default;

  int ends_[2] = {-1, -1};  // [0] written, [1] read: one queue
  Shared* shared_ = nullptr;
  uint32_t holding_here_ = 0;  // this process's share of shared_->holding
  uint64_t passes_ = 0;        // this process's (a fork child goes on from its parent's count)
};

}  // namespace slip::shm
