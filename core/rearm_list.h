// RearmList: the streams whose readiness proxies must be armed again before a thread of
// the process sleeps in epoll_wait, poll or select.
//
// A stream's proxy shows its ring's bytes to the kernel only while the stream is armed: a
// token is queued on the proxy, or its ring is empty and its reader asked for a token on
// the next publish (WakeState::reader_waiting; an ask shows no bytes that came before it).
// A publish turns the ask into a token, and only the stream's own reader takes tokens away
// (a receive that empties the ring). So a stream can stop being armed only in its own
// receive path, and that path lists it here (Stream::Recv). Before a
// wait that may sleep, the face arms the listed streams and nothing else: the cost of a
// wait is the number of streams read since the last one, not the number of connections.
//
// Some streams are armed before every wait: those that several processes hold (after
// fork), since another process's receive may take their tokens without listing them here,
// and those whose transport takes in arrivals only for a pending ask (verbs: a token the
// application has not read yet would hide the end of the stream behind it).
//
// Thread safety: every call from any thread. The list is guarded by one mutex, which the
// data path takes only when a receive leaves its stream unarmed (once per wake-up). The
// list is intrusive (links in Stream): nothing allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/fork_safe_mutex.h"

namespace slip {

class Stream;

class RearmList {
 public:
  RearmList() = default;
  ~RearmList() = default;
  RearmList(const RearmList&) = delete;
  RearmList& operator=(const RearmList&) = delete;

  // `s` joins (listed at once: nothing is known of its arming) or leaves. A stream leaves
  // before it is destroyed (Stream's destructor does it); Leave waits for a preparation
  // that is arming it right now.
  void Join(Stream* s) noexcept;
  void Leave(Stream* s) noexcept;

  // `s` may no longer be armed: it is prepared before the next sleep. Ignored for a
  // stream that is not a member (it left meanwhile).
  void MarkChanged(Stream* s) noexcept;

  // `s` is armed before every wait from now on (held by several processes after fork), for
  // as long as it is a member.
  void ArmAlways(Stream* s) noexcept;

  // Arms every listed stream (and the shared ones) for a sleep; returns how many.
  size_t PrepareChanged() noexcept;

  // Streams armed by the last PrepareChanged that have bytes to read now (at most one is
  // reported, and its token written so that the kernel shows it): true if one has. For a
  // short spin before a sleep: those are the connections that were just busy.
  bool AnyRecentReadable() noexcept;

  size_t members() const noexcept;

  // fork(): the lock is held across fork so that the child never inherits it held.
  ForkSafeMutex& fork_mutex() noexcept { return mu_; }

 private:
  // (Stream::rearm_ is written under mu_ only.)
  bool IsMemberLocked(const Stream* s) const noexcept;
  void LinkLocked(Stream* s) noexcept;
  void UnlinkLocked(Stream* s) noexcept;

  // Streams recently armed, for AnyRecentReadable: a spin looks at no more than these.
  static constexpr size_t kRecent = 16;

  mutable ForkSafeMutex mu_;
  Stream* head_ = nullptr;  // listed streams, those armed always for good (Stream::rearm_*)
  size_t members_ = 0;
  Stream* recent_[kRecent] = {};
  size_t recent_count_ = 0;
};

}  // namespace slip
