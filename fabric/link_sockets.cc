#include "fabric/link_sockets.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/sys.h"

namespace slip::fabric {

LinkSockets::~LinkSockets() {
  const size_t n = count_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) sys::close(entries_[i].copy);
}

void LinkSockets::Accepted(int fd, size_t expected, uint64_t now_ms) noexcept {
  // (The provider's own read of the connection request must never wait: a header that
  // promises data which never comes would hold the thread that reads it.)
  const int flags = sys::fcntl(fd, F_GETFL);
  if (flags >= 0) sys::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  Entry e;
  e.peer_len = sizeof(e.peer);
  e.copy = sys::DupAbove(fd, floor_);
  if (e.copy < 0 || sys::getpeername(fd, reinterpret_cast<sockaddr*>(&e.peer), &e.peer_len) != 0) {
    // Nothing to keep it by: refused now (the provider sees its end at once).
    if (e.copy >= 0) sys::close(e.copy);
    sys::shutdown(fd, SHUT_RDWR);
    return;
  }
  e.accepted_ms = now_ms;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t room = std::min(kMax, expected + kSlack);
  size_t evicted = 0;
  while (count_.load(std::memory_order_relaxed) >= room) {
    DropLocked(0);  // the oldest: a client's request follows its connection within ms
    ++evicted;
  }
  if (evicted > 0)
    SLIP_LOG(kDebug,
             "fabric: %zu connections to the connection listener sent no request while %zu "
             "waited; the oldest shut down",
             evicted, room);
  const size_t n = count_.load(std::memory_order_relaxed);
  entries_[n] = e;
  count_.store(n + 1, std::memory_order_relaxed);
}

void LinkSockets::Requested(const sockaddr* peer, socklen_t len) noexcept {
  if (!peer || count_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = count_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    const Entry& e = entries_[i];
    if (e.peer_len != len || std::memcmp(&e.peer, peer, len) != 0) continue;
    sys::close(e.copy);
    std::move(entries_ + i + 1, entries_ + n, entries_ + i);
    count_.store(n - 1, std::memory_order_relaxed);
    return;
  }
}

void LinkSockets::Expire(uint64_t now_ms) noexcept {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  size_t expired = 0;
  while (count_.load(std::memory_order_relaxed) > 0 &&
         now_ms >= entries_[0].accepted_ms + kRequestMs) {  // (now_ms may be older)
    DropLocked(0);
    ++expired;
  }
  if (expired > 0)
    SLIP_LOG(
        kDebug,
        "fabric: %zu connections to the connection listener sent no request in %llu ms; shut down",
        expired, (unsigned long long)kRequestMs);
}

void LinkSockets::DropLocked(size_t i) noexcept {
  const size_t n = count_.load(std::memory_order_relaxed);
  // Shut down, not closed: the provider holds the socket by a number of its own, and sees
  // its end in the listener's event queue (it closes it then).
  sys::shutdown(entries_[i].copy, SHUT_RDWR);
  sys::close(entries_[i].copy);
  std::move(entries_ + i + 1, entries_ + n, entries_ + i);
  count_.store(n - 1, std::memory_order_relaxed);
}

}  // namespace slip::fabric
