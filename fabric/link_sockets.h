// The connection listener's sockets before they ask for an endpoint (connected endpoints
// over libfabric's tcp provider, fabric/stream_link.h).
//
// The provider accepts every TCP connection to the listener's port and keeps it, with no
// deadline, until its connection request arrives (tcpx_accept, then the request read in
// the listener's event queue): anybody who reaches the port holds one of our sockets per
// connection for as long as it likes (1100 silent connections took every descriptor of a
// server at RLIMIT_NOFILE 1024). And the provider reads the request from a blocking socket,
// so that one which sends a header promising data it never sends would hold the progress
// thread in recv() for good. The face hands each socket the provider accepts on our
// listener here (StreamModule::ProviderAccepted): it is made non-blocking, and kept only
// while as many wait as our pending requests expect endpoints (plus a little slack for
// clients whose requests are in flight), each for kRequestMs. One that outlives its
// deadline, or the oldest when a newcomer finds them all taken, is shut down (through a
// copy of our own: the provider owns its number, which may be another descriptor by the
// time we look again), and the provider, reading its end, closes it.
//
// Thread safety: any thread (a mutex of its own; never held across a call into libfabric).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace slip::fabric {

class LinkSockets {
 public:
  static constexpr size_t kMax = 256;
  static constexpr size_t kSlack = 16;
  static constexpr uint64_t kRequestMs = 2000;

  LinkSockets() noexcept = default;
  ~LinkSockets();  // (closes our copies; shuts nothing down: a fork child's are its parent's)
  LinkSockets(const LinkSockets&) = delete;
  LinkSockets& operator=(const LinkSockets&) = delete;

  // The provider accepted `fd` on the connection listener, while `expected` requests of
  // ours wait for an endpoint.
  void Accepted(int fd, size_t expected, uint64_t now_ms) noexcept;
  // A connection request came from `peer`: its socket is an endpoint's now (or rejected).
  void Requested(const sockaddr* peer, socklen_t len) noexcept;
  // Shuts down the sockets past their deadline.
  void Expire(uint64_t now_ms) noexcept;
  size_t waiting() const noexcept { return count_.load(std::memory_order_relaxed); }
  // Where our copies go (before the first Accepted).
  void set_floor(int hidden_fd_floor) noexcept { floor_ = hidden_fd_floor; }

 private:
  struct Entry {
    int copy = -1;  // ours, above the floor
    sockaddr_storage peer{};
    socklen_t peer_len = 0;
    uint64_t accepted_ms = 0;
  };
  // Under mu_: shuts entries_[i] down and takes it out.
  void DropLocked(size_t i) noexcept;

  int floor_ = 0;
  std::mutex mu_;
  Entry entries_[kMax];
  std::atomic<size_t> count_{0};  // entries_[0, count_) are in use (under mu_ to change)
};

}  // namespace slip::fabric
