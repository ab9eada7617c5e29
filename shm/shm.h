// shm: the same-host transport. Rings live in a memfd region shared by the two processes;
// detection goes through a rendezvous that each listening Slipstream process publishes.
//
// Rendezvous: an abstract AF_UNIX datagram socket named from the listening port and
// address ("slipstream-v1:<port>:<addr>", addr "*" for a wildcard listener). Abstract
// names are per network namespace, so the namespace is part of the name for free.
// A client that finds the rendezvous registers its connection (4-tuple, nonce, and the
// region plus both proxy pairs as SCM_RIGHTS) BEFORE it sends its SYN; the server looks
// the registration up when it accepts, so its classification is race-free. A client to a
// plain server finds no rendezvous: one failed connect(2) on an AF_UNIX socket, no round
// trip, nothing added to the TCP stream.
//
// Thread safety: Rendezvous methods take the rendezvous' own lock; Offer is owned by one
// connecting thread.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/channel.h"
#include "core/wire.h"

namespace slip::shm {

// A client's half-built connection: the region and the proxies, before the server says yes.
struct Offer {
  Offer() = default;
  ~Offer();
  Offer(const Offer&) = delete;
  Offer& operator=(const Offer&) = delete;

  uint64_t nonce = 0;
  uint32_t ring_size = 0;
  size_t region_size = 0;
  void* region = nullptr;
  int memfd = -1;
  int client_a = -1, client_b = -1;  // the client's proxy pair
  int server_a = -1, server_b = -1;  // the server's proxy pair (sent to the server)
};

// Connects a datagram socket to the rendezvous for `dest` (exact address first, then the
// wildcard). Returns the socket, or -errno (-ECONNREFUSED/-ENOENT: no Slipstream listener).
int FindRendezvous(const sockaddr* dest) noexcept;

// Builds the region and proxies. Returns 0 or -errno.
int PrepareOffer(uint32_t ring_size, Offer* offer) noexcept;

// Sends REGISTER with the region and proxies over the rendezvous socket (non-blocking).
int SendRegister(int rendezvous, const Offer& offer, const wire::Endpoint& client,
                 const wire::Endpoint& server) noexcept;

// Whether a registered connection's CONFIRM comes, decided once, in the region's header
// (RegionHeader::claim), by whichever end moves it from kOpen first (compare and exchange):
//   kConfirmed  the client, just before it sends CONFIRM: the server must wait for it;
//   kWithdrawn  the client, when its TCP handshake was too slow: it stays plain;
//   kAbandoned  the server, when it stops waiting (SLIP_HANDSHAKE_TIMEOUT_MS): the client,
//               finding it so, stays plain and sends nothing of ours.
// Without it, a server that gave up and a client that confirmed a moment later left the
// CONFIRM in the stream of a connection the server's application reads as plain TCP.
enum class Claim : uint32_t { kOpen = 0, kConfirmed = 1, kWithdrawn = 2, kAbandoned = 3 };

// Client: claims the connection before sending CONFIRM. False when the server already
// gave up (the connection is plain on its side): send nothing of ours then.
bool ClaimConfirm(Offer* offer) noexcept;
// Client: withdraws (the TCP handshake took too long); the connection stays plain.
void ClaimWithdraw(Offer* offer) noexcept;

// The client's channel once connected; takes the region and client_b... out of `offer`.
// `*proxy_a`/`*proxy_b` receive the client's proxy pair.
std::unique_ptr<Channel> MakeClientChannel(Offer* offer, int* proxy_a, int* proxy_b) noexcept;

// One registration received by a listener.
struct Registration {
  Registration() = default;
  ~Registration();
  Registration(Registration&& o) noexcept;
  Registration& operator=(Registration&& o) noexcept;

  wire::Register msg;
  int fds[4] = {-1, -1, -1, -1};  // memfd, server A, server B, client B
  uint64_t received_ns = 0;
  void* header = nullptr;  // the region's first page, mapped once its claim is needed
};

// Server: the registration's claim as the client left it (maps the region's first page on
// first use). A region that cannot be mapped safely (no Slipstream client sends one, a
// forger might) reads as kOpen: the server waits for the connection's first bytes as for
// any registration, and gives it up at its deadline.
Claim ReadClaim(Registration* reg) noexcept;
// Server: stops waiting for the registration's CONFIRM unless the client already committed
// to it. Returns kAbandoned (now, or before), kWithdrawn, or kConfirmed: the CONFIRM is on
// its way, so the connection must not be handed over as plain TCP.
Claim Abandon(Registration* reg) noexcept;

// The listening side.
class Rendezvous {
 public:
  // Publishes the rendezvous for a listening socket bound to `local`. Returns nullptr
  // (and *error = -errno) when it cannot (e.g. the name is taken).
  static std::unique_ptr<Rendezvous> Publish(const sockaddr* local, bool v6only,
                                             int* error) noexcept;
  ~Rendezvous();

  int fd() const noexcept { return fd_; }

  // Takes the registrations for this connection out of the table (draining the socket
  // first). Returns how many were found; they go to *out.
  size_t Take(const wire::Endpoint& client, const wire::Endpoint& server,
              std::vector<Registration>* out) noexcept;
  // Reads whatever arrived (keeps the queue short between accepts).
  void Drain() noexcept;

 private:
  explicit Rendezvous(int fd) noexcept : fd_(fd) {}
  void DrainLocked() noexcept;
  void ExpireLocked(uint64_t now) noexcept;
  void DropLocked(Registration* reg) noexcept;
  void ReadOne(int conn, uint64_t now) noexcept;

  const int fd_;
  std::mutex mu_;
  std::vector<Registration> pending_;
  std::vector<int> pending_conns_;  // accepted, message not read yet
};

// Validates a registration's region and proxies against the client's CONFIRM and builds
// the server's channel. On success *proxy_a/*proxy_b are the server's proxy pair.
// Returns nullptr with *reason set when the registration is unusable.
std::unique_ptr<Channel> AcceptRegistration(Registration* reg, const wire::Confirm& confirm,
                                            int* proxy_a, int* proxy_b,
                                            wire::DeclineReason* reason) noexcept;

}  // namespace slip::shm
